"""Run a command that dies with the process that started it: ``python -m verl_offpolicy.demo.parent_death PID --
CMD ...``.

The demo runs ``main_ppo`` in a session of its own (so that it can kill the whole group), which also means
nothing would end it when the demo itself is SIGKILLed (the OOM killer, ``kill -9``): it would run on for a
minute and leave its Ray temp dir behind. This launcher asks the kernel for SIGKILL when its parent ends
(Linux ``prctl(PR_SET_PDEATHSIG)``, kept across ``exec``), checks that the parent ``PID`` is still the
parent (it may have died before the request), then execs the command. Ray's GCS and raylet, started by
``main_ppo``, share its fate the same way (Ray's kernel fate-sharing), and its workers end with the raylet.
Standard library only: it runs before ``main_ppo`` imports anything. Elsewhere than Linux it only execs.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
MODULE = "verl_offpolicy.demo.parent_death"


def set_parent_death_signal(signum: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent ends (Linux only; True if set)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0


def launcher(parent_pid: int, command: list[str]) -> list[str]:
    """``command`` run through this launcher, bound to ``parent_pid``."""
    return [sys.executable, "-m", MODULE, str(parent_pid), "--", *command]


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m verl_offpolicy.demo.parent_death PARENT_PID -- COMMAND ...", file=sys.stderr)
        return 2
    parent = int(argv[0])
    set_parent_death_signal()
    if os.getppid() != parent:  # the parent ended before the request: nothing would end this run
        return 1
    os.execvp(argv[2], argv[2:])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
