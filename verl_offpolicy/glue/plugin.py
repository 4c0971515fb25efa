"""Entry point of verl's ``verl.plugins`` group: imported by ``import verl`` in every process.

It registers verl-offpolicy's estimators, losses, trainer and CPU backend. It never raises (verl
would swallow the exception at DEBUG level): a failure is logged at ERROR and re-raised, with its
cause, by the first config that selects one of our names. If even the registration module cannot
import (a broken installation), the ERROR is logged here, with a logger of the standard library,
and :data:`LOAD_FAILURE` keeps the message for ``verl-offpolicy doctor``.
"""

import logging

LOAD_FAILURE: str | None = None

try:
    from verl_offpolicy.glue.registration import register_all
except Exception as _exc:  # noqa: BLE001 - verl would hide it at DEBUG level
    from verl_offpolicy.glue.broken_install import import_failure_message

    LOAD_FAILURE = import_failure_message("verl_offpolicy.glue.registration", _exc)
    logging.getLogger("verl_offpolicy").error(
        "verl-offpolicy registered nothing in this process (`import verl`): %s", LOAD_FAILURE
    )
else:
    register_all()

try:
    from verl_offpolicy.verl_pin import warn_if_untested

    warn_if_untested()  # one warning when the installed verl is not the one the package is tested on
except Exception:  # noqa: BLE001 - the plugin never raises (verl would hide it)
    pass
