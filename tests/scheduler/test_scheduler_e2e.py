"""The staleness-controlled trainer (``trainer.v1.trainer_mode=offpolicy``) on verl's real pipeline.

Each run is stock ``python -m verl.trainer.main_ppo`` on the CPU (``+cpu=demo``: Ray, TransferQueue,
FSDP2 workers, agent loop, reward loop, hf rollout) with our primary config and a preset, small
batches (4 prompts × 4 samples) to keep it to about a minute. Every run has a timeout and is killed
with its Ray session on failure (``verl_offpolicy.demo.run``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jobs import queued_at_start
from tests.scenario_runs import (
    PRIMARY_CONFIG,
    SCHEDULED_STEPS,
    SHARED_RUN_TIMEOUT,
    SMALL_DEMO,
    dumped_batches,
    dumped_uid_groups,
    learn_run,
    opmd_run,
    schedule,
    start_resumed,
)
from tests.scenario_schedule import (
    RANKS,
    REC_41,
    REC_S4D1,
    REC_TIMEOUT,
    RESUME_STEP,
    SPEC_SCHEDULE,
    STALENESS,
    VERL_OFF_POLICY,
    start_rec_s4d1,
)
from verl_offpolicy.glue.scheduler.metrics import ANCHOR_CORR_PREFIX, ANCHOR_CORR_STATS

STEPS = SCHEDULED_STEPS
# off-policy health (docs/scheduler.md): verl's rollout_corr/* suffixes under our prefix, on stale steps only
ANCHOR_CORR, ANCHOR_CORR_SUFFIXES = ANCHOR_CORR_PREFIX, ANCHOR_CORR_STATS
REC_CLIPPED = "actor/offpolicy/rec/clipped_frac"
TIMEOUT = SHARED_RUN_TIMEOUT
SMALL = SMALL_DEMO  # 4 prompts x 4 samples per step (the demo's default is 8 x 16)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

# name -> (preset, overrides, config); the opmd runs at (1, 1) and (2, 1) are the overlapped tests'
# colocated runs (tests/scenario_runs.py: opmd_run), shared through the session's demo_runs.
# grpo_s1d0 has the learning run's configuration (the demo's defaults, validation included): its steps are
# compared with the first steps of that run, verl's own sync trainer (tests/scenario_runs.py: learn_run).
RUNS = {
    "grpo_s1d0": ("grpo", schedule(1, 0), PRIMARY_CONFIG),  # our trainer + grpo preset
    "rec_s4d1": REC_S4D1,
}
# The proximal-anchor REC run: the extended tier (in the default run, the behaviour-anchored run's fresh
# steps, where the anchor equals the proximal policy, show the same: no clipping, nothing logged).
PROXIMAL_RUN = ("rec_oneside_nois", REC_41 + ["algorithm.offpolicy.ratio_anchor=proximal"], PRIMARY_CONFIG)
# The extended tier's runs of :func:`extended_runs`: grpo at (2, 0) (in the default run, the schedule at s = 2
# is the (2, 1) run's, d = 0 the (1, 0) run's, and the behaviour anchor clipping on stale steps the REC run's).
EXTENDED_RUNS = {
    "grpo_s2d0": ("grpo", SMALL + schedule(2, 0), PRIMARY_CONFIG),
    "rec_s4d1_proximal": PROXIMAL_RUN,
}


@queued_at_start(scope="module")
def runs(demo_runs):
    """The result of a run of :data:`RUNS` by name, or of the shared colocated opmd run at (2, 1) by (s, d)."""
    jobs = {
        key: demo_runs.start(preset, STEPS, overrides, config_name, _timeout(overrides), name=key)
        for key, (preset, overrides, config_name) in RUNS.items()
    }
    jobs[(2, 1)] = opmd_run(demo_runs, 2, 1, mode="colocated")
    jobs["stock_sync"] = learn_run(demo_runs)  # verl's own sync trainer and GRPO keys
    return lambda key: jobs[key].result()


@queued_at_start(scope="module")
def extended_runs(demo_runs):
    """As :func:`runs`, for :data:`EXTENDED_RUNS` and the shared colocated opmd run at (1, 1) (the overlapped
    tests' extended tier uses it too), queued only in a session that selects an extended test."""
    jobs = {
        key: demo_runs.start(preset, STEPS, overrides, config_name, _timeout(overrides), name=key)
        for key, (preset, overrides, config_name) in EXTENDED_RUNS.items()
    }
    jobs[(1, 1)] = opmd_run(demo_runs, 1, 1, mode="colocated")
    return lambda key: jobs[key].result()


@queued_at_start()
def resumed_run(demo_runs):
    """The (4, 1) REC run and, once it is done, the same run resumed from its step-3 checkpoint."""
    preset, overrides, config_name = RUNS["rec_s4d1"]
    uninterrupted = start_rec_s4d1(demo_runs)
    # the resumed run: the same overrides less the checkpointing (REC_41)
    return uninterrupted, start_resumed(
        demo_runs,
        uninterrupted,
        RESUME_STEP,
        preset=preset,
        steps=STEPS,
        overrides=REC_41,
        config_name=config_name,
        timeout=REC_TIMEOUT,
        name="rec_s4d1_resumed",
    )


def _timeout(overrides) -> float:
    """A run's timeout: twice the shared runs' with two ranks."""
    return REC_TIMEOUT if f"trainer.n_gpus_per_node={RANKS}" in overrides else TIMEOUT


# The schedule of docs/scheduler.md written out by hand for steps 1..6 (v(t) = s·max(0, ⌊(t − d − 1)/s⌋)):
# versions, staleness, the steps right before which a rollout call is made (version t − 1 generates
# the batches of the steps scheduled at that version), and the batches of the first call (s + d).
# The run that shows each setting: grpo (1, 0) and (2, 0), the REC (4, 1) run, the shared opmd runs otherwise.
SPEC_RUN = {(1, 0): "grpo_s1d0", (1, 1): (1, 1), (2, 0): "grpo_s2d0", (2, 1): (2, 1), (4, 1): "rec_s4d1"}
# (1, 1) and (2, 0) in the extended tier: their runs would serve little else. The default run keeps versions
# and verl's staleness at (1, 1) in tests/demo/test_demo_rerun.py (its chain is opmd at (1, 1), steps 1..5) and the
# whole claim at s = 1, 2, 4 and d = 0, 1 here.
EXTENDED_SPEC = [(1, 1), (2, 0)]


@pytest.mark.parametrize("s,d", sorted(set(SPEC_SCHEDULE) - set(EXTENDED_SPEC)))
def test_logged_versions_and_staleness_follow_the_spec(runs, s, d):
    _check_versions_and_staleness(runs(SPEC_RUN[(s, d)]), s, d)


@pytest.mark.extended
@pytest.mark.parametrize("s,d", EXTENDED_SPEC)
def test_logged_versions_and_staleness_follow_the_spec_at_other_settings(extended_runs, s, d):
    _check_versions_and_staleness(extended_runs(SPEC_RUN[(s, d)]), s, d)


def _check_versions_and_staleness(result, s, d):
    """The claim of the two tests above on the run of (s, d)."""
    spec = SPEC_SCHEDULE[(s, d)]
    steps = [m["step"] for m in result.metrics]
    assert steps == list(range(1, STEPS + 1))
    assert [int(m["offpolicy/version"]) for m in result.metrics] == spec["versions"]
    # staleness under verl's own names (verl measures it from the rollout's version tags); one batch,
    # generated at one version, per step: every trajectory has the same staleness and spans one version
    for key in ("mean", "max", "min"):
        assert [int(m[f"{VERL_OFF_POLICY}/trajectory_staleness/{key}"]) for m in result.metrics] == spec["staleness"]
        assert [int(m[f"{VERL_OFF_POLICY}/trajectory_staleness_worst/{key}"]) for m in result.metrics] == spec[
            "staleness"
        ]
        assert [int(m[f"{VERL_OFF_POLICY}/trajectory_spans/{key}"]) for m in result.metrics] == [1] * STEPS
    assert not any(key.startswith("offpolicy/staleness") for m in result.metrics for key in m)  # no second copy
    assert max(m["offpolicy/queue_len"] for m in result.metrics) <= s + d
    # one rollout call (one weight sync) per version that has batches to generate
    assert [m["step"] for m in result.metrics if m["offpolicy/rollout_calls"] == 1] == spec["calls"]
    assert result.metrics[0]["offpolicy/generated_batches"] == spec["first"]


@pytest.mark.extended
def test_grpo_clips_against_the_behaviour_policy_on_stale_steps(extended_runs):
    """The grpo preset measures its PPO ratio against the behaviour policy (the REC paper's GRPO): on
    stale steps the anchor differs from the proximal policy and the clip acts (verl's proximal anchor
    would give ρ ≡ 1 with one mini-batch, pg_clipfrac = 0: see the proximal REC run below). At (2, 0)
    steps 2, 4, 6 train on batches one version old."""
    metrics = extended_runs("grpo_s2d0").metrics
    stale = [m for m in metrics if m[STALENESS] > 0]
    assert [m["step"] for m in stale] == [2, 4, 6]
    assert all(m["offpolicy/anchor_log_ratio/mean"] != 0 for m in stale)
    assert any(m["actor/pg_clipfrac"] > 0 for m in stale), [m["actor/pg_clipfrac"] for m in stale]
    assert all(m["actor/pg_clipfrac"] == 0 for m in metrics if m[STALENESS] == 0)
    _assert_anchor_corr_on_stale_steps_only(metrics)
    assert not any(key.startswith("actor/offpolicy/") for m in metrics for key in m)  # verl's vanilla loss: no fraction


def _assert_anchor_corr_on_stale_steps_only(metrics):
    """Every stale step logs the whole anchor_corr set, consistent with the anchor lag; no fresh step logs any of it."""
    for m in metrics:
        logged = {key[len(ANCHOR_CORR) :] for key in m if key.startswith(ANCHOR_CORR)}
        if m[STALENESS] == 0:
            assert logged == set(), (m["step"], logged)
            continue
        assert logged == set(ANCHOR_CORR_SUFFIXES), (m["step"], logged)
        assert m[ANCHOR_CORR + "kl"] == pytest.approx(-m["offpolicy/anchor_log_ratio/mean"], rel=1e-4, abs=1e-7)
        assert 0 < m[ANCHOR_CORR + "rollout_is_eff_sample_size"] < 1  # the anchor lags: unequal weights
        assert m[ANCHOR_CORR + "k3_kl"] > 0 and m[ANCHOR_CORR + "chi2_token"] > 0


def test_sync_interval_1_is_the_stock_sync_trainer(runs):
    """(s, d) = (1, 0) through our trainer vs verl's own ``sync`` trainer at the same seed: our 6-step run
    against the first 6 steps of the 20-step learning run, same configuration (verl's constant learning
    rate: a step does not depend on the number of steps to come).

    Same data, same rollouts: the rewards are identical step by step, and so is the greedy validation
    before training. The losses agree to float32 summation-order noise: verl's sync trainer is itself not
    bitwise reproducible here (uuid4 uids and asynchronous arrival order the samples of a batch, hence
    the order of the float32 sums; two stock runs differ by ~1e-7 relative, measured).
    """
    ours, stock = runs("grpo_s1d0"), runs("stock_sync")
    shared = stock.metrics[: len(ours.metrics)]
    assert [m["step"] for m in shared] == list(range(1, STEPS + 1))
    assert ours.validation[0] == stock.validation[0]
    assert [m["critic/score/mean"] for m in ours.metrics] == [m["critic/score/mean"] for m in shared]
    assert [m["response_length/mean"] for m in ours.metrics] == [m["response_length/mean"] for m in shared]
    for mine, theirs in zip(ours.metrics, shared, strict=True):
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), (mine["step"], key)
        assert mine["actor/pg_clipfrac"] == theirs["actor/pg_clipfrac"] == 0.0
    assert "offpolicy/version" not in stock.metrics[0]  # the stock run really used verl's trainer


