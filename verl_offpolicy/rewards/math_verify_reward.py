"""Math answer reward with math-verify, for ``reward.custom_reward_function.path`` (Guru-Math recipe).

Only the response's final ``\\boxed{...}`` answer is scored (1.0 if math-verify finds it equivalent
to ``ground_truth``, else 0.0; no boxed answer, or an empty one, scores 0.0). math-verify on the
whole response would also evaluate expressions outside the box (``2 + 7 is \\boxed{}.`` scored 1
for a ground truth of 9).

Thread-safe: verl's reward loop calls ``compute_score`` from a thread pool
(``verl/experimental/reward_loop/reward_manager/naive.py``), where math-verify's timeouts
(``signal.alarm``) raise. The comparison therefore runs in one long-lived scoring process per
reward process (this file run as a script, started on first use; it reads its requests from a pipe
and exits when the pipe closes), on that process's main thread, where math-verify's own timeouts
work. Every step of scoring an answer (sending the response, finding its last box, parsing, comparing,
reading the verdict) runs under one deadline per request (``timeout_seconds``, default
:data:`TIMEOUT_SECONDS`, settable through ``reward.custom_reward_function.reward_kwargs``), which
covers what math-verify's timeouts cannot interrupt (one long C call, e.g. the integer power of
``9^{9^{9^{9}}}``): at the deadline the scoring process is killed, the answer scores 0.0 (with a
warning), and the next request starts a new process. A scoring process that dies during an answer
(e.g. killed by the OOM killer) is handled the same way: that answer scores 0.0 with a warning.
Finding the last box is one linear scan (:func:`last_boxed`), so no response is slow to extract.

Calls ``math_verify.parse``/``verify`` directly: verl's ``reward_score.math_verify`` wrapper uses a
spawn process pool that silently returns 0.0 when imported without a ``__main__`` guard.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
import time
from typing import Optional

logger = logging.getLogger(__name__)

TIMEOUT_SECONDS = 30.0  # per answer, beyond math-verify's own 5 s timeouts for parsing and comparing
TIMEOUT_KEY = "reward.custom_reward_function.reward_kwargs.timeout_seconds"
MODULE_PATH = "pkg://verl_offpolicy.rewards.math_verify_reward"


def check_timeout_seconds(value) -> None:
    """``timeout_seconds`` must be a finite number > 0 (NaN failed inside verl's reward loop; 0 scored every answer 0)
    and at most ``threading.TIMEOUT_MAX``, the longest wait the platform's timers hold (the scorer's ``select``
    raised OverflowError on every answer above it)."""
    import math

    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= threading.TIMEOUT_MAX
    ):
        raise ValueError(
            f"{TIMEOUT_KEY} must be a finite number of seconds > 0 (default {TIMEOUT_SECONDS:g}), got {value!r}; "
            "at most "
            f"{threading.TIMEOUT_MAX:.0f} (the longest wait this platform's timers hold)"
        )


def check_reward_kwargs(view) -> None:
    """Startup rule: the math-verify reward's ``timeout_seconds``, when the config selects this reward."""
    path = view.select("reward.custom_reward_function.path")
    if path in (MODULE_PATH, __file__) or (isinstance(path, str) and path.endswith("rewards/math_verify_reward.py")):
        value = view.select(TIMEOUT_KEY, TIMEOUT_SECONDS)
        check_timeout_seconds(value)


RULES = (check_reward_kwargs,)
STARTUP_TIMEOUT_SECONDS = 300.0  # the scoring process imports math-verify and sympy (slow on a busy machine)
_BOXED = re.compile(r"\\boxed\s*\{")
_BRACE = re.compile(r"(?<!\\)[{}]")  # an escaped brace is LaTeX text, not a delimiter
_READY = "ready"


def last_boxed(text: str) -> Optional[str]:
    """The content of the last ``\\boxed{...}`` of ``text`` whose braces close (nested braces kept), or None.

    A box whose braces do not close is skipped for the box before it (``\\boxed{3} \\boxed{4`` gives
    ``3``). One linear scan: every opening brace is paired with its closing brace by a stack
    (:func:`_closing_braces`), then the boxes are tried from the last one.
    """
    opens = [match.end() - 1 for match in _BOXED.finditer(text)]  # position of each box's "{"
    if not opens:
        return None
    closing = _closing_braces(text, opens[0], set(opens))
    for brace in reversed(opens):
        if brace in closing:
            return text[brace + 1 : closing[brace]]
    return None


def _closing_braces(text: str, start: int, wanted: set[int]) -> dict[int, int]:
    """{position of a "{" in ``wanted``: position of the "}" closing it}, braces paired from ``start`` on.

    The "}" closing the "{" at p is the first one after p at which the braces since p balance; a stack of
    the open braces pairs every "{" with that "}" in one pass (a "}" with nothing open is skipped).
    """
    stack: list[int] = []
    closing: dict[int, int] = {}
    for match in _BRACE.finditer(text, start):
        if match.group() == "{":
            stack.append(match.start())
        elif stack:
            brace = stack.pop()
            if brace in wanted:
                closing[brace] = match.start()
    return closing


