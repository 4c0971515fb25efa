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
work. Around each request a deadline (``timeout_seconds``, default :data:`TIMEOUT_SECONDS`,
settable through ``reward.custom_reward_function.reward_kwargs``) covers what those timeouts cannot
interrupt (one long C call, e.g. the integer power of ``9^{9^{9^{9}}}``): the scoring process is
killed, the answer scores 0.0, and the next request starts a new one.

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
STARTUP_TIMEOUT_SECONDS = 300.0  # the scoring process imports math-verify and sympy (slow on a busy machine)
_BOXED = re.compile(r"\\boxed\s*\{")
_READY = "ready"


def last_boxed(text: str) -> Optional[str]:
    """The content of the last ``\\boxed{...}`` of ``text`` (nested braces kept), or None if there is none
    or its braces do not close."""
    for match in reversed(list(_BOXED.finditer(text))):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i]
    return None


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
        if self._read_line(STARTUP_TIMEOUT_SECONDS) != _READY:
            self.stop()
            raise RuntimeError(f"math_verify_reward: the scoring process did not start within {STARTUP_TIMEOUT_SECONDS:.0f}s")

    def _read_line(self, timeout: float) -> Optional[str]:
        """One line from the scoring process, or None at the deadline."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        data = b""
        while not data.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                code = self.proc.wait()
                self.proc = None
                raise RuntimeError(f"math_verify_reward: the scoring process exited with status {code} (its error is above)")
            data += chunk
        return data.decode().strip()

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def equivalent(self, answer: str, ground_truth: str, timeout: float) -> bool:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self._start()
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write((json.dumps({"answer": answer, "ground_truth": ground_truth}) + "\n").encode())
            line = self._read_line(timeout)
            if line is None:
                self.stop()
                raise ScoreTimeout(f"no answer within {timeout:.0f}s")
            return bool(json.loads(line)["equal"])


_SCORER = _ScoringProcess()
atexit.register(_SCORER.stop)


def compute_score(data_source, solution_str, ground_truth, extra_info=None, timeout_seconds: float = TIMEOUT_SECONDS) -> float:
    """1.0 if the response's last ``\\boxed{...}`` is mathematically equivalent to ``ground_truth``, else 0.0."""
    answer = last_boxed(solution_str)
    if answer is None or not answer.strip():
        return 0.0
    try:
        return 1.0 if _SCORER.equivalent(answer, str(ground_truth), timeout_seconds) else 0.0
    except ScoreTimeout:
        logger.warning("math_verify_reward: comparing %r with %r took over %.0f s; scored 0", answer[:80], ground_truth, timeout_seconds)
        return 0.0


def _serve() -> None:
    """The scoring process: one JSON request per line on stdin, one ``{"equal": bool}`` line back."""
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # anything math-verify prints must not corrupt the replies
    import math_verify  # noqa: F401 - imported before "ready": the first request's deadline excludes it

    out.write(f"{_READY}\n".encode())
    out.flush()
    for line in sys.stdin.buffer:
        request = json.loads(line)
        try:
            equal = equivalent(request["answer"], request["ground_truth"])
        except Exception:  # noqa: BLE001 - an unparsable answer is a wrong answer
            equal = False
        out.write((json.dumps({"equal": equal}) + "\n").encode())
        out.flush()


if __name__ == "__main__":
    _serve()
