"""Off-policy health (docs/scheduler.md, "What it logs"; docs/algorithms.md, "Policy losses"): verl's
``rollout_corr/*`` statistics between the ratio anchor and the proximal policy under
``offpolicy/anchor_corr/``, and each loss's fraction of tokens clipped, masked or truncated.

Every expected value is derived by hand in the comments (powers of 2, so the arithmetic is exact); none is
produced by the function under test. The end-to-end check that a real run logs the statistics on stale steps
only is ``tests/scheduler/test_scheduler_e2e.py`` (``test_grpo_clips_against_the_behaviour_policy_on_stale_steps``,
``test_behaviour_anchor_makes_rec_clip_on_stale_steps``).
"""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from tests.loss_helpers import FRACTIONS, call, nested
from verl_offpolicy.glue.scheduler.metrics import anchor_corr_metrics, engine_mismatch_metrics, engine_mismatch_pair
from verl_offpolicy.tabular import actor

LN2 = math.log(2.0)
PREFIX = "offpolicy/anchor_corr/"


def _stale_batch():
    """The trainer's nested batch, padded as the trainer pads it (TensorDict.to_padded_tensor).

    Two responses of 2 and 3 tokens, the third token of the second masked with garbage there (anchor −inf,
    proximal NaN). The anchor gives every response token probability 1/8; the proximal policy 1/8, 1/4
    (response 0) and 1/8, 1/2 (response 1): ρ_t = π_proximal/π_anchor = [1, 2] and [1, 4].
    """
    anchor = nested([torch.full((2,), math.log(0.125)), torch.tensor([math.log(0.125), math.log(0.125), -math.inf])])
    proximal = nested(
        [torch.tensor([math.log(0.125), math.log(0.25)]), torch.tensor([math.log(0.125), math.log(0.5), math.nan])]
    )
    mask = nested([torch.tensor([1, 1]), torch.tensor([1, 1, 0])])
    padded = TensorDict(
        {"old_log_probs": proximal, "behaviour_log_probs": anchor, "response_mask": mask}, batch_size=2
    ).to_padded_tensor()
    return padded["old_log_probs"], padded["behaviour_log_probs"], padded["response_mask"]


# By hand, ρ = [1, 2 | 1, 4], log ρ = [0, ln2 | 0, 2·ln2] over the 4 response tokens:
#   ⟨ρ⟩ = 8/4 = 2, ⟨ρ²⟩ = (1 + 4 + 1 + 16)/4 = 5.5, ⟨log ρ⟩ = 3·ln2/4
#   ESS = ⟨ρ⟩²/⟨ρ²⟩ = 4/5.5 = 8/11; std = √(5.5 − 4) = √1.5
#   kl = ⟨log π_anchor − log π_proximal⟩ = −3·ln2/4; k3 = ⟨ρ − log ρ − 1⟩ = (0 + (1 − ln2) + 0 + (3 − 2·ln2))/4
#   chi2_token = 5.5 − 1; chi2_seq = mean(2², 4²) − 1 = 9 (sequence ratios ∏ρ = 2 and 4)
#   per-sequence means ρ̄ = 1.5, 2.5: seq_mean 2, seq_std (unbiased) √(0.5² + 0.5²) = √0.5, max 2.5, min 1.5,
#   seq_max_deviation max(|1.5 − 1|, |2.5 − 1|) = 1.5
#   anchor log-ppl 3·ln2 per sequence (ppl 8); proximal mean log-probs −2.5·ln2 and −2·ln2: log-ppl mean 2.25·ln2,
#   ppl mean (2^2.5 + 2²)/2; log_ppl_diff = ⟨log π_anchor⟩ − ⟨log π_proximal⟩ = −0.5·ln2, −ln2 per sequence
HAND = {
    "kl": -3 * LN2 / 4,
    "k3_kl": ((1 - LN2) + (3 - 2 * LN2)) / 4,
    "chi2_token": 4.5,
    "chi2_seq": 9.0,
    "training_ppl": (2**2.5 + 4) / 2,
    "training_log_ppl": 2.25 * LN2,
    "rollout_ppl": 8.0,
    "rollout_log_ppl": 3 * LN2,
    "log_ppl_diff": -0.75 * LN2,
    "log_ppl_abs_diff": 0.75 * LN2,
    "log_ppl_diff_max": -0.5 * LN2,
    "log_ppl_diff_min": -LN2,
    "ppl_ratio": (2**-0.5 + 0.5) / 2,
    "rollout_is_eff_sample_size": 8 / 11,
    "rollout_is_mean": 2.0,
    "rollout_is_std": math.sqrt(1.5),
    "rollout_is_max": 4.0,
    "rollout_is_min": 1.0,
    "rollout_is_seq_mean": 2.0,
    "rollout_is_seq_std": math.sqrt(0.5),
    "rollout_is_seq_max": 2.5,
    "rollout_is_seq_min": 1.5,
    "rollout_is_seq_max_deviation": 1.5,
}


