"""Pure math of verl-offpolicy: torch and the Python standard library only, never verl.

Each formula of ``docs/algorithms.md`` and ``docs/scheduler.md`` lives in exactly one function here; the verl
glue in :mod:`verl_offpolicy.glue` only adapts tensors and configs to these functions.
"""
