"""The staleness scheduler's shared test facts: the spec's schedule table, verl's metric names, the GPU overlapped
overrides and the behaviour-anchored REC run at (4, 1) that several modules read (tests/scheduler/test_scheduler_e2e.py,
tests/scheduler/test_ranks_e2e.py, tests/cpu/test_vllm_cpu_e2e.py, tests/scheduler/test_overlapped.py,
tests/scheduler/test_scheduler_modes.py)."""

from __future__ import annotations

from tests.scenario_runs import NO_VALIDATION, PRIMARY_CONFIG, SCHEDULED_STEPS, SHARED_RUN_TIMEOUT, ranks, schedule

STEPS = SCHEDULED_STEPS
# verl's own names (verl/trainer/ppo/v1/trainer_base.py, _compute_metrics), written out here
VERL_OFF_POLICY = "training/off_policy"
STALENESS = f"{VERL_OFF_POLICY}/trajectory_staleness/mean"

# v(t), staleness, the steps that make a rollout call and the first step of version > 0, written out by hand
# from docs/scheduler.md for 6 steps at each (s, d).
SPEC_SCHEDULE = {
    (1, 0): dict(versions=[0, 1, 2, 3, 4, 5], staleness=[0, 0, 0, 0, 0, 0], calls=[1, 2, 3, 4, 5, 6], first=1),
    (1, 1): dict(versions=[0, 0, 1, 2, 3, 4], staleness=[0, 1, 1, 1, 1, 1], calls=[1, 2, 3, 4, 5], first=2),
    (2, 0): dict(versions=[0, 0, 2, 2, 4, 4], staleness=[0, 1, 0, 1, 0, 1], calls=[1, 3, 5], first=2),
    (2, 1): dict(versions=[0, 0, 0, 2, 2, 4], staleness=[0, 1, 2, 1, 2, 1], calls=[1, 3, 5], first=3),
    (4, 1): dict(versions=[0, 0, 0, 0, 0, 4], staleness=[0, 1, 2, 3, 4, 1], calls=[1, 5], first=5),
}

# The overlapped mode on a GPU config (startup validation only: nothing of it runs here).
OVERLAPPED = [
    "actor_rollout_ref.hybrid_engine=false",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
]

# The REC runs keep the demo's 8 x 16 samples per step: enough tokens that the one-side mask finds
# ratios outside its band on every stale step. The behaviour-anchored (4, 1) run saves a checkpoint
# after step 3: the resume test starts from it.
# They train on two ranks, one micro-batch of 64 samples each (tests/scheduler/test_ranks_e2e.py reads the same run:
# the (4, 1) schedule and the behaviour log-probs on two ranks), with twice the shared runs' timeout: two
# training and two rollout processes start one after the other.
RANKS, REC_TIMEOUT = 2, 2 * SHARED_RUN_TIMEOUT
REC_41 = NO_VALIDATION + schedule(4, 1) + ranks(RANKS, micro_batch=64)
RESUME_STEP = 3
REC_S4D1 = ("rec_oneside_nois", REC_41 + [f"trainer.save_freq={RESUME_STEP}"], PRIMARY_CONFIG)


def start_rec_s4d1(demo_runs):
    """The behaviour-anchored REC run at (4, 1) on two ranks (:data:`REC_S4D1`), shared with
    tests/scheduler/test_ranks_e2e.py."""
    preset, overrides, config_name = REC_S4D1
    return demo_runs.start(preset, STEPS, overrides, config_name, REC_TIMEOUT, name="rec_s4d1")