def test_anchor_corr_statistics_are_the_hand_derived_values():
    stats = anchor_corr_metrics(*_stale_batch())
    assert set(stats) == {PREFIX + key for key in HAND}
    for key, value in HAND.items():
        assert stats[PREFIX + key] == pytest.approx(value, rel=1e-6), key
        assert type(stats[PREFIX + key]) is float


def test_anchor_corr_ess_of_equal_weights_is_one_and_of_one_dominant_token_is_small():
    # ρ = [1, 1, 1, 1]: ESS = 1, KL 0, χ² 0. ρ = [e^10, 1, 1, 1] (π_proximal/π_anchor): ESS = (e^10 + 3)²/(4·(e^20 + 3))
    # ≈ 1/4: one token carries the batch.
    anchor = torch.full((1, 4), -2.0)
    same = anchor_corr_metrics(anchor.clone(), anchor, torch.ones(1, 4))
    assert same[PREFIX + "rollout_is_eff_sample_size"] == pytest.approx(1.0)
    assert same[PREFIX + "kl"] == 0.0 and same[PREFIX + "chi2_token"] == pytest.approx(0.0, abs=1e-6)
    proximal = anchor + torch.tensor([[10.0, 0.0, 0.0, 0.0]])
    skewed = anchor_corr_metrics(proximal, anchor, torch.ones(1, 4))
    e10 = math.exp(10.0)
    assert skewed[PREFIX + "rollout_is_eff_sample_size"] == pytest.approx((e10 + 3) ** 2 / (4 * (e10**2 + 3)), rel=1e-5)


def test_anchor_corr_is_finite_for_a_finite_anchor_far_from_the_proximal_policy():
    """verl exponentiates raw log-quantities (k3_kl, the perplexities, ppl_ratio: inf here); every exponent is
    capped at ±20 (verl's SAFETY_BOUND), the log-space statistics stay exact. By hand, proximal [−1, −2],
    anchor [−1e4, −1]: log ρ = [9999, −1], capped [20, −1]; k3 = (e²⁰ − 21 + e⁻¹ + 1 − 1)/2; the anchor's mean
    log-prob −5000.5, the proximal's −1.5."""
    stats = anchor_corr_metrics(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1e4, -1.0]]), torch.ones(1, 2))
    assert all(math.isfinite(v) for v in stats.values()), {k: v for k, v in stats.items() if not math.isfinite(v)}
    assert stats[PREFIX + "k3_kl"] == pytest.approx((math.exp(20) - 21 + math.exp(-1)) / 2, rel=1e-9)
    assert stats[PREFIX + "rollout_ppl"] == pytest.approx(math.exp(20), rel=1e-9)
    assert stats[PREFIX + "training_ppl"] == pytest.approx(math.exp(1.5), rel=1e-6)
    assert stats[PREFIX + "ppl_ratio"] == pytest.approx(math.exp(-20), rel=1e-9)
    assert stats[PREFIX + "kl"] == pytest.approx(-4999.0) and stats[PREFIX + "rollout_log_ppl"] == pytest.approx(5000.5)


def test_anchor_corr_of_a_batch_without_response_tokens_is_empty():
    assert anchor_corr_metrics(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3)) == {}


