"""Real verl ``TrainingWorker`` updates (FSDP2 engine, tiny local model, CPU) of REC's masks and M2PO's mask.

The worker is built as ``ActorRolloutRefWorker`` builds its actor and trains through verl's
``ppo_loss`` with our registered loss (``tests.scenario_losses.offpolicy_loss_updates``, in a fresh
CPU process with a timeout). A batch that the REC two-side mask removes entirely must leave the weights
unchanged; one-side keeps the negatives only.
"""

import pytest

from tests.cpu_harness import isolated

# ρ = e^1 on every token: outside 1 + ε_high for the positive samples and above 1 − ε_low for the
# negative ones, so one-side keeps only the negatives.
MASKED = [
    {
        "name": "rec_oneside_stale",
        "loss_mode": "rec",
        "overrides": ["+actor_rollout_ref.actor.policy_loss.clip_mode=one-side"],
        "old_log_prob_shift": 1.0,
    },
    {
        "name": "rec_twoside_stale",
        "loss_mode": "rec",
        "overrides": ["+actor_rollout_ref.actor.policy_loss.clip_mode=two-side"],
        "old_log_prob_shift": 1.0,
    },
]


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_rec_masks_stale_tokens_on_a_real_fsdp2_actor(tmp_path):
    """(Every loss moving the actor on-policy: tests/algorithms/test_conformance.py.)"""
    report = isolated("tests.scenario_losses:offpolicy_loss_updates", timeout=900, workdir=str(tmp_path), cases=MASKED)
    # two-side masks every token (ρ = e > 1.2): no gradient, the weights do not move
    two = report["rec_twoside_stale"]
    assert two["max_abs_change"] == 0.0 and two["metrics"]["actor/pg_clipfrac"] == 1.0
    # one-side masks the positive samples only: what moves is the negatives being pushed down
    one = report["rec_oneside_stale"]
    assert one["metrics"]["actor/pg_clipfrac"] == 0.5
    assert one["bad_after"] < one["bad_before"]
    assert one["max_abs_change"] > 0


@pytest.mark.slow
@pytest.mark.timeout(960)
def test_m2po_mask_is_the_same_for_one_or_four_micro_batches_on_a_real_fsdp2_actor(tmp_path):
    """M2PO's mask is chosen over the whole mini-batch (the engine pre-pass of glue/algorithms/m2po.py).

    Batch of tests.scenario_losses.M2PO_SHIFTS, default (trust-region) pool: over the mini-batch exactly the
    2 harmful extreme tokens of 24 go (pg_clipfrac 2/24, the mean of the micro-batches' 2/6, 0, 0, 0), and the
    non-harmful token with the largest (log ρ)² stays; a mask chosen per micro-batch would also drop the
    moderate token (3/6 in the first micro-batch: 0.125), the pool "all" would drop the non-harmful one too
    (3/24). The updated weights agree.
    """
    from tests.scenario_losses import M2PO_MASKED_TOKENS

    report = isolated(
        "tests.scenario_losses:m2po_micro_batch_updates", timeout=900, workdir=str(tmp_path), micro_batch_sizes=[8, 2]
    )
    one, four = report["8"], report["2"]
    assert one["max_abs_change"] > 1e-4
    for r in (one, four):
        assert r["metrics"]["actor/pg_clipfrac"] == pytest.approx(M2PO_MASKED_TOKENS / 24, abs=1e-6), r
    # Adam's first step moves every weight by about lr·sign(g), so float-accumulation differences of the
    # 4 micro-batch sums show only on weights with a near-zero gradient: measured 1.6e-5 against a 1e-2 move
    assert four["max_abs_diff_from_first"] < 1e-2 * one["max_abs_change"], (one, four)
