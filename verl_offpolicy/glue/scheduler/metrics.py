"""The metrics the ``offpolicy`` trainer logs: one place for their names (``docs/scheduler.md``, "What it logs").

Staleness is logged under verl's own names: verl 0.9.1's v1 trainer (``PPOTrainer._compute_metrics``)
computes ``training/off_policy/trajectory_staleness/{mean,max,min}`` = (t − 1) − (version of the weights
that generated each trajectory), from the version tag the rollout server puts on each trajectory (the
``global_steps`` the trainer passes to ``update_weights``), plus ``trajectory_staleness_worst/*`` and
``trajectory_spans/*``. This package does not log a second copy: the trainer checks the same version tags
against the schedule before it trains a batch (:func:`verl_offpolicy.glue.scheduler.rollout.check_observed_version`),
and logs under ``offpolicy/`` only what verl has no name for.
"""

from __future__ import annotations

# verl's names (verl/trainer/ppo/v1/trainer_base.py, _compute_metrics), logged by verl itself.
VERL_STALENESS = "training/off_policy/trajectory_staleness"
VERL_STALENESS_WORST = "training/off_policy/trajectory_staleness_worst"
VERL_SPANS = "training/off_policy/trajectory_spans"
STATS = ("mean", "max", "min")

# Ours: what verl lacks.
VERSION = "offpolicy/version"
QUEUE_LEN = "offpolicy/queue_len"
ROLLOUT_BATCHES_PER_SYNC = "offpolicy/rollout_batches_per_sync"
ROLLOUT_CALLS = "offpolicy/rollout_calls"
GENERATED_BATCHES = "offpolicy/generated_batches"
ANCHOR_LOG_RATIO = "offpolicy/anchor_log_ratio/mean"


def staleness_key(stat: str = "mean") -> str:
    """verl's name of one statistic of the trained batch's staleness, e.g. ``.../trajectory_staleness/mean``."""
    return f"{VERL_STALENESS}/{stat}"


def queue_metrics(version: int, queue_len: int, rollout_batches_per_sync: int) -> dict[str, float]:
    """The trained batch's version v(t), the FIFO length (its own batch included) and the size of the
    last rollout call, in batches."""
    return {
        VERSION: float(version),
        QUEUE_LEN: float(queue_len),
        ROLLOUT_BATCHES_PER_SYNC: float(rollout_batches_per_sync),
    }


def rollout_call_metrics(generated_batches: int) -> dict[str, float]:
    """Whether this step made a rollout call (a wake-up and weight sync) and how many batches it generated."""
    return {ROLLOUT_CALLS: float(generated_batches > 0), GENERATED_BATCHES: float(generated_batches)}