def test_behaviour_anchor_makes_rec_clip_on_stale_steps(runs):
    """s = 4: the REC one-side mask acts against the behaviour policy on stale steps (ratio ≠ 1), and not
    on the fresh step, where the behaviour policy is the proximal one."""
    behaviour = runs("rec_s4d1")
    stale = [m for m in behaviour.metrics if m[STALENESS] > 0]
    assert len(stale) == STEPS - 1
    assert all(m["actor/pg_clipfrac"] > 0 for m in stale), [m["actor/pg_clipfrac"] for m in stale]
    assert all(m["offpolicy/anchor_log_ratio/mean"] != 0 for m in stale)
    fresh = [m for m in behaviour.metrics if m[STALENESS] == 0]
    assert all(m["actor/pg_clipfrac"] == 0 for m in fresh)
    _assert_anchor_corr_on_stale_steps_only(behaviour.metrics)
    # the REC mask's fraction under the loss's own name, every step: verl's pg_clipfrac is the same number
    assert all(m[REC_CLIPPED] == m["actor/pg_clipfrac"] for m in behaviour.metrics)


@pytest.mark.extended
def test_proximal_anchor_leaves_rec_inert_on_stale_steps(runs, extended_runs):
    """The same (4, 1) REC run with verl's proximal anchor: the mask is inert (one mini-batch: ρ ≡ 1 on the
    first mini-batch) and nothing is compared or logged, at the same staleness."""
    behaviour, proximal = runs("rec_s4d1"), extended_runs("rec_s4d1_proximal")
    assert all(m[REC_CLIPPED] == m["actor/pg_clipfrac"] for m in proximal.metrics)
    # the proximal anchor is the proximal policy: nothing to compare, nothing logged
    assert not any(key.startswith(ANCHOR_CORR) for m in proximal.metrics for key in m)
    assert [m[STALENESS] for m in proximal.metrics] == [m[STALENESS] for m in behaviour.metrics]
    assert all(m["actor/pg_clipfrac"] == 0 and m["actor/ratio_max"] == pytest.approx(1.0) for m in proximal.metrics)


