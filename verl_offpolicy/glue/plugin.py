"""Entry point of verl's ``verl.plugins`` group: imported by ``import verl`` in every process.

It registers verl-offpolicy's estimators, losses, trainer and CPU backend. It never raises (verl
would swallow the exception at DEBUG level): a failure is logged at ERROR and re-raised, with its
cause, by the first config that selects one of our names.
"""

from verl_offpolicy.glue.registration import register_all

register_all()
