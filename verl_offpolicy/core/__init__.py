"""Pure math of verl-offpolicy: torch and the Python standard library only, never verl.

Each formula of ``ALGORITHMS.md`` and ``SCHEDULER.md`` lives in exactly one function here; the verl
glue in :mod:`verl_offpolicy.glue` only adapts tensors and configs to these functions.
"""
