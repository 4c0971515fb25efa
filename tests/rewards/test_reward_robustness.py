"""The math-verify reward against hostile answers: no answer can hang the reward, and a scoring
process that dies mid-answer costs that answer only.

- Finding the last ``\\boxed{`` is linear: 16,000 unclosed boxes (112 KB) took 144 s with the quadratic
  search (a 1 MB answer: hours); each case here is bounded by 10 s, far above the linear scan's time and
  far below the quadratic one's. The results equal the quadratic search's on a table of hand-written cases
  (expected values written by hand) and on random strings of boxes and braces.
- A scoring process killed with SIGKILL (as the OOM killer does) while it holds an answer: that answer
  scores 0 with a warning and the next answer is scored by a new process. No mocks: the real child
  process, the real signal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from verl_offpolicy.rewards import math_verify_reward
from verl_offpolicy.rewards.math_verify_reward import compute_score, last_boxed

BOUND_SECONDS = 10  # the linear scan takes well under 1 s for 1 MB; the quadratic one took 144 s for 112 KB
UNCLOSED_112KB = "\\boxed{" * 16_000  # the probe's case: 7 × 16,000 = 112,000 characters
UNCLOSED_1MB = "\\boxed{" * 150_000


@contextlib.contextmanager
def within(seconds: float):
    """Fail (instead of waiting minutes) if the block runs longer than ``seconds`` (SIGALRM, main thread)."""

    def expire(signum, frame):
        raise TimeoutError(f"took over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except TimeoutError as expired:  # the interrupted frame's traceback has no line number, which pytest cannot show
        pytest.fail(str(expired), pytrace=False)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


_BOXED = re.compile(r"\\boxed\s*\{")


def quadratic_last_boxed(text):
    """The previous search (for each box from the last, scan forward for its closing brace), as a reference."""
    for match in reversed(list(_BOXED.finditer(text))):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            if text[i - 1] == "\\":  # an escaped brace is LaTeX text
                continue
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i]
    return None


# (text, the last box whose braces close, by hand)
TABLE = [
    ("no box", None),
    ("", None),
    ("\\boxed{3}", "3"),
    ("\\boxed {x^{2}}", "x^{2}"),  # whitespace before the brace
    ("\\boxed\n{7}", "7"),
    ("a \\boxed{1} b \\boxed{\\frac{1}{2}} c", "\\frac{1}{2}"),  # several boxes: the last; nested braces kept
    ("\\boxed{{{a}}}", "{{a}}"),
    ("\\boxed{}", ""),  # empty (scored 0 by boxed_answer)
    ("\\boxed{open", None),
    ("\\boxed{3} then \\boxed{4", "3"),  # the last box does not close: the one before it counts
    ("\\boxed{a \\boxed{b}", "b"),  # the outer box does not close, the inner one does
    ("\\boxed{a \\boxed{b}}", "b"),  # the last box to start is the inner one; the first "}" closes it
    ("} } \\boxed{5}", "5"),  # stray closing braces before the box do not matter
    ("\\boxed{5} }", "5"),
    ("\\boxed{1} \\boxed{2 { 3}", "1"),  # the second box's brace opened inside it never closes
    ("\\boxed{\\{x\\}}", "\\{x\\}"),  # escaped braces are text: the box closes at its own brace
    ("\\boxed", None),
    ("boxed{1}", None),  # no backslash: not a box
    ("\\boxed{1}" + "\\boxed{" * 50, "1"),
    ("\\boxed{" * 50 + "\\boxed{2}", "2"),
    ("\\boxed{" * 50 + "}" * 3, ""),  # the first "}" closes the last box: empty content
]


def test_last_boxed_on_hand_written_cases():
    for text, expected in TABLE:
        assert last_boxed(text) == expected, text
        assert quadratic_last_boxed(text) == expected, text


def test_last_boxed_equals_the_quadratic_search_on_random_strings():
    rng = random.Random(30)
    atoms = ["\\boxed{", "\\boxed {", "{", "}", "x", "\\{", "\\}", " ", "\\boxed"]
    for _ in range(5000):
        text = "".join(rng.choice(atoms) for _ in range(rng.randint(0, 14)))
        assert last_boxed(text) == quadratic_last_boxed(text), text


@pytest.mark.parametrize(
    "text", [UNCLOSED_112KB, UNCLOSED_1MB, UNCLOSED_1MB + "\\boxed{2}"], ids=["112KB", "1MB", "1MB-last-closes"]
)
def test_last_boxed_is_linear_on_unclosed_boxes(text):
    # every box is unclosed except, in the last case, the final "\boxed{2}" (its "}" closes it first)
    with within(BOUND_SECONDS):
        assert last_boxed(text) == ("2" if text.endswith("{2}") else None)


def test_a_pathological_answer_is_scored_within_the_deadline():
    compute_score("math", "\\boxed{1}", "1")  # the scoring process is up (its start-up is not timed)
    with ThreadPoolExecutor(max_workers=1) as pool:
        no_box = pool.submit(compute_score, "math", UNCLOSED_112KB, "1", timeout_seconds=BOUND_SECONDS)
        assert no_box.result(timeout=300) == 0.0
        last_closes = pool.submit(
            compute_score, "math", UNCLOSED_1MB + "\\boxed{2}", "2", timeout_seconds=BOUND_SECONDS
        )
        assert last_closes.result(timeout=300) == 1.0


def _kill_when_busy(pid: int, busy_seconds: float = 0.05, patience: float = 120.0) -> None:
    """SIGKILL ``pid`` once it has used ``busy_seconds`` more CPU time (it is working on an answer). A small amount:
    math-verify's own 5 s timeouts are wall-clock, so on a loaded machine the process may get less than half a
    CPU-second before they end the answer (scored 0 without a kill: the suite failed that way once at 0.3 s)."""
    process = psutil.Process(pid)
    start = sum(process.cpu_times()[:2])
    deadline = time.monotonic() + patience
    while sum(process.cpu_times()[:2]) - start < busy_seconds and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def test_a_scoring_process_killed_mid_answer_scores_it_0_and_the_next_answer_is_scored(caplog):
    """9^{9^{9^{9}}} keeps the scoring process busy; SIGKILL it there (the OOM killer's signal): that answer
    scores 0 with a warning, and the next answer is scored by a new process."""
    compute_score("math", "\\boxed{1}", "1")
    victim = math_verify_reward._SCORER.proc
    killer = threading.Thread(target=_kill_when_busy, args=(victim.pid,))
    caplog.set_level(logging.WARNING, logger=math_verify_reward.__name__)
    with ThreadPoolExecutor(max_workers=1) as pool:
        killer.start()
        hanging = pool.submit(compute_score, "math", "\\boxed{9^{9^{9^{9}}}}", "3", timeout_seconds=240)
        assert hanging.result(timeout=300) == 0.0
        killer.join()
        assert f"exited with status {-signal.SIGKILL}" in caplog.text and "scored 0" in caplog.text
        assert pool.submit(compute_score, "math", "\\boxed{\\frac{1}{2}}", "0.5").result(timeout=300) == 1.0
    assert math_verify_reward._SCORER.proc.pid != victim.pid


def test_a_scoring_process_killed_between_answers_is_replaced():
    compute_score("math", "\\boxed{1}", "1")
    victim = math_verify_reward._SCORER.proc
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=60)
    assert compute_score("math", "\\boxed{2}", "2") == 1.0
    assert math_verify_reward._SCORER.proc.pid != victim.pid
