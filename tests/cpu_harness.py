"""Fresh processes of the CPU path, for tests (the engine pieces live in tests/actor_harness.py).

- :func:`isolated`: :func:`tests.actor_harness.run_isolated` for a function of the tests package
  (``tests.<module>:<function>``, e.g. the scenarios of tests/scenario_*.py) in a fresh
  ``VERL_PLATFORM=cpu`` process with a timeout; its result is JSON.
- :func:`run_main_ppo`: stock ``python -m verl.trainer.main_ppo`` with a timeout (process group
  killed on timeout), for startup-guard tests.
- :func:`assert_named_with_fix`: what the startup guards' problem lists are checked for.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from tests.actor_harness import run_isolated
from verl_offpolicy.cpu.platform import CPU_ENV, LOOPBACK_ENV
from verl_offpolicy.demo.process import run_captured

REPO_ROOT = Path(__file__).resolve().parents[1]


def isolated(target: str, timeout: float = 300.0, cpu: bool = True, **kwargs: Any) -> Any:
    """:func:`run_isolated` for a function of the tests package (``tests.<module>:<fn>``), from the repo root."""
    cwd = os.getcwd()
    os.chdir(REPO_ROOT)  # `python -c` puts the cwd first on sys.path: our `tests`, not verl's
    try:
        return run_isolated(target, kwargs, timeout=timeout, cpu=cpu)
    finally:
        os.chdir(cwd)


def run_main_ppo(
    args: Sequence[str], timeout: float = 120.0, env: Optional[dict[str, str]] = None, cpu_env: bool = True
) -> tuple[int, str, float]:
    """Run ``python -m verl.trainer.main_ppo <args>``; return (exit code, output, seconds).

    The process runs in its own session and is killed (whole group) if it exceeds ``timeout``.
    """
    run_env = dict(os.environ if env is None else env)
    if cpu_env:
        run_env.update(CPU_ENV)
        run_env.update(LOOPBACK_ENV)
    run_env.setdefault("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vo-main-ppo-") as tmp:
        returncode, output = run_captured(
            [sys.executable, "-m", "verl.trainer.main_ppo", *args, f"hydra.run.dir={tmp}"],
            env=run_env,
            timeout=timeout,
            cwd=tmp,
        )
        if returncode is None:
            raise AssertionError(f"main_ppo did not exit within {timeout}s (a hang); output:\n{output[-3000:]}")
    return returncode, output, time.monotonic() - start


def assert_named_with_fix(problems: list[str], key: str, fix: str) -> None:
    """One of the startup guard's ``problems`` names ``key`` and says ``fix``."""
    matching = [p for p in problems if key in p]
    assert matching, problems
    assert fix in matching[0], matching[0]
