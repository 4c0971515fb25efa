"""Every loss, estimator and diagnostic on multi-turn response masks (docs/multi_turn.md).

In a multi-turn trajectory (verl's tool agent loop) the tool's output sits inside the response with
``response_mask = 0``: the mask has interior gaps, and the trainer still computes (finite) log-probs there.
Sequence-level quantities must count the model's tokens only. Here the gap's tokens carry garbage
(log π − log π_old = 33 per token: counted, it would flip every result below), and:

- each family's sequence quantity is derived by hand on a gapped mask (REC/GSPO's sequence ratio, TOPR's
  truncated sequence ratio, ``k2_seq``, PMD's sequence log-ratio, M2PO's token pool, ``anchor_corr``);
- every registered loss (discovered from the registry's names) under every aggregation gives the same loss
  and gradient as the same tokens without the gap (moved to the right padding, T unchanged);
- every registered estimator puts its advantage on the model's tokens only, the same as without the gap.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the verl.plugins entry point: registers our names)
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

from tests.loss_helpers import call
from verl_offpolicy.glue import registration
from verl_offpolicy.glue.scheduler.metrics import anchor_corr_metrics
from verl_offpolicy.glue.validation import validate_parts
from verl_offpolicy.tabular import actor

F64 = torch.float64
# One response of 5 tokens: the model's turn (tokens 0, 1), the tool's output (2, 3), the model's next turn (4).
GAPPED = torch.tensor([[True, True, False, False, True]])
GARBAGE = 33.0  # log π − log π_old on the tool's tokens


def gapped_batch(model_log_ratio: list[float], advantage: float):
    """(old, log_prob, advantages, mask) of the gapped response: ``model_log_ratio`` on tokens 0, 1, 4; garbage
    on the gap (a log-ratio of 33, an advantage of 7: verl zeroes it, a bug would not)."""
    old = torch.tensor([[-1.0, -2.0, -30.0, -30.0, -1.5]], dtype=F64)
    log_ratio = torch.tensor(
        [[model_log_ratio[0], model_log_ratio[1], GARBAGE, GARBAGE, model_log_ratio[2]]], dtype=F64
    )
    adv = torch.tensor([[advantage, advantage, 7.0, 7.0, advantage]], dtype=F64)
    return old, old + log_ratio, adv, GAPPED


# ---------------------------------------------------------------- each family, by hand


def test_gspo_sequence_ratio_averages_the_models_tokens_only():
    # model log ρ = [0.4, −0.2, 0.1]: ρ̄ = exp(0.3/3) = e^0.1 ≈ 1.105 ≤ 1.2, A = +1: every model token kept,
    # ∂ℓ/∂log π = −A (weight none, token-sum). Counting the gap: ρ̄ = exp(66.3/5), masked.
    old, log_prob, adv, mask = gapped_batch([0.4, -0.2, 0.1], 1.0)
    _, grad, _ = call(actor("rec", clip_mode="gspo-one-side"), old, log_prob, adv, mask)
    assert grad.tolist() == [[-1.0, -1.0, 0.0, 0.0, -1.0]]
    # ε_high = 0.1: e^0.1 > 1.1, the whole sequence is above the band (3 of 3 model tokens)
    _, grad, metrics = call(actor("rec", clip=(0.1, 0.1), clip_mode="gspo-one-side"), old, log_prob, adv, mask)
    assert grad.tolist() == [[0.0] * 5] and metrics["actor/pg_clipfrac_upper"] == 1.0


def test_rec_token_clip_fraction_counts_the_models_tokens():
    # one-side, ε = 0.2, A = +1: model ρ = [e^0.4 > 1.2 (masked), e^−0.2, e^0.1]: 1 of 3 clipped, grad −1 on the rest
    old, log_prob, adv, mask = gapped_batch([0.4, -0.2, 0.1], 1.0)
    _, grad, metrics = call(actor("rec", clip_mode="one-side"), old, log_prob, adv, mask)
    assert grad.tolist() == [[0.0, -1.0, 0.0, 0.0, -1.0]]
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 3)
    assert metrics["actor/offpolicy/rec/clipped_frac"] == pytest.approx(1 / 3)


def test_k2_seq_uses_the_models_tokens_sum_and_count():
    # A = 0, c = 0.1: Δ = 0.4 − 0.2 + 0.1 = 0.3, |y| = 3 model tokens: c·Δ²/|y| = 0.003 (token-sum);
    # ∂/∂log π_t = 2c·Δ/|y| = 0.02 on each model token, 0 on the gap
    old, log_prob, adv, mask = gapped_batch([0.4, -0.2, 0.1], 0.0)
    loss, grad, _ = call(
        actor("rec", regularizer="k2_seq", regularizer_coef=0.1), old, log_prob, adv, mask, "token-sum"
    )
    torch.testing.assert_close(loss, torch.tensor(0.003, dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[0.02, 0.02, 0.0, 0.0, 0.02]], dtype=F64))


def test_pmd_sequence_log_ratio_and_advantage_use_the_models_tokens():
    # τ = 0.5, A_i = masked mean of A = 1 (the gap's 7 left out), Δ = 0.3, |y| = 3:
    # L = ½·τ·(A/τ − Δ)²/|y| = 0.25·1.7²/3; ∂L/∂log π_t = −(A − τΔ)/|y| = −0.85/3 on each model token
    old, log_prob, adv, mask = gapped_batch([0.4, -0.2, 0.1], 1.0)
    loss, grad, _ = call(actor("pmd", tau=0.5), old, log_prob, adv, mask, "token-sum")
    torch.testing.assert_close(loss, torch.tensor(0.25 * 1.7**2 / 3, dtype=F64))
    g = -0.85 / 3
    torch.testing.assert_close(grad, torch.tensor([[g, g, 0.0, 0.0, g]], dtype=F64))


def test_topr_truncated_sequence_ratio_sums_the_models_tokens():
    # A = −1, model log ρ = [−0.4, −0.6, 0]: Δ = −1, w = min(1, e^−1) = e^−1; ∂ℓ/∂log π_t = −w·A = e^−1.
    # Counting the gap: Δ = 65, w = 1.
    old, log_prob, adv, mask = gapped_batch([-0.4, -0.6, 0.0], -1.0)
    _, grad, metrics = call(actor("topr"), old, log_prob, adv, mask, "token-sum")
    w = math.exp(-1.0)
    torch.testing.assert_close(grad, torch.tensor([[w, w, 0.0, 0.0, w]], dtype=F64))
    assert metrics["actor/offpolicy/topr/truncated_frac"] == pytest.approx(1.0)  # all 3 model tokens tapered


def test_m2po_token_pool_holds_the_models_tokens_only():
    # pool "all", τ_M2 = 0.04: model (log ρ)² = [0.01, 0.01, 1], mean 0.34; ascending prefix means 0.01, 0.01,
    # 0.34 → keep 2, drop the 1 (token 4): 1 of 3 masked; kept ∂ℓ/∂log π_t = −ρ_t·A. Counting the gap's
    # 33² = 1089 twice: 3 of 5 masked.
    old, log_prob, adv, mask = gapped_batch([0.1, -0.1, 1.0], 1.0)
    _, grad, metrics = call(actor("m2po", m2po_token_pool="all"), old, log_prob, adv, mask, "token-sum")
    torch.testing.assert_close(grad, torch.tensor([[-math.exp(0.1), -math.exp(-0.1), 0.0, 0.0, 0.0]], dtype=F64))
    assert metrics["actor/offpolicy/m2po/masked_frac"] == pytest.approx(1 / 3)


def test_anchor_corr_statistics_use_the_models_tokens():
    # log ρ = log π_proximal − log π_anchor = [0.2, 0.4, ·, ·, 0]: kl = −mean = −0.2;
    # ρ = [e^0.2, e^0.4, 1]: ESS = (Σρ)²/(3·Σρ²)
    anchor = torch.tensor([[-1.0, -2.0, -40.0, -40.0, -1.5]])
    proximal = anchor + torch.tensor([[0.2, 0.4, GARBAGE, GARBAGE, 0.0]])
    stats = anchor_corr_metrics(proximal, anchor, GAPPED)
    rho = [math.exp(0.2), math.exp(0.4), 1.0]
    assert stats["offpolicy/anchor_corr/kl"] == pytest.approx(-0.2, rel=1e-5)
    assert stats["offpolicy/anchor_corr/rollout_is_eff_sample_size"] == pytest.approx(
        sum(rho) ** 2 / (3 * sum(r * r for r in rho)), rel=1e-5
    )
    assert stats["offpolicy/anchor_corr/rollout_is_max"] == pytest.approx(math.exp(0.4), rel=1e-5)


# ---------------------------------------------------------------- every registered loss: gap = no gap


def _gap_moved_to_the_end(x: torch.Tensor) -> torch.Tensor:
    """The same response with the tool's tokens (2, 3) moved after the model's: [0, 1, 4, 2, 3]."""
    return x[:, [0, 1, 4, 2, 3]]


LOSS_VARIANTS = {
    "rec": [
        {},
        {"clip_mode": "gspo-one-side", "weight": "gspo_importance_sampling"},
        {"regularizer": "k2_seq", "regularizer_coef": 0.1},
    ],
    "pmd": [{"tau": 0.5}],
    "m2po": [{"m2po_token_pool": "all"}, {}],
}
LOSS_CONFIGS = [(mode, kw) for mode in registration.POLICY_LOSSES for kw in LOSS_VARIANTS.get(mode, [{}])]


@pytest.mark.parametrize(
    "mode,kwargs", LOSS_CONFIGS, ids=[f"{m}-{'-'.join(map(str, k.values())) or 'default'}" for m, k in LOSS_CONFIGS]
)
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_every_loss_ignores_the_tool_tokens(mode, kwargs, agg):
    """Two gapped responses and a plain one; the gap's tokens carry garbage log-ratios and advantages."""
    g = torch.Generator().manual_seed(5)
    old = -torch.rand(3, 5, generator=g, dtype=F64) * 2
    log_ratio = 0.3 * torch.randn(3, 5, generator=g, dtype=F64)
    mask = torch.tensor([[1, 1, 0, 0, 1], [1, 0, 0, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    log_ratio = torch.where(mask, log_ratio, GARBAGE)
    adv = torch.tensor([[1.0], [-0.5], [0.25]], dtype=F64).expand(3, 5)
    adv = torch.where(mask, adv, 7.0)
    config = actor(mode, rollout_n=3, **kwargs)
    loss, grad, metrics = call(config, old, old + log_ratio, adv, mask, agg)
    order = torch.tensor([[0, 1, 4, 2, 3], [0, 3, 4, 1, 2], [0, 1, 2, 3, 4]])  # each row's model tokens first
    moved = [x.gather(1, order) for x in (old, log_ratio, adv, mask)]
    loss_moved, grad_moved, metrics_moved = call(config, moved[0], moved[0] + moved[1], moved[2], moved[3], agg)
    torch.testing.assert_close(loss, loss_moved)
    torch.testing.assert_close(grad.gather(1, order), grad_moved)
    assert torch.all(grad[~mask] == 0)
    assert metrics == pytest.approx(metrics_moved)


# ---------------------------------------------------------------- every registered estimator


@pytest.mark.parametrize("name", registration.ADV_ESTIMATORS)
def test_every_estimator_puts_its_advantage_on_the_models_tokens(name):
    """A group of 4 trajectories, rewards [1, 0, 1, 0] on their last model token; two masks gapped. The
    advantage is 0 on the tool's tokens and, on the model's, the same as the ungapped group's."""
    # oapl's own rules: its anchor holds the generating policy's log-probs, and a group has K >= 2 responses
    offpolicy, loss_kw = ({"ratio_anchor": "behaviour"}, {"rollout_n": 4}) if name == "oapl" else ({}, {})
    config = OmegaConf.create({"adv_estimator": name, "norm_adv_by_std_in_grpo": False, "offpolicy": offpolicy})
    validate_parts(
        algorithm=config, actor=actor(name, **loss_kw) if name in registration.POLICY_LOSSES else None
    )  # pairs
    mask = torch.tensor([[1, 1, 0, 0, 1], [1, 0, 0, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.float32)
    last = torch.tensor([4, 4, 2, 4])
    rewards = torch.zeros(4, 5).scatter(1, last.unsqueeze(-1), torch.tensor([[1.0], [0.0], [1.0], [0.0]]))
    index = np.zeros(4, dtype=np.int64)
    fn = get_adv_estimator_fn(name)
    advantages, _ = fn(token_level_rewards=rewards, response_mask=mask, index=index, config=config)
    plain, _ = fn(token_level_rewards=rewards, response_mask=torch.ones(4, 5), index=index, config=config)
    assert torch.all(advantages[mask == 0] == 0), advantages
    torch.testing.assert_close(advantages[mask == 1], plain[mask == 1])
    assert advantages.abs().sum() > 0  # the group has a spread: a zero advantage would test nothing
