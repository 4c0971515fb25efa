"""The scheduler's knobs under ``algorithm.offpolicy`` (:class:`~verl_offpolicy.glue.knobs.Knob`, assembled by
:mod:`verl_offpolicy.glue.config`): the schedule (s, d), the ratio anchor and partial
rollouts."""

from __future__ import annotations

from verl_offpolicy.core.schedule import check_schedule
from verl_offpolicy.glue.family import Family
from verl_offpolicy.glue.knobs import Knob, boolean

# algorithm.offpolicy.ratio_anchor, what old_log_prob means in the loss (docs/scheduler.md, "The ratio anchor"):
BEHAVIOUR = "behaviour"  # the training engine's log-probs at the weights that generated the batch
ROLLOUT = "rollout"  # the inference engine's log-probs (the rollout's own)
PROXIMAL = "proximal"  # verl's default: recomputed with the current weights at the start of each step
RATIO_ANCHORS = (BEHAVIOUR, ROLLOUT, PROXIMAL)


def _sync_interval(key: str, value) -> None:
    check_schedule(value, 0)


def _sync_offset(key: str, value) -> None:
    check_schedule(1, value)


OFFPOLICY_KNOBS = (
    Knob(
        "sync_interval",
        1,
        "s ≥ 1: rollout weights refreshed every s training steps (1 = on-policy, stock verl).",
        check=_sync_interval,
    ),
    Knob("sync_offset", 0, "d ≥ 0: batches generated before training starts (delayed feedback).", check=_sync_offset),
    Knob(
        "ratio_anchor",
        PROXIMAL,
        "What old_log_prob means in the loss: behaviour (training engine at the generating weights), rollout "
        "(inference engine log-probs), proximal (verl's default, recomputed each step).",
        choices=RATIO_ANCHORS,
    ),
    Knob(
        "partial_rollout",
        False,
        "Overlapped mode only: a weight push interrupts in-flight generation, which resumes under the new weights "
        "(every response token records the version that sampled it); false: a push waits for the drain.",
        check=boolean,
        variant=False,
    ),
)

FAMILY = Family("scheduler", offpolicy_knobs=OFFPOLICY_KNOBS)
