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


def module_this_machine_cannot_import(exc: BaseException) -> str | None:
    """The module whose import raised ``exc``, when ``exc`` comes from importing a module that is not ours (a
    package this machine lacks or cannot load: vLLM on a login node), else None. Such an error says what this
    machine has, not what the config is: a check that meets it names the module and checks the rest."""
    if isinstance(exc, ImportError) and exc.name and not exc.name.startswith(PACKAGE):
        return exc.name
    # The innermost module body running when it raised (import frames are hidden; a module body is ``<module>``),
    # below the caller's own frame.
    bodies = [
        frame for frame, _ in list(traceback.walk_tb(exc.__traceback__))[1:] if frame.f_code.co_name == "<module>"
    ]
    module = bodies[-1].f_globals.get("__name__") if bodies else None
    if module is None or module.startswith(PACKAGE):
        return None
    return module
