"""The bound on a wait for the rollout without progress (a frozen rollout must fail the run, not hang it)."""

from __future__ import annotations

import pytest

# ------------------------------------------------------------- a frozen rollout: the wait's bound


def test_the_generation_bound_follows_the_measured_generations():
    """A rollout frozen mid-run (SIGSTOP) used to hold the trainer for a fixed 3600 s. The bound on a wait
    without progress is the limit before anything is measured, then 10 x the slowest measured wait,
    between 300 s and the limit."""
    from verl_offpolicy.glue.scheduler.deadline import GenerationDeadline

    deadline = GenerationDeadline.from_env({})
    assert deadline.bound_s == 3600 and "no generation measured yet" in deadline.describe()
    deadline.observe(2.0)  # the CPU demo: seconds per batch
    assert deadline.bound_s == 300
    deadline.observe(45.0)
    deadline.observe(30.0)  # the slowest counts
    assert deadline.bound_s == 450
    assert "10 x the slowest generation so far, 45.0 s" in deadline.describe()
    deadline.observe(1000.0)
    assert deadline.bound_s == 3600


def test_the_generation_bound_set_in_the_environment_is_fixed_and_checked():
    from verl_offpolicy.glue.scheduler.deadline import GenerationDeadline

    deadline = GenerationDeadline.from_env({"VERL_OFFPOLICY_GENERATION_TIMEOUT": "120"})
    deadline.observe(1000.0)
    assert deadline.bound_s == 120 and "VERL_OFFPOLICY_GENERATION_TIMEOUT" in deadline.describe()
    for bad in ("-5", "0", "soon", "nan"):
        with pytest.raises(
            ValueError, match=f"VERL_OFFPOLICY_GENERATION_TIMEOUT must be a number of seconds > 0, got '{bad}'"
        ):
            GenerationDeadline.from_env({"VERL_OFFPOLICY_GENERATION_TIMEOUT": bad})
