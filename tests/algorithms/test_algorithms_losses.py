"""Policy losses of docs/algorithms.md, through verl's registry (``get_policy_loss_fn``).

Hand-derived values in the comments; gradients dL/dlog_prob from autograd are compared with the
closed forms of the spec.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the verl.plugins entry point: registers our names)
from verl.workers.config import ActorConfig, PolicyLossConfig

from tests.loss_helpers import call
from verl_offpolicy.glue.config import OffPolicyLossConfig
from verl_offpolicy.tabular import actor

F64 = torch.float64
RHO = [0.5, 0.79, 0.8, 1.0, 1.2, 1.21, 2.9, 3.0, 3.1]


# ---------------------------------------------------------------- opmd


@pytest.mark.parametrize("tau", [0.0, 1.0, 3.0])
def test_opmd_value_and_gradient(tau):
    # log π = [ln ½, ln ¼], A = 2 on both tokens: ℓ = −2·[−ln 2, −2 ln 2]/(1+τ) = [2 ln 2, 4 ln 2]/(1+τ)
    # token-mean = 3 ln 2/(1+τ); ∂/∂log π_t = −A/(1+τ)/2 = −1/(1+τ)
    log_prob = torch.tensor([[math.log(0.5), math.log(0.25)]], dtype=F64)
    adv = torch.full((1, 2), 2.0, dtype=F64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, grad, _ = call(actor("opmd", tau=tau), log_prob, log_prob, adv, mask, "token-mean")
    torch.testing.assert_close(loss, torch.tensor(3 * math.log(2) / (1 + tau), dtype=F64))
    torch.testing.assert_close(grad, torch.full((1, 2), -1 / (1 + tau), dtype=F64))


# ---------------------------------------------------------------- pmd


def test_pmd_value_and_gradient():
    # τ = 0.1. seq 0: |y| = 2, A = 0.3, log π − log π_old = [0.2, 0.1] → Δ = 0.3
    #   L_0 = ½·0.1·(0.3/0.1 − 0.3)²/2 = 0.05·2.7²/2 = 0.18225
    # seq 1: |y| = 1 (second token padded), A = −0.1, Δ = −0.5
    #   L_1 = 0.05·(−1 + 0.5)²/1 = 0.0125
    # loss = mean over the 2 sequences = 0.097375 (whatever loss_agg_mode says)
    # ∂loss/∂log π_{i,t} = −(A_i − τΔ_i)·m_t/|y_i|/2: seq 0: −(0.3 − 0.03)/4 = −0.0675; seq 1: −(−0.1 + 0.05)/2 = 0.025
    old = torch.tensor([[-1.0, -2.0], [-1.0, 0.0]], dtype=F64)
    log_prob = old + torch.tensor([[0.2, 0.1], [-0.5, 7.0]], dtype=F64)
    adv = torch.tensor([[0.3, 0.3], [-0.1, 0.0]], dtype=F64)
    mask = torch.tensor([[True, True], [True, False]])
    for agg in ("seq-mean-token-mean", "token-mean"):
        loss, grad, _ = call(actor("pmd", tau=0.1), old, log_prob, adv, mask, agg)
        torch.testing.assert_close(loss, torch.tensor(0.097375, dtype=F64))
        torch.testing.assert_close(grad, torch.tensor([[-0.0675, -0.0675], [0.025, 0.0]], dtype=F64))


def test_pmd_gradient_random_batch():
    # ∂/∂log π_{i,t} = −(A_i − τΔ_i)·m_t/(|y_i|·N) for random ragged batches
    g = torch.Generator().manual_seed(0)
    b, t, tau = 6, 5, 0.05
    old = -torch.rand(b, t, generator=g, dtype=F64) * 3
    log_prob = old + 0.3 * torch.randn(b, t, generator=g, dtype=F64)
    mask = torch.arange(t) < torch.tensor([5, 1, 3, 4, 2, 5]).unsqueeze(-1)
    adv = torch.randn(b, 1, generator=g, dtype=F64) * mask
    _, grad, _ = call(actor("pmd", tau=tau), old, log_prob, adv, mask)
    length = mask.sum(-1, keepdim=True).to(F64)
    delta = ((log_prob - old) * mask).sum(-1, keepdim=True)
    seq_adv = adv.sum(-1, keepdim=True) / length
    torch.testing.assert_close(grad, -(seq_adv - tau * delta) * mask / (length * b))


# ---------------------------------------------------------------- rec: masks (truth table of the spec)

TRUTH = {
    "one-side": ([1, 1, 1, 1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 1, 1, 1, 1, 1]),
    "two-side": ([0, 0, 1, 1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 1, 0, 0, 0, 0]),
    "ring": ([0, 0, 1, 1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 1, 0, 0, 1, 1]),
    "gspo-one-side": ([1, 1, 1, 1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 1, 1, 1, 1, 1]),  # T = 1: ρ̄ = ρ
    "none": ([1] * 9, [1] * 9),
}


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("mode", list(TRUTH))
def test_rec_truth_table(mode, dtype):
    # one token per sequence, ρ from the spec's table, ε = 0.2/0.2, ε′ = 0.6/2.0; with weight none and
    # token-sum aggregation, ∂ℓ/∂log π = −M·A, so the gradient reads the mask M.
    config = actor("rec", clip_mode=mode, ring_clip_ratio_low=0.6, ring_clip_ratio_high=2.0)
    old = torch.zeros(9, 1, dtype=dtype)
    log_prob = torch.log(torch.tensor(RHO, dtype=dtype)).unsqueeze(-1)
    mask = torch.ones(9, 1, dtype=torch.bool)
    for sign, row in zip((1.0, -1.0), TRUTH[mode], strict=True):
        _, grad, metrics = call(config, old, log_prob, torch.full((9, 1), sign, dtype=dtype), mask)
        assert (grad[:, 0] == -sign).long().tolist() == row
        kept = torch.tensor(row, dtype=torch.bool)
        rho = torch.tensor(RHO)
        assert metrics["actor/pg_clipfrac"] == pytest.approx((~kept).float().mean().item())
        assert metrics["actor/pg_clipfrac_upper"] == pytest.approx((~kept & (rho > 1)).float().mean().item())
        assert metrics["actor/pg_clipfrac_lower"] == pytest.approx((~kept & (rho < 1)).float().mean().item())
        assert metrics["actor/ratio_mean"] == pytest.approx(sum(RHO) / 9, rel=1e-6)
        assert metrics["actor/ratio_max"] == pytest.approx(3.1, rel=1e-6)
        assert metrics["actor/ppo_kl"] == pytest.approx(-sum(math.log(x) for x in RHO) / 9, rel=1e-5)


def test_ring_rescues_far_positive_tokens():
    # ρ = 0.3 ≤ 1 − ε′_low = 0.4 with A > 0: ring keeps it, one-side keeps it, two-side masks it
    old, log_prob = torch.zeros(1, 1), torch.log(torch.tensor([[0.3]]))
    adv, mask = torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool)
    kept = {}
    for mode in ("ring", "one-side", "two-side"):
        _, grad, _ = call(actor("rec", clip_mode=mode), old, log_prob, adv, mask)
        kept[mode] = grad.item() == -1.0
    assert kept == {"ring": True, "one-side": True, "two-side": False}


def test_gspo_one_side_uses_the_length_normalised_sequence_ratio():
    # 2 tokens with ρ_t = [e^{0.4}, e^{−0.2}] (ρ_0 > 1.2 alone), ρ̄ = exp(0.2/2) = e^{0.1} ≈ 1.105 ≤ 1.2:
    # gspo-one-side keeps both tokens of the A > 0 sequence; token-level one-side masks the first one.
    old = torch.zeros(1, 2, dtype=F64)
    log_prob = torch.tensor([[0.4, -0.2]], dtype=F64)
    adv, mask = torch.ones(1, 2, dtype=F64), torch.ones(1, 2, dtype=torch.bool)
    _, grad, _ = call(actor("rec", clip_mode="gspo-one-side"), old, log_prob, adv, mask)
    assert grad.tolist() == [[-1.0, -1.0]]
    _, grad, _ = call(actor("rec", clip_mode="one-side"), old, log_prob, adv, mask)
    assert grad.tolist() == [[0.0, -1.0]]
    # with ε_high = 0.1: ρ̄ ≈ 1.105 > 1.1 → the whole sequence is masked (counted as above the band)
    _, grad, metrics = call(actor("rec", clip=(0.1, 0.1), clip_mode="gspo-one-side"), old, log_prob, adv, mask)
    assert grad.tolist() == [[0.0, 0.0]]
    assert metrics["actor/pg_clipfrac_upper"] == 1.0 and metrics["actor/pg_clipfrac_lower"] == 0.0


# ---------------------------------------------------------------- rec: weights, regularisers, gradients


def _random_batch(seed=0, b=5, t=4):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=F64) * 2
    log_prob = old + 0.4 * torch.randn(b, t, generator=g, dtype=F64)
    mask = torch.arange(t) < torch.tensor([4, 2, 0, 3, 1]).unsqueeze(-1)  # row 2: all-zero mask
    adv = torch.randn(b, 1, generator=g, dtype=F64) * mask
    return old, log_prob, adv, mask


@pytest.mark.parametrize("weight", ["none", "importance_sampling", "gspo_importance_sampling"])
@pytest.mark.parametrize("regularizer", ["none", "forward-kl", "k2"])
@pytest.mark.parametrize("clip_mode", ["none", "one-side", "two-side", "ring", "gspo-one-side"])
def test_rec_gradient_matches_closed_form(weight, regularizer, clip_mode):
    # ∂ℓ/∂log π_t = −M_t·w_t·A + ∂reg_t, reg' = −c (forward-kl) or 2c·(log π − log π_old) (k2); token-sum
    old, log_prob, adv, mask = _random_batch()
    c = 0.3
    config = actor("rec", clip_mode=clip_mode, weight=weight, regularizer=regularizer, regularizer_coef=c)
    loss, grad, _ = call(config, old, log_prob, adv, mask)

    log_ratio = (log_prob - old) * mask
    rho = torch.exp(log_ratio)
    length = mask.sum(-1, keepdim=True).clamp_min(1)
    rho_seq = torch.exp(log_ratio.sum(-1, keepdim=True) / length).expand_as(rho)
    band = rho_seq if clip_mode == "gspo-one-side" else rho
    pos, neg = adv >= 0, adv <= 0
    keep = {
        "none": torch.ones_like(mask),
        "one-side": (pos & (band <= 1.2)) | (neg & (band >= 0.8)),
        "gspo-one-side": (pos & (band <= 1.2)) | (neg & (band >= 0.8)),
        "two-side": (band >= 0.8) & (band <= 1.2),
        "ring": ((band >= 0.8) & (band <= 1.2)) | (pos & (band <= 0.4)) | (neg & (band >= 3.0)),
    }[clip_mode]
    w = {"none": torch.ones_like(rho), "importance_sampling": rho, "gspo_importance_sampling": rho_seq}[weight]
    reg_grad = {"none": 0.0, "forward-kl": -c, "k2": 2 * c * (log_prob - old)}[regularizer]
    expected = (-(keep * w * adv) + reg_grad) * mask
    torch.testing.assert_close(grad, expected)
    # value: Σ_t m·(−M·w·A·log π + reg)
    reg = {"none": 0.0, "forward-kl": -c * log_prob, "k2": c * (log_prob - old) ** 2}[regularizer]
    torch.testing.assert_close(loss, ((-(keep * w * adv) * log_prob + reg) * mask).sum())


def test_rollout_is_weights_multiply_the_per_token_loss():
    old, log_prob, adv, mask = _random_batch(seed=1)
    weights = torch.rand(old.shape, generator=torch.Generator().manual_seed(2), dtype=F64) + 0.5
    for config in (actor("rec", regularizer="k2", regularizer_coef=0.1), actor("opmd", tau=0.5)):
        plain_loss, plain_grad, _ = call(config, old, log_prob, adv, mask)
        loss, grad, _ = call(config, old, log_prob, adv, mask, weights=weights)
        # token-sum of w_t·ℓ_t: the gradient of every token is scaled by its own weight
        torch.testing.assert_close(grad, plain_grad * weights)
        assert not torch.allclose(loss, plain_loss)


# ---------------------------------------------------------------- robustness, aggregation, errors


@pytest.mark.parametrize("loss_mode", ["opmd", "pmd", "rec"])
def test_plain_verl_policy_loss_config_is_a_clear_error(loss_mode):
    config = ActorConfig(
        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=PolicyLossConfig(loss_mode=loss_mode)
    )
    with pytest.raises(TypeError, match=r"policy_loss._target_=verl_offpolicy.glue.config.OffPolicyLossConfig"):
        call(config, torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool))


def test_clip_ratio_falls_back_to_clip_ratio():
    # clip_ratio_low/high = None → ε = clip_ratio = 0.5: ρ = 1.3 with A > 0 stays inside one-side (1.3 ≤ 1.5)
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=0.5,
        clip_ratio_low=None,
        clip_ratio_high=None,
        policy_loss=OffPolicyLossConfig(loss_mode="rec", clip_mode="one-side"),
    )
    mask = torch.ones(1, 1, dtype=torch.bool)
    _, grad, _ = call(config, torch.zeros(1, 1), torch.log(torch.tensor([[1.3]])), torch.ones(1, 1), mask)
    assert grad.item() == -1.0


# ---------------------------------------------------------------- rec k2_seq (sequence-level k2)


def test_rec_sequence_level_k2_value_and_gradient():
    # A = 0, so only the regulariser: c = 0.1, token-sum aggregation.
    # response 1: log π = [ln ½, ln ¼, ln ½], old = [ln ¼, ln ¼, ln ½], all 3 tokens: Δ = ln 2, |y| = 3
    #   c·Δ²/|y| = 0.1·(ln 2)²/3; ∂/∂log π_t = 2c·Δ/|y| = 0.2·ln 2/3 on each token
    # response 2: log π = [−1, −2, pad], old = [−1.5, −1, pad], 2 tokens: Δ = 0.5 − 1 = −0.5, |y| = 2
    #   c·Δ²/|y| = 0.1·0.25/2 = 0.0125; ∂/∂log π_t = 2·0.1·(−0.5)/2 = −0.05 (0 on the padding)
    log_prob = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.5)], [-1.0, -2.0, 0.0]], dtype=F64)
    old = torch.tensor([[math.log(0.25), math.log(0.25), math.log(0.5)], [-1.5, -1.0, -7.0]], dtype=F64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    adv = torch.zeros(2, 3, dtype=F64)
    config = actor("rec", regularizer="k2_seq", regularizer_coef=0.1)
    loss, grad, _ = call(config, old, log_prob, adv, mask, "token-sum")
    torch.testing.assert_close(loss, torch.tensor(0.1 * math.log(2) ** 2 / 3 + 0.0125, dtype=F64))
    expected = torch.tensor([[0.2 * math.log(2) / 3] * 3, [-0.05, -0.05, 0.0]], dtype=F64)
    torch.testing.assert_close(grad, expected)
    # token-level k2 on the same data: c·Σ_t (log π_t − log π_old,t)² = 0.1·(ln 2)² + 0.1·(0.25 + 1)
    token_loss, token_grad, _ = call(
        actor("rec", regularizer="k2", regularizer_coef=0.1), old, log_prob, adv, mask, "token-sum"
    )
    torch.testing.assert_close(token_loss, torch.tensor(0.1 * math.log(2) ** 2 + 0.125, dtype=F64))
    torch.testing.assert_close(token_grad, torch.tensor([[0.2 * math.log(2), 0.0, 0.0], [0.1, -0.2, 0.0]], dtype=F64))


# ---------------------------------------------------------------- topr (Le Roux et al., arXiv 2503.14286)


def test_topr_weights_negative_samples_by_the_truncated_sequence_ratio():
    # seq 0: A = +1, Δ = 0.5 + 0.5 = 1 (ρ_seq = e > 1): w = 1 (no IS on A ≥ 0)
    # seq 1: A = −1, Δ = −0.4 − 0.6 = −1: w = min(1, e^−1) = e^−1
    # seq 2: A = −1, Δ = +0.3 (one token, second padded): w = min(1, e^0.3) = 1
    # token-sum: ℓ = −Σ w·A·log π; ∂ℓ/∂log π_t = −w_i·A_i on response tokens
    old = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-2.0, 0.0]], dtype=F64)
    log_prob = old + torch.tensor([[0.5, 0.5], [-0.4, -0.6], [0.3, 9.0]], dtype=F64)
    mask = torch.tensor([[True, True], [True, True], [True, False]])
    adv = torch.tensor([[1.0], [-1.0], [-1.0]], dtype=F64).expand(3, 2) * mask
    loss, grad, metrics = call(actor("topr"), old, log_prob, adv, mask, "token-sum")
    w1 = math.exp(-1.0)
    expected_grad = torch.tensor([[-1.0, -1.0], [w1, w1], [1.0, 0.0]], dtype=F64)
    torch.testing.assert_close(grad, expected_grad)
    expected_loss = -(-0.5 - 0.5) + w1 * (-1.4 - 1.6) + (-1.7)  # Σ −w·A·log π
    torch.testing.assert_close(loss, torch.tensor(expected_loss, dtype=F64))
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 5)  # seq 1's two tokens are tapered


def test_topr_sequence_ratio_is_the_unnormalised_product():
    # Δ = 3 tokens × (−0.5) = −1.5 (not the per-token mean −0.5): w = e^−1.5
    old = torch.zeros(1, 3, dtype=F64)
    log_prob = torch.full((1, 3), -0.5, dtype=F64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    _, grad, _ = call(actor("topr"), old, log_prob, torch.full((1, 3), -2.0, dtype=F64), mask, "token-sum")
    torch.testing.assert_close(grad, torch.full((1, 3), 2.0 * math.exp(-1.5), dtype=F64))


# ---------------------------------------------------------------- m2po (Zheng, Zhao, Chen, arXiv 2510.01161)


def test_m2po_all_pool_masks_the_largest_squared_log_ratios_until_the_mean_fits():
    # pool "all": log ρ = [0.1, −0.1, 0.05, 1, −2] → (log ρ)² = [0.01, 0.01, 0.0025, 1, 4], mean 1.0045 > 0.04.
    # ascending 0.0025, 0.01, 0.01, 1, 4: prefix means 0.0025, 0.00625, 0.0075, 0.2556, 1.0045 → keep 3,
    # drop the 1 and the 4. Kept: ∂ℓ/∂log π_t = −ρ_t·A (token-sum, A = 1), ρ = e^{log ρ}; dropped: 0.
    old = torch.zeros(1, 5, dtype=F64)
    log_ratio = torch.tensor([[0.1, -0.1, 0.05, 1.0, -2.0]], dtype=F64)
    mask = torch.ones(1, 5, dtype=torch.bool)
    adv = torch.ones(1, 5, dtype=F64)
    loss, grad, metrics = call(actor("m2po", m2po_token_pool="all"), old, old + log_ratio, adv, mask, "token-sum")
    expected = torch.tensor([[-math.exp(0.1), -math.exp(-0.1), -math.exp(0.05), 0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(grad, expected)
    torch.testing.assert_close(
        loss, torch.tensor(-(math.exp(0.1) * 0.1 - math.exp(-0.1) * 0.1 + math.exp(0.05) * 0.05), dtype=F64)
    )
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.4)
    assert metrics["actor/pg_clipfrac_upper"] == pytest.approx(0.2)  # ρ = e dropped above, e^−2 below


# Two responses, the pools differ: row 0 has A = +1 and log ρ = [0.1, 0.05, 1] (ρ > 1: every token harmful);
# row 1 has A = −1 and log ρ = [3, −0.2, −0.1]: the 3 (ρ = e³ > 1 with A < 0, its gradient pulls ρ back to 1)
# is not harmful and has the largest (log ρ)² = 9 of the batch; −0.2 and −0.1 (ρ < 1 with A < 0) are.
M2PO_POOLS_LOG_RATIO = [[0.1, 0.05, 1.0], [3.0, -0.2, -0.1]]


@pytest.mark.parametrize(
    "pool, dropped",
    [
        # trust_region: pool values (row-major) 0.01, 0.0025, 1, 0.04, 0.01, mean 0.2125 > 0.04; ascending
        # 0.0025, 0.01, 0.01, 0.04, 1 with prefix means 0.0025, 0.00625, 0.0075, 0.015625, 0.2125 → keep 4,
        # drop the 1 (row 0, token 2). The 9 is outside the pool: kept, with its full weight ρ = e³.
        ("trust_region", [(0, 2)]),
        # all: values 0.01, 0.0025, 1, 9, 0.04, 0.01; prefix means of 0.0025, 0.01, 0.01, 0.04, 1, 9 are
        # 0.0025, 0.00625, 0.0075, 0.015625, 0.2125, 1.677 → keep 4, drop the 1 and the 9.
        ("all", [(0, 2), (1, 0)]),
    ],
)
def test_m2po_token_pool_never_masks_tokens_outside_it(pool, dropped):
    # token-sum: kept tokens have ∂ℓ/∂log π_t = −ρ_t·A_i: row 0 −e^{log ρ}, row 1 +e^{log ρ}; dropped ones 0
    log_ratio = torch.tensor(M2PO_POOLS_LOG_RATIO, dtype=F64)
    old = torch.full((2, 3), -1.0, dtype=F64)
    adv = torch.tensor([[1.0], [-1.0]], dtype=F64).expand(2, 3)
    mask = torch.ones(2, 3, dtype=torch.bool)
    _, grad, metrics = call(actor("m2po", m2po_token_pool=pool), old, old + log_ratio, adv, mask, "token-sum")
    expected = -torch.exp(log_ratio) * adv
    for row, token in dropped:
        expected[row, token] = 0.0
    torch.testing.assert_close(grad, expected)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(len(dropped) / 6)


def test_m2po_default_pool_is_the_trust_region():
    assert actor("m2po").policy_loss.m2po_token_pool == "trust_region"


def test_m2po_keeps_everything_within_the_budget_and_removes_ties_one_at_a_time():
    # A = −1, ρ < 1 (all harmful): mean (log ρ)² = (0.01 + 0.04 + 0.0225)/3 = 0.0242 ≤ 0.04: nothing masked,
    # plain IS-weighted REINFORCE
    old = torch.zeros(1, 3, dtype=F64)
    within = torch.tensor([[-0.1, -0.2, -0.15]], dtype=F64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    _, grad, metrics = call(actor("m2po"), old, old + within, -torch.ones(1, 3, dtype=F64), mask, "token-sum")
    torch.testing.assert_close(grad, torch.exp(within))
    assert metrics["actor/pg_clipfrac"] == 0.0
    # A = +1, log ρ = [0.1, 0.3, 0.1, 0.3, 0.1] (all harmful): (log ρ)² = 0.01, 0.09, 0.01, 0.09, 0.01, mean
    # 0.21/5 = 0.042 > 0.04. Algorithm 1 removes the largest, one at a time: removing one 0.09 leaves
    # 0.12/4 = 0.03 ≤ 0.04, so the other 0.09 stays (removing ties together would drop both). Of the two, the
    # later token (index 3) goes first.
    ties = torch.tensor([[0.1, 0.3, 0.1, 0.3, 0.1]], dtype=F64)
    mask5 = torch.ones(1, 5, dtype=torch.bool)
    _, grad, metrics = call(
        actor("m2po"), torch.zeros(1, 5, dtype=F64), ties, torch.ones(1, 5, dtype=F64), mask5, "token-sum"
    )
    torch.testing.assert_close(
        grad, torch.tensor([[-math.exp(0.1), -math.exp(0.3), -math.exp(0.1), 0.0, -math.exp(0.1)]], dtype=F64)
    )
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.2)
    # a tie that must go whole: log ρ = [0.1, 0.3, 0.3], (log ρ)² = 0.01, 0.09, 0.09; prefix means 0.01, 0.05,
    # 0.0633 → only the 0.01 fits, both 0.09 go; with a budget of 0.3 nothing goes (mean 0.0633)
    ties = torch.tensor([[0.1, 0.3, 0.3]], dtype=F64)
    _, grad, _ = call(actor("m2po"), old, old + ties, torch.ones(1, 3, dtype=F64), mask, "token-sum")
    torch.testing.assert_close(grad, torch.tensor([[-math.exp(0.1), 0.0, 0.0]], dtype=F64))
    _, grad, _ = call(
        actor("m2po", m2po_threshold=0.3), old, old + ties, torch.ones(1, 3, dtype=F64), mask, "token-sum"
    )
    torch.testing.assert_close(grad, -torch.exp(ties))


def test_m2po_keep_is_algorithm_1_on_the_values():
    from verl_offpolicy.core.losses import m2po_keep

    # values 1, 0.01, 4, 0.0025, 0.01 → ascending 0.0025, 0.01, 0.01, 1, 4, prefix means 0.0025, 0.00625,
    # 0.0075, 0.2556: keep the three small ones
    assert m2po_keep(torch.tensor([1.0, 0.01, 4.0, 0.0025, 0.01]), 0.04).tolist() == [False, True, False, True, True]
    assert m2po_keep(torch.tensor([0.01, 0.02]), 0.04).tolist() == [True, True]
    assert m2po_keep(torch.zeros(0), 0.04).tolist() == []
    # every value above the budget: everything is removed
    assert m2po_keep(torch.tensor([0.5, 0.7]), 0.04).tolist() == [False, False]
    # ties at the cut: [0.09, 0.01, 0.09, 0.01, 0.01] has mean 0.042; one 0.09 goes, the later one
    assert m2po_keep(torch.tensor([0.09, 0.01, 0.09, 0.01, 0.01]), 0.04).tolist() == [True, True, False, True, True]


@pytest.mark.parametrize("pool", ["trust_region", "all"])
def test_m2po_pre_pass_masks_are_the_same_for_one_or_four_micro_batches(pool):
    # The engine pre-pass's step (glue/algorithms/m2po.py micro_batch_masks) on the batch of
    # tests.scenario_losses.M2PO_SHIFTS (8 responses × 3 tokens, A = +1, −1, ...), as 1 micro-batch of 8 or
    # 4 of 2 responses; plus a tie across micro-batches: rows 4 and 6 (A = +1) carry log ρ 0.3 on token 1.
    # trust_region: pool = every token but the 2.5 of row 1 (A = −1, ρ > 1). Values: 18 × 0.0025, 2 × 0.09,
    # 0.25, 1, 2.25 (23). Prefix means: 18 × 0.0025 → 0.0025; + 0.09 → 0.135/19 = 0.0071; + 0.09 → 0.225/20 =
    # 0.01125; + 0.25 → 0.475/21 = 0.0226; + 1 → 1.475/22 = 0.067 > 0.04: keep 21, remove the 1 and the 2.25.
    # all: + 6.25 (24 values), the same prefix → remove the 1, 2.25 and 6.25. Removing ties: none at the cut
    # here, so also check a budget that cuts inside the tie: τ = 0.0071 keeps the 18 small values and one
    # 0.09 (0.135/19 = 0.00711 ≤ 0.0072 < 0.225/20): row 4's (earlier in the mini-batch) stays, row 6's goes.
    from tests.scenario_losses import M2PO_SHIFTS
    from verl_offpolicy.glue.algorithms.m2po import micro_batch_masks

    log_ratio = torch.tensor(M2PO_SHIFTS, dtype=F64)
    log_ratio[4, 1] = log_ratio[6, 1] = 0.3
    adv = torch.tensor([[1.0], [-1.0]] * 4, dtype=F64).expand(8, 3)
    mask = torch.ones(8, 3, dtype=torch.bool)
    expected = {
        0.04: {(1, 1), (1, 2)} | ({(1, 0)} if pool == "all" else set()),
        0.0072: {(0, 2), (1, 1), (1, 2), (6, 1)} | ({(1, 0)} if pool == "all" else set()),
    }
    for budget, removed in expected.items():
        whole = micro_batch_masks([(log_ratio, adv, mask)], budget, pool)
        split = micro_batch_masks(
            [(log_ratio[i : i + 2], adv[i : i + 2], mask[i : i + 2]) for i in range(0, 8, 2)], budget, pool
        )
        assert len(whole) == 1 and len(split) == 4
        torch.testing.assert_close(torch.cat(split), whole[0])
        assert {tuple(index) for index in (~whole[0]).nonzero().tolist()} == removed, (budget, pool)


def test_m2po_micro_batch_without_the_pre_pass_is_an_error():
    # inside verl's engine (global_batch_info says the mini-batch has 4 sequences) a call holding 1 of them
    # without the engine's pre-pass must not choose a per-micro-batch mask silently
    config = actor("m2po")
    old = torch.zeros(1, 2, dtype=F64)
    config.global_batch_info.update({"dp_size": 1, "batch_num_tokens": 8, "global_batch_size": 4})
    try:
        with pytest.raises(RuntimeError, match="whole-mini-batch pre-pass"):
            call(config, old, old + 0.5, torch.ones(1, 2, dtype=F64), torch.ones(1, 2, dtype=torch.bool))
    finally:
        config.global_batch_info.clear()


# ---------------------------------------------------------------- pairwise_opmd (OPMD report, section 2)


def _pairwise_batch():
    """Groups of 3, 2 and 1 ragged responses: rewards, token log-probs (π_θ and π_ref), mask, uids."""
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([3, 1, 2, 4, 2, 3])
    mask = torch.arange(4) < lengths.unsqueeze(-1)
    log_prob = torch.where(mask, -torch.rand(6, 4, generator=g, dtype=F64) * 2, 0.0)
    ref = torch.where(mask, -torch.rand(6, 4, generator=g, dtype=F64) * 2, 0.0)
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, -0.5, 2.0], dtype=F64)
    uids = np.array(["a", "a", "a", "b", "b", "c"], dtype=object)
    return rewards, log_prob, ref, mask, uids, lengths


@pytest.mark.parametrize("tau", [0.5, 2.0])
def test_pairwise_opmd_gradient_is_the_literal_pairwise_sum(tau):
    # J = Σ_groups Σ_{i<j}(a_i − a_j)²/(1+τ)², a_i = r_i − τ·Σ_t(log π_t − log π_ref,t), by autograd;
    # registered: verl's KL-in-reward (kl_penalty "kl", coefficient τ, the reward on the last token) →
    # pairwise_opmd estimator → pairwise_opmd loss (mean over the N = 6 sequences): N·∇loss = ∇J
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn, kl_penalty

    from verl_offpolicy.tabular import pairwise_opmd_config

    rewards, log_prob, ref, mask, uids, lengths = _pairwise_batch()
    lp = log_prob.clone().requires_grad_(True)
    a = rewards - tau * ((lp - ref) * mask).sum(-1)
    literal = sum((a[i] - a[j]) ** 2 for i in range(6) for j in range(i + 1, 6) if uids[i] == uids[j]) / (1 + tau) ** 2
    (expected,) = torch.autograd.grad(literal, lp)

    token_rewards = torch.zeros(6, 4, dtype=F64)
    token_rewards[torch.arange(6), lengths - 1] = rewards
    token_rewards = token_rewards - tau * kl_penalty(log_prob, ref, "kl") * mask
    advantages, _ = get_adv_estimator_fn("pairwise_opmd")(
        token_level_rewards=token_rewards, response_mask=mask.to(F64), index=uids, config=pairwise_opmd_config(tau)
    )
    config = actor("pairwise_opmd")
    config.global_batch_info.update({"dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": 6})
    try:
        _, grad, _ = call(config, log_prob, log_prob, advantages, mask, "token-mean")
    finally:
        config.global_batch_info.clear()
    torch.testing.assert_close(6 * grad, expected)
    assert expected[5].abs().sum() == 0 and grad[5].abs().sum() == 0  # the singleton has no pair


def test_pairwise_opmd_advantage_golden_values():
    # τ = 1, one group of K = 3 with a = [1, 0, 0.5] (no KL term: log π = log π_ref): ā = 0.5,
    # A = 2·K·τ·(a − ā)/(1+τ)² = 6·[0.5, −0.5, 0]/4 = [0.75, −0.75, 0]; a singleton gets 0
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    from verl_offpolicy.tabular import pairwise_opmd_config

    scores = torch.tensor([[1.0], [0.0], [0.5], [3.0]], dtype=F64)
    advantages, _ = get_adv_estimator_fn("pairwise_opmd")(
        token_level_rewards=scores,
        response_mask=torch.ones_like(scores),
        index=np.array(["g", "g", "g", "s"], dtype=object),
        config=pairwise_opmd_config(1.0),
    )
    torch.testing.assert_close(advantages[:, 0], torch.tensor([0.75, -0.75, 0.0, 0.0], dtype=F64))
