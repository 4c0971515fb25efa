"""Two training ranks on verl's real pipeline: ``trainer.n_gpus_per_node=2`` through the demo (main_ppo on the CPU).

The scheduler tests' behaviour-anchored REC run at (s, d) = (4, 1) (tests/scheduler/test_scheduler_e2e.py: ``rec_s4d1``,
6 steps of 8 prompts x 16 samples) trains on two ranks: two FSDP2 worker processes on gloo, two fake Ray GPUs
(``ray_kwargs.ray_init.num_gpus`` follows ``trainer.n_gpus_per_node`` in ``+cpu=demo``: not set here), two
colocated ``hf`` rollout replicas. The (4, 1) schedule holds (SPEC_SCHEDULE) and the stale steps train against
behaviour log-probs that the 2 ranks computed for the whole batch. (The scheduler tests check the same run's
versions, clipping and anchor metrics; the same claims on one rank: the overlapped and scheduler runs at (2, 1).)
"""

from __future__ import annotations

import pytest

from tests.jobs import queued_at_start
from tests.scenario_schedule import SPEC_SCHEDULE, STALENESS, STEPS, VERL_OFF_POLICY, start_rec_s4d1

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]


@queued_at_start(scope="module")
def run(demo_runs):
    return start_rec_s4d1(demo_runs)


def test_two_training_ranks_follow_the_4_1_schedule(run):
    result = run.result()
    spec = SPEC_SCHEDULE[(4, 1)]
    metrics = result.metrics
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert [int(m["offpolicy/version"]) for m in metrics] == spec["versions"]
    for key in ("mean", "max", "min"):
        assert [int(m[f"{VERL_OFF_POLICY}/trajectory_staleness/{key}"]) for m in metrics] == spec["staleness"]
    assert [m["step"] for m in metrics if m["offpolicy/rollout_calls"] == 1] == spec["calls"]
    # the first call generates the batches of steps 1..s + d
    assert metrics[0]["offpolicy/generated_batches"] == spec["first"]


def test_two_training_ranks_train_the_stale_step_against_behaviour_log_probs(run):
    """Step 1 is fresh (no anchor: behaviour = proximal weights): the two ranks' log-probs agree with the
    rollout's (fp32), nothing is clipped. Step 2 is one update stale: the loss's old_log_prob are the
    behaviour log-probs the two ranks recomputed at the generating weights, so at the start of the update
    the loss's mean log(π_old/π) (``actor/ppo_kl``) is minus the gap the trainer measured between the
    proximal and the behaviour log-probs over the whole batch, and REC's one-side mask acts. verl averages
    ``ppo_kl`` over the ranks' token means (one micro-batch per rank), the gap is one token mean over the
    batch: equal when the ranks hold as many tokens (measured: exact in one run, 1.6e-3 apart in another);
    a loss on the proximal log-probs would give 0."""
    fresh, stale = run.result().metrics[:2]
    assert fresh[STALENESS] == 0 and stale[STALENESS] == 1
    assert fresh["training/rollout_probs_diff_max"] < 1e-5  # measured 1.6e-7
    assert "offpolicy/anchor_log_ratio/mean" not in fresh
    assert fresh["actor/ppo_kl"] == 0.0 and fresh["actor/pg_clipfrac"] == 0.0
    gap = stale["offpolicy/anchor_log_ratio/mean"]
    assert gap != 0
    assert stale["actor/ppo_kl"] == pytest.approx(-gap, rel=0.05), (stale["actor/ppo_kl"], gap)
    assert stale["actor/pg_clipfrac"] > 0