# ---------------------------------------------------------------- the engines' mismatch, by hand


def test_engine_mismatch_is_the_same_statistics_of_the_trainer_against_the_rollout():
    """π_trainer (at the generating weights) in the proximal's place, π_rollout in the anchor's: the batch above
    read as trainer 1/8, 1/4 | 1/8, 1/2 and rollout 1/8 everywhere gives the hand-derived values of HAND."""
    trainer, rollout, mask = _stale_batch()
    stats = engine_mismatch_metrics(trainer, rollout, mask)
    assert set(stats) == {"offpolicy/engine_mismatch/" + key for key in HAND}
    for key, value in HAND.items():
        assert stats["offpolicy/engine_mismatch/" + key] == pytest.approx(value, rel=1e-6), key
    assert engine_mismatch_metrics(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3)) == {}


@pytest.mark.parametrize(
    "staleness, behaviour_stored, rollout_log_probs, bypass, pair",
    [
        (0, False, True, False, "proximal"),  # fresh: the proximal weights generated the batch
        (3, True, True, False, "behaviour"),  # stale under the behaviour anchor: its stored log-probs
        (3, False, True, False, None),  # stale under proximal/rollout: no trainer log-probs at the generating weights
        (0, False, False, False, None),  # calculate_log_probs=false: no rollout log-probs
        (0, False, True, True, None),  # bypass: old_log_probs are the rollout's own
    ],
)
def test_engine_mismatch_compares_the_trainer_at_the_generating_weights(
    staleness, behaviour_stored, rollout_log_probs, bypass, pair
):
    assert engine_mismatch_pair(staleness, behaviour_stored, rollout_log_probs, bypass) == pair


@pytest.mark.parametrize(
    "staleness, behaviour_stored, field", [(0, False, "old_log_probs"), (2, True, "behaviour_log_probs")]
)
def test_the_trainer_logs_the_mismatch_from_the_stored_log_probs(monkeypatch, staleness, behaviour_stored, field):
    """The trainer's hook reads the generating weights' log-probs (proximal on a fresh step, behaviour on a stale one)
    and the rollout's for the batch's real rows, from TransferQueue, and logs the hand-derived values of HAND."""
    from types import MethodType, SimpleNamespace

    from omegaconf import OmegaConf

    from verl_offpolicy.glue.scheduler import trainer as trainer_module

    anchor = nested([torch.full((2,), math.log(0.125)), torch.tensor([math.log(0.125), math.log(0.125), -math.inf])])
    generating = nested(
        [torch.tensor([math.log(0.125), math.log(0.25)]), torch.tensor([math.log(0.125), math.log(0.5), math.nan])]
    )
    mask = nested([torch.tensor([1, 1]), torch.tensor([1, 1, 0])])
    stored = {field: generating, "rollout_log_probs": anchor, "response_mask": mask}
    reads = []

    def read(keys, fields, partition):
        reads.append((list(keys), list(fields), partition))
        return TensorDict({f: stored[f] for f in fields}, batch_size=len(keys))

    monkeypatch.setattr(trainer_module.store, "read", read)
    fake = SimpleNamespace(
        config=OmegaConf.create(
            {"algorithm": {"rollout_correction": None}, "actor_rollout_ref": {"rollout": {"calculate_log_probs": True}}}
        ),
        schedule=SimpleNamespace(staleness=lambda step: staleness),
        global_steps=5,
        replay_buffer=SimpleNamespace(current=SimpleNamespace(behaviour=behaviour_stored)),
    )
    fake._engine_mismatch_pair = MethodType(trainer_module.OffPolicyTrainer._engine_mismatch_pair, fake)
    batch = SimpleNamespace(keys=["a", "b", "pad"], tags=[{}, {}, {"is_padding": True}], partition_id="train")
    metrics = {}
    trainer_module.OffPolicyTrainer._log_engine_mismatch(fake, batch, metrics)
    assert reads == [(["a", "b"], [field, "rollout_log_probs", "response_mask"], "train")]
    assert metrics["offpolicy/engine_mismatch/kl"] == pytest.approx(HAND["kl"], rel=1e-6)
    assert metrics["offpolicy/engine_mismatch/chi2_seq"] == pytest.approx(HAND["chi2_seq"], rel=1e-6)
    # without the rollout's log-probs nothing is read or logged
    fake.config.actor_rollout_ref.rollout.calculate_log_probs = False
    reads.clear(), metrics.clear()
    trainer_module.OffPolicyTrainer._log_engine_mismatch(fake, batch, metrics)
    assert reads == [] and metrics == {}


