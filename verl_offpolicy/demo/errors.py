"""How a demo run fails: the exceptions :func:`verl_offpolicy.demo.run.run_demo` raises, with their exit codes."""

from __future__ import annotations

from typing import Optional


class DemoError(RuntimeError):
    """The demo run failed or timed out; the message carries the end of the training log, and
    ``ray_temp_dir`` the run's own Ray session dir once one was made (removed with the run)."""

    exit_code = 1
    ray_temp_dir: Optional[str] = None


class DemoInputError(DemoError):
    """The demo cannot start (e.g. an unusable output directory); raised before anything is started."""

    exit_code = 2


class DemoInterrupted(DemoError):
    """Ctrl-C or SIGTERM stopped the run; its processes and Ray temp dir are gone, its partial output stays."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum
