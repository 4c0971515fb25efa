"""A broken installation named in one line: which of our modules failed to import, where and why.

Standard library only: the plugin (at ``import verl``), the startup callback and doctor's probe use it when the
rest of the package may not import.
"""

from __future__ import annotations

import traceback

PACKAGE = "verl_offpolicy"


class BrokenInstallError(RuntimeError):
    """Part of verl-offpolicy cannot be imported; the message names the file and the cause."""


def import_failure_message(module: str, exc: BaseException) -> str:
    """One readable line: which module failed, where (the innermost of our files) and why."""
    where = ""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f" (in {exc.filename}, line {exc.lineno})"
    else:
        for frame in reversed(traceback.extract_tb(exc.__traceback__)):
            if f"/{PACKAGE}/" in frame.filename.replace("\\", "/"):
                where = f" (at {frame.filename}, line {frame.lineno})"
                break
    return (
        f"broken installation: importing {module} raised {type(exc).__name__}: {exc}{where}; nothing of "
        "verl-offpolicy can run. Fix that (install the missing package, or reinstall verl-offpolicy), "
        "then run `verl-offpolicy doctor`."
    )
