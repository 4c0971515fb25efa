"""A run's output directory: its file names, its creation, and its lock (one run at a time).

Everything a run writes is under ``output_dir`` or its Ray temp dir (removed after the run): the
training log, verl's metrics (JSONL), the summary and the reward curve, the caches under
:data:`CACHE_NAME` (:mod:`.environment`), and the lock file :data:`LOCK_NAME`.
"""

from __future__ import annotations

import os
from pathlib import Path

from verl_offpolicy.demo.errors import DemoInputError
from verl_offpolicy.demo.process import ExclusiveLock, LockHeld

LOG_NAME = "train.log"
METRICS_NAME = "metrics.jsonl"
PLOT_NAME = "reward_curve.png"
SUMMARY_NAME = "summary.json"
LOCK_NAME = ".verl-offpolicy-demo.lock"
CACHE_NAME = ".cache"


def prepare_output_dir(output_dir: str | os.PathLike) -> Path:
    """Create ``output_dir`` (absolute) or raise :class:`DemoInputError`: one line naming it and why."""
    path = Path(output_dir).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise DemoInputError(f"output directory {path} is not a directory (a file of that name exists)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DemoInputError(f"cannot create the output directory {path}: {exc.strerror or exc}") from None
    return path.resolve()


class OutputDirLock(ExclusiveLock):
    """One run per output directory: the :class:`ExclusiveLock` on ``output_dir/LOCK_NAME``; the training
    subprocess inherits the locked file (``pass_fds``), so the directory stays held while it lives."""

    def __init__(self, output_dir: Path):
        super().__init__(output_dir / LOCK_NAME)

    def acquire(self) -> "OutputDirLock":
        """Take the lock or raise :class:`DemoInputError`: one line naming the directory and why."""
        try:
            super().acquire()
        except LockHeld as exc:
            raise DemoInputError(
                f"output directory {self.path.parent} is in use by another demo run (PID {exc.holder}, lock "
                f"{self.path}); "
                "wait for it to end or choose another --output-dir"
            ) from None
        except OSError as exc:
            raise DemoInputError(
                f"cannot write in the output directory {self.path.parent}: {exc.strerror or exc}"
            ) from None
        return self