def boxed_answer(response: str) -> Optional[str]:
    """The answer to score: the last closed box's content, or None if there is none or it is blank."""
    answer = last_boxed(response)
    return answer if answer is not None and answer.strip() else None


def equivalent(answer: str, ground_truth: str) -> bool:
    """math-verify: is the answer (a boxed expression's content) equivalent to the ground truth?

    Uses math-verify's signal-based timeouts: call it on a main thread (the scoring process does).
    """
    from math_verify import parse, verify

    gold = parse(f"\\boxed{{{ground_truth}}}")
    parsed = parse(f"\\boxed{{{answer}}}")
    return bool(gold and parsed and verify(gold, parsed))


class ScoreTimeout(RuntimeError):
    """The scoring process did not answer in time (it was killed)."""


class ScorerDied(RuntimeError):
    """The scoring process died while it held an answer (e.g. killed by the OOM killer)."""


class _ScoringProcess:
    """The scoring process of this reward process: one request at a time, a deadline for each."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: Optional[subprocess.Popen] = None

    def _start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            close_fds=True,
        )
        os.set_blocking(self.proc.stdin.fileno(), False)  # a write never waits past the deadline
        try:
            ready = self._read_line(time.monotonic() + STARTUP_TIMEOUT_SECONDS)
        except ScorerDied as died:
            raise RuntimeError(f"math_verify_reward: the scoring process did not start: {died}") from None
        if ready != _READY:
            self.stop()
            raise RuntimeError(
                f"math_verify_reward: the scoring process did not start within {STARTUP_TIMEOUT_SECONDS:.0f}s"
            )

    def _died(self) -> ScorerDied:
        """The scoring process has gone: reap it (the next request starts a new one) and say how it ended."""
        assert self.proc is not None
        code = self.proc.wait()
        self.proc = None
        return ScorerDied(f"the scoring process exited with status {code} (its error, if any, is above)")

    def _write(self, data: bytes, deadline: float) -> bool:
        """Send ``data`` to the scoring process; False at the deadline. Raises ScorerDied if it has gone."""
        assert self.proc is not None and self.proc.stdin is not None
        fd = self.proc.stdin.fileno()
        view = memoryview(data)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([], [fd], [], remaining)[1]:
                return False
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:  # the pipe filled up since select: wait again
                continue
            except BrokenPipeError:
                raise self._died() from None
        return True

    def _read_line(self, deadline: float) -> Optional[str]:
        """One line from the scoring process, or None at the deadline. Raises ScorerDied if it has gone."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        data = b""
        while not data.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise self._died()
            data += chunk
        return data.decode().strip()

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def score(self, response: str, ground_truth: str, timeout: float) -> bool:
        """Is the last box of ``response`` equivalent to ``ground_truth``? Every step within ``timeout`` seconds.

        Raises ScoreTimeout (the process was killed at the deadline) or ScorerDied (it died meanwhile).
        """
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            deadline = time.monotonic() + timeout
            request = (json.dumps({"response": response, "ground_truth": ground_truth}) + "\n").encode()
            line = self._read_line(deadline) if self._write(request, deadline) else None
            if line is None:
                self.stop()
                raise ScoreTimeout(f"no answer within {timeout:.0f}s")
            return bool(json.loads(line)["equal"])


_SCORER = _ScoringProcess()
atexit.register(_SCORER.stop)


def compute_score(
    data_source, solution_str, ground_truth, extra_info=None, timeout_seconds: float = TIMEOUT_SECONDS
) -> float:
    """1.0 if the response's last ``\\boxed{...}`` is mathematically equivalent to ``ground_truth``, else 0.0.

    0.0 with a warning if the scoring process does not answer within ``timeout_seconds`` or dies meanwhile.
    """
    check_timeout_seconds(timeout_seconds)  # also a startup rule (RULES); this guards a direct call
    try:
        return 1.0 if _SCORER.score(str(solution_str), str(ground_truth), timeout_seconds) else 0.0
    except ScoreTimeout:
        logger.warning(
            "math_verify_reward: scoring a response (%d characters, ground truth %r) took over %.0f s; scored 0",
            len(str(solution_str)),
            ground_truth,
            timeout_seconds,
        )
    except ScorerDied as died:
        logger.warning(
            "math_verify_reward: %s while scoring a response (%d characters, ground truth %r); scored 0, "
            "the next answer starts a new scoring process",
            died,
            len(str(solution_str)),
            ground_truth,
        )
    return 0.0


def _verdict(request: dict) -> bool:
    """The scoring process's verdict on one request: its response's boxed answer equals the ground truth."""
    answer = boxed_answer(request["response"])
    if answer is None:
        return False
    try:
        return equivalent(answer, request["ground_truth"])
    except Exception:  # noqa: BLE001 - an unparsable answer is a wrong answer
        return False


def _serve() -> None:
    """The scoring process: one JSON request per line on stdin, one ``{"equal": bool}`` line back."""
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # anything math-verify prints must not corrupt the replies
    import math_verify  # noqa: F401 - imported before "ready": the first request's deadline excludes it

    out.write(f"{_READY}\n".encode())
    out.flush()
    for line in sys.stdin.buffer:
        out.write((json.dumps({"equal": _verdict(json.loads(line))}) + "\n").encode())
        out.flush()


if __name__ == "__main__":
    _serve()