# ---------------------------------------------------------------- each loss's fraction, by hand


def test_rec_clipped_fraction_counts_the_masked_tokens():
    # one-side, ε = 0.2/0.2. Response 0, A = +1, ρ = [1.5, 1.1] + a padded token (old −inf): 1.5 > 1.2 masked.
    # Response 1, A = −1, ρ = [0.7, 0.9, 1.3]: 0.7 < 0.8 masked (A ≤ 0 has no upper edge). 2 of 5 tokens.
    old = torch.tensor([[-1.0, -1.0, -math.inf], [-1.0, -1.0, -1.0]], dtype=torch.float64)
    rho = torch.tensor([[1.5, 1.1, 1.0], [0.7, 0.9, 1.3]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = torch.tensor([[1.0], [-1.0]], dtype=torch.float64).expand(2, 3) * mask
    _, _, metrics = call(actor("rec", clip_mode="one-side"), old, torch.where(mask, old, -1.0) + rho.log(), adv, mask)
    assert metrics[FRACTIONS["rec"]] == pytest.approx(2 / 5)


def test_m2po_masked_fraction_counts_the_removed_pool_tokens():
    # trust_region pool, τ_M2 = 0.04, A = +1. Response 0: log ρ = [0.1, 0.3, −0.5, 0.05, 0.4]; the pool is ρ > 1:
    # 0.1, 0.3, 0.05, 0.4 with squares 0.01, 0.09, 0.0025, 0.16 (mean 0.065625 > 0.04). Ascending prefix means
    # 0.0025, 0.00625, 0.034167, 0.065625: keep 3, remove the 0.4. Response 1: one token at ρ = 1 (not in the
    # pool) and 4 padded. 1 masked of 6 response tokens.
    log_ratio = torch.tensor([[0.1, 0.3, -0.5, 0.05, 0.4], [0.0, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True] * 5, [True, False, False, False, False]])
    old = torch.full((2, 5), -1.0, dtype=torch.float64)
    adv = torch.ones(2, 5, dtype=torch.float64) * mask
    _, _, metrics = call(actor("m2po"), old, old + log_ratio, adv, mask)
    assert metrics[FRACTIONS["m2po"]] == pytest.approx(1 / 6)


def test_topr_truncated_fraction_counts_the_tapered_tokens():
    # Response 0: A = −1, Δ = −0.2 + 0.1 = −0.1 < 0: w = e^−0.1 < 1, its 2 tokens truncated.
    # Response 1: A = −1, Δ = 0.3 (one token, one padded): w = 1. Response 2: A = +1, Δ = −2: w = 1 (A ≥ 0).
    # 2 of 5 response tokens.
    old = torch.full((3, 2), -1.0, dtype=torch.float64)
    log_ratio = torch.tensor([[-0.2, 0.1], [0.3, 0.0], [-1.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False], [True, True]])
    adv = torch.tensor([[-1.0], [-1.0], [1.0]], dtype=torch.float64).expand(3, 2) * mask
    _, _, metrics = call(actor("topr"), old, old + log_ratio, adv, mask)
    assert metrics[FRACTIONS["topr"]] == pytest.approx(2 / 5)


def test_losses_without_a_mask_log_no_fraction():
    old = torch.zeros(1, 2, dtype=torch.float64)
    _, _, metrics = call(
        actor("opmd"), old, old + 0.5, torch.ones(1, 2, dtype=torch.float64), torch.ones(1, 2, dtype=torch.bool)
    )
    assert not any(key.startswith("actor/offpolicy/") for key in metrics)
