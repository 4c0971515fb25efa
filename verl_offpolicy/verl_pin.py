"""The verl release this package is tested on, and what happens under another.

:data:`TESTED_VERL` is the one pin: CI installs it (the README's setup), ``pyproject.toml``'s requirement admits
it, ``recipe/offpolicy/REQUIRED_VERL.txt`` names it (both checked by ``tests/test_verl_contract.py``), and
``tests/test_verl_contract.py`` lists every verl symbol and keyword argument the package uses. Under another
installed verl (its distribution version, ``importlib.metadata``) importing the plugin logs one warning naming
both versions and the contract test to run; with ``VERL_OFFPOLICY_STRICT_VERL=1`` the startup validation stops
the run instead. ``verl-offpolicy doctor`` reports it.

Standard library only: the plugin imports it at ``import verl`` in every process.
"""

from __future__ import annotations

import logging
import os
from importlib import metadata

TESTED_VERL = "0.9.1"
STRICT_ENV = "VERL_OFFPOLICY_STRICT_VERL"
CONTRACT_TEST = "tests/test_verl_contract.py"

logger = logging.getLogger("verl_offpolicy")
_warned = False


def installed_verl() -> str | None:
    """The installed verl distribution's version, or None if verl is not installed."""
    try:
        return metadata.version("verl")
    except metadata.PackageNotFoundError:
        return None


def untested_verl(installed: str | None = None) -> str | None:
    """Why the installed verl is not the tested one, or None when it is (or verl is not installed)."""
    installed = installed_verl() if installed is None else installed
    if installed is None or installed == TESTED_VERL:
        return None
    return (
        f"verl {installed} is installed, but verl-offpolicy is tested on verl {TESTED_VERL}: the verl symbols and "
        f"keyword arguments it uses may differ; run its contract test (python -m pytest {CONTRACT_TEST}) "
        f"against this verl, or install verl=={TESTED_VERL}"
    )


def strict() -> bool:
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes")


def warn_if_untested() -> None:
    """At import (the plugin): one warning per process when the installed verl is not the tested one."""
    global _warned
    problem = untested_verl()
    if problem and not _warned:
        _warned = True
        logger.warning("%s (%s=1 makes this a startup error)", problem, STRICT_ENV)


def check_verl_version() -> None:
    """At startup: a ``RuntimeError`` under an untested verl when ``VERL_OFFPOLICY_STRICT_VERL=1``."""
    problem = untested_verl()
    if problem and strict():
        raise RuntimeError(f"{problem} ({STRICT_ENV}=1)")
