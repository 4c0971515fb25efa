"""How long the scheduler waits for a batch without progress before it calls the rollout stuck.

A rollout process that is stopped (SIGSTOP), hung or dead finishes no prompt group. The trainer fails the
run once no group has finished for :attr:`GenerationDeadline.bound_s`, a bound that follows the
generations this run has measured (a fixed hour would hold a small run with a frozen rollout for an hour):
``factor`` × the slowest wait for a whole batch so far, at least ``floor_s``, at most
``limit_s``; before the first measurement (start-up, the first batch) it is ``limit_s``. Setting
``VERL_OFFPOLICY_GENERATION_TIMEOUT`` fixes the bound at that many seconds instead.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass
from typing import Mapping, Optional

GENERATION_TIMEOUT_ENV = "VERL_OFFPOLICY_GENERATION_TIMEOUT"
LIMIT_S = 3600.0  # before anything is measured, and the most a measured bound grows to
FACTOR = 10.0
FLOOR_S = 300.0  # generations vary (longer responses as training goes on); never less than this
# The longest wait this platform's timers hold (a longer one raises OverflowError in every wait on it).
MAX_TIMEOUT_S = threading.TIMEOUT_MAX


@dataclass
class GenerationDeadline:
    """Seconds a wait may go without a prompt group finishing (:attr:`bound_s`), from the measured generations."""

    limit_s: float = LIMIT_S
    factor: float = FACTOR
    floor_s: float = FLOOR_S
    fixed: bool = False  # set by GENERATION_TIMEOUT_ENV: always limit_s
    slowest_s: Optional[float] = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "GenerationDeadline":
        """The deadline of this process: fixed at ``VERL_OFFPOLICY_GENERATION_TIMEOUT`` seconds if set (> 0, at most
        :data:`MAX_TIMEOUT_S`, the longest wait the platform's timers hold)."""
        raw = env.get(GENERATION_TIMEOUT_ENV)
        if raw is None or raw.strip() == "":
            return cls()
        try:
            seconds = float(raw)
        except ValueError:
            seconds = float("nan")
        if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT_S):
            raise ValueError(
                f"{GENERATION_TIMEOUT_ENV} must be a number of seconds > 0, got {raw!r}; at most {MAX_TIMEOUT_S:.0f} "
                "(the longest wait this platform's timers hold)"
            )
        return cls(limit_s=seconds, fixed=True)

    def observe(self, seconds: float) -> None:
        """Record one completed wait for a whole batch."""
        self.slowest_s = seconds if self.slowest_s is None else max(self.slowest_s, seconds)

    @property
    def bound_s(self) -> float:
        if self.fixed or self.slowest_s is None:
            return self.limit_s
        return min(self.limit_s, max(self.floor_s, self.factor * self.slowest_s))

    def describe(self) -> str:
        """Where :attr:`bound_s` comes from, for the log and the error."""
        if self.fixed:
            return f"{self.bound_s:.0f} s without a prompt group finishing ({GENERATION_TIMEOUT_ENV})"
        if self.slowest_s is None:
            return f"{self.bound_s:.0f} s without a prompt group finishing (no generation measured yet)"
        return (
            f"{self.bound_s:.0f} s without a prompt group finishing ({self.factor:g} x the slowest generation so far, "
            f"{self.slowest_s:.1f} s; at least {self.floor_s:.0f} s, at most {self.limit_s:.0f} s; "
            f"{GENERATION_TIMEOUT_ENV}=<seconds> fixes it)"
        )