# ------------------------------------------------------------------------------ checkpoint / resume


@pytest.mark.extended  # the default run resumes an overlapped run exactly (tests/scheduler/test_overlapped.py: the same
# FIFO checkpoint of the shared trainer base) and a colocated one mid-version (tests/demo/test_demo_rerun.py)
def test_resume_trains_exactly_the_batches_of_an_uninterrupted_run(resumed_run):
    """Resume the (4, 1) REC run from its step-3 checkpoint (what an interruption right after step 3
    leaves) and compare with the same run uninterrupted: the queue (2 batches of version 0 for steps
    4, 5) comes back from verl's TransferQueue checkpoint, so no batch is lost, regenerated or trained
    twice, versions included."""
    uninterrupted = resumed_run[0].result()
    reference = dumped_batches(Path(uninterrupted.output_dir) / "rollouts", range(1, STEPS + 1))
    resumed, log, metrics = resumed_run[1].result()
    assert "offpolicy scheduler: restored 2 queued batches for steps [4, 5]" in log
    assert sorted(s for s in metrics if s >= 1) == [4, 5, 6]
    assert [int(metrics[s]["offpolicy/version"]) for s in (4, 5, 6)] == [0, 0, 4]

    # Same samples as the uninterrupted run, step by step (responses included: nothing regenerated).
    assert dumped_batches(resumed / "rollouts", range(4, STEPS + 1)) == {s: reference[s] for s in range(4, STEPS + 1)}
    # No prompt group of steps 1-3 trained again after the resume (uids of restored batches come from
    # the checkpoint, the uninterrupted run's).
    before, after = (
        dumped_uid_groups(Path(uninterrupted.output_dir) / "rollouts", range(1, 4)),
        dumped_uid_groups(resumed / "rollouts", range(4, STEPS + 1)),
    )
    assert before.isdisjoint(after)
    assert len(after) == 3 * 8  # 8 prompt groups per step
