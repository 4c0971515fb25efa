"""OAPL (arXiv 2602.19362) through verl's registries: its value estimate, its loss and its pairing rule.

Expected values are derived by hand from the paper's equations as the authors' code computes them
(github.com/danieldritter/OAPL, verl/trainer/oapl/: V̂* = β1·log mean_j exp(r_j/β1) over the prompt's
responses; loss = mean over sequences of (β2·Σ_t log(π_t/π_lag,t) − (r − V̂*))²).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the verl.plugins entry point: registers our names)
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

from tests.hydra_utils import VALID_SIZES, compose_main_ppo
from tests.loss_helpers import call
from verl_offpolicy.glue.knobs import OffPolicyConfigError
from verl_offpolicy.glue.validation import validate_offpolicy_config, validate_parts
from verl_offpolicy.tabular import actor

F64 = torch.float64


def oapl_advantage(rewards, uids, beta1):
    config = OmegaConf.create({"adv_estimator": "oapl", "offpolicy": {"oapl_beta1": beta1}})
    scores = torch.tensor(rewards, dtype=F64).unsqueeze(-1)
    index = np.array(uids, dtype=object)
    advantages, returns = get_adv_estimator_fn("oapl")(
        token_level_rewards=scores, response_mask=torch.ones_like(scores), index=index, config=config
    )
    torch.testing.assert_close(returns, advantages)
    return advantages[:, 0]


@pytest.mark.parametrize("beta1", [1.0, 0.5])
def test_value_estimate_is_the_groups_log_mean_exp(beta1):
    # group a: r = [1, 0, 0, 1]: V̂* = β1·ln((2e^{1/β1} + 2)/4) = β1·ln((e^{1/β1} + 1)/2); A = r − V̂*
    #   β1 = 1: V̂* = ln((e + 1)/2) = 0.62011; β1 = 0.5: V̂* = 0.5·ln((e² + 1)/2) = 0.71689
    # group b: one response, r = 0.3: V̂* = 0.3, A = 0 (the formula with K = 1)
    # group c: r = [0.2, 0.2]: V̂* = 0.2, A = [0, 0]
    v = beta1 * math.log((math.exp(1 / beta1) + 1) / 2)
    got = oapl_advantage([1, 0, 0.3, 0, 0.2, 1, 0.2], ["a", "a", "b", "a", "c", "a", "c"], beta1)
    torch.testing.assert_close(got, torch.tensor([1 - v, -v, 0.0, -v, 0.0, 1 - v, 0.0], dtype=F64))
    assert v == pytest.approx({1.0: 0.620115, 0.5: 0.716890}[beta1], abs=1e-6)


def test_value_estimate_lies_between_the_mean_and_the_max():
    # β1 → ∞: V̂* → r̄ = 0.5; β1 → 0: V̂* → max r = 1 (the authors' β1 = 1 lies between)
    rewards, uids = [1.0, 0.0], ["a", "a"]
    assert float(oapl_advantage(rewards, uids, 1e4)[0]) == pytest.approx(0.5, abs=1e-4)
    assert float(oapl_advantage(rewards, uids, 1e-3)[0]) == pytest.approx(0.0, abs=1e-3)


def test_loss_value_and_gradient_by_hand():
    # β2 = 0.1.
    # seq 0: |y| = 2, log π − log π_lag = [0.5, −1.0] → Δ = −0.5, A = 0.8: residual 0.1·(−0.5) − 0.8 = −0.85, L = 0.7225
    # seq 1: |y| = 3, each token +0.5 → Δ = 1.5, A = −0.2: residual 0.15 + 0.2 = 0.35, L = 0.1225
    # loss = (0.7225 + 0.1225)/2 = 0.4225 whatever loss_agg_mode says (a mean over sequences)
    # ∂loss/∂log π_t = 2β2·residual_i/N: seq 0: 0.2·(−0.85)/2 = −0.085; seq 1: 0.2·0.35/2 = 0.035; padding 0
    old = torch.tensor([[-1.5, -1.0, 0.0], [-1.0, -1.0, -1.0]], dtype=F64)
    log_prob = torch.tensor([[-1.0, -2.0, 9.0], [-0.5, -0.5, -0.5]], dtype=F64)
    adv = torch.tensor([[0.8, 0.8, 0.0], [-0.2, -0.2, -0.2]], dtype=F64)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        loss, grad, _ = call(actor("oapl", oapl_beta2=0.1), old, log_prob, adv, mask, agg)
        torch.testing.assert_close(loss, torch.tensor(0.4225, dtype=F64))
        torch.testing.assert_close(grad, torch.tensor([[-0.085, -0.085, 0.0], [0.035, 0.035, 0.035]], dtype=F64))


def test_a_token_level_correction_weight_enters_as_its_mean_over_the_response():
    # the example above (L_0 = 0.7225 over 2 tokens, L_1 = 0.1225 over 3) with verl's token-level weights
    # w_0 = [0.5, 1.5 | pad 7] (mean 1.0) and w_1 = [1, 2, 3] (mean 2): loss = (1.0·0.7225 + 2·0.1225)/2 = 0.48375;
    # a sequence-level weight (each token of a response the same) is the weight itself
    old = torch.tensor([[-1.5, -1.0, 0.0], [-1.0, -1.0, -1.0]], dtype=F64)
    log_prob = torch.tensor([[-1.0, -2.0, 9.0], [-0.5, -0.5, -0.5]], dtype=F64)
    adv = torch.tensor([[0.8, 0.8, 0.0], [-0.2, -0.2, -0.2]], dtype=F64)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    token = torch.tensor([[0.5, 1.5, 7.0], [1.0, 2.0, 3.0]], dtype=F64)
    loss, _, _ = call(actor("oapl", oapl_beta2=0.1), old, log_prob, adv, mask, "seq-mean-token-sum", weights=token)
    torch.testing.assert_close(loss, torch.tensor(0.48375, dtype=F64))
    sequence = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]], dtype=F64)
    loss, _, _ = call(actor("oapl", oapl_beta2=0.1), old, log_prob, adv, mask, "seq-mean-token-sum", weights=sequence)
    torch.testing.assert_close(loss, torch.tensor(0.48375, dtype=F64))


def test_fresh_batch_gradient_is_reinforce_with_the_value_baseline():
    # Δ = 0 (π_θ = π_lag: one update on a fresh batch): ∂loss/∂log π_t = −2β2·A_i/N, REINFORCE scaled by 2β2
    log_prob = torch.tensor([[-0.3, -0.7], [-1.1, -0.2]], dtype=F64)
    adv = torch.tensor([[0.4, 0.4], [-0.6, -0.6]], dtype=F64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    loss, grad, _ = call(actor("oapl"), log_prob, log_prob, adv, mask)  # β2 = 1e-3, the authors'
    torch.testing.assert_close(loss, torch.tensor((0.4**2 + 0.6**2) / 2, dtype=F64))
    torch.testing.assert_close(grad, torch.tensor([[-4e-4, -4e-4], [6e-4, 6e-4]], dtype=F64))


@pytest.mark.parametrize("adv_estimator, loss_mode", [("oapl", "vanilla"), ("grpo", "oapl")])
def test_estimator_and_loss_go_together(adv_estimator, loss_mode):
    algorithm = OmegaConf.create({"adv_estimator": adv_estimator, "offpolicy": {}})
    with pytest.raises(
        OffPolicyConfigError,
        match=r"algorithm\.adv_estimator=.* and actor_rollout_ref\.actor\.policy_loss\.loss_mode=.*OAPL needs both",
    ):
        validate_parts(algorithm=algorithm, actor=actor(loss_mode))
    accepted = OmegaConf.create({"adv_estimator": "oapl", "offpolicy": {"ratio_anchor": "behaviour"}})
    validate_parts(algorithm=accepted, actor=actor("oapl", rollout_n=2))


@pytest.mark.parametrize("key, section", [("oapl_beta1", "offpolicy"), ("oapl_beta2", "loss")])
def test_betas_must_be_positive(key, section):
    # the loss's β2 is checked when verl builds the actor config (our OffPolicyLossConfig), β1 by the startup rules
    algorithm = OmegaConf.create({"adv_estimator": "oapl", "offpolicy": {key: 0.0} if section == "offpolicy" else {}})
    with pytest.raises(ValueError, match=rf"{key} must be > 0, got 0\.0"):
        validate_parts(algorithm=algorithm, actor=actor("oapl", **({key: 0.0} if section == "loss" else {})))


def _oapl(*overrides):
    # VALID_SIZES: 16 prompts, rollout.n = 4; the preset's anchor is behaviour
    return compose_main_ppo("offpolicy_trainer", ["algorithm=oapl", *VALID_SIZES, *overrides])


def test_one_response_per_group_is_refused():
    # K = 1: V̂* = β1·log exp(r/β1) = r, so A = r − r = 0 for every response (the estimator's singleton case above)
    with pytest.raises(
        OffPolicyConfigError,
        match=r"algorithm\.adv_estimator=oapl estimates V̂\* from the prompt's group, but "
        r"actor_rollout_ref\.rollout\.n=1 gives one response per group: V̂\* = r, every advantage is 0 .*"
        r"set actor_rollout_ref\.rollout\.n >= 2",
    ):
        validate_offpolicy_config(_oapl("actor_rollout_ref.rollout.n=1"))
    validate_offpolicy_config(_oapl("actor_rollout_ref.rollout.n=2"))


def test_the_proximal_anchor_is_refused():
    # Δ must be against π_lag, the weights that generated the group: behaviour (the preset's) or rollout
    with pytest.raises(
        OffPolicyConfigError,
        match=r"algorithm\.adv_estimator=oapl regresses β2·log\(π/π_lag\) against the "
        r"policy that generated the group \(π_lag\), but algorithm\.offpolicy\.ratio_anchor=proximal .*"
        r"set algorithm\.offpolicy\.ratio_anchor to one of behaviour, rollout",
    ):
        validate_offpolicy_config(_oapl("algorithm.offpolicy.ratio_anchor=proximal"))
    assert _oapl().algorithm.offpolicy.ratio_anchor == "behaviour"
    validate_offpolicy_config(_oapl())
    validate_offpolicy_config(
        _oapl("algorithm.offpolicy.ratio_anchor=rollout", "actor_rollout_ref.rollout.calculate_log_probs=true")
    )


# ------------------------------------------------------------------ the value estimate's numerics at large β1


def test_value_estimate_tends_to_the_mean_for_large_beta1():
    """r = [1, 0]: V̂* = β1·log((e^{1/β1} + 1)/2) = 1/2 + 1/(8β1) + O(β1⁻³) (the odd cumulants of a two-point
    distribution with p = 1/2 vanish), so A = [1/2 − 1/(8β1), −1/2 − 1/(8β1)]; never the opposite limit."""
    from verl_offpolicy.core.advantages import oapl_advantage as core_oapl

    ids = torch.tensor([0, 0])
    for beta1 in (1e6, 1e16, 1e300):
        got = core_oapl(torch.tensor([1.0, 0.0], dtype=F64), ids, beta1)
        shift = 1 / (8 * beta1)
        torch.testing.assert_close(got, torch.tensor([0.5 - shift, -0.5 - shift], dtype=F64), rtol=0, atol=1e-15)


@pytest.mark.parametrize("beta1", [1e9, 1e300])
def test_float32_scores_at_large_beta1_give_r_minus_the_mean(beta1):
    """r = [1, 0, 0, 0] in float32: V̂* → r̄ = 1/4 (the correction 3/(32β1) is below float32's rounding), so
    A = [3/4, −1/4, −1/4, −1/4] in float32; not r − max = [0, −1, −1, −1], not NaN."""
    from verl_offpolicy.core.advantages import oapl_advantage as core_oapl

    got = core_oapl(torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([0, 0, 0, 0]), beta1)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, torch.tensor([0.75, -0.25, -0.25, -0.25]), rtol=0, atol=1e-7)
