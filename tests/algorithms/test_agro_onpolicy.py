"""On-policy AGRO: the sample baseline is unbiased (exact expectation over every group of K responses),
the loss's spurious minimum on a 2-arm bandit, and the startup checks that keep it on-policy data only.

Expected gradients come from autograd on the objective E_π[R] − Var_π(R)/(2β), never from the estimator.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the verl.plugins entry point: registers our names)
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

from tests.hydra_utils import VALID_SIZES
from verl_offpolicy.glue.compose import compose_main_ppo
from verl_offpolicy.glue.validation import validate_offpolicy_config
from verl_offpolicy.tabular import agro_config, agro_onpolicy_run, all_groups

F64 = torch.float64
BETA = 0.5
THETA = torch.tensor([0.3, -0.4, 0.1], dtype=F64)  # π ≈ [0.44, 0.22, 0.36]
R = torch.tensor([0.0, 1.0, 0.4], dtype=F64)  # returns of the three responses (KL already in them)


def _objective_gradient(theta: torch.Tensor, returns: torch.Tensor, beta: float) -> torch.Tensor:
    """∇_θ [E_π R − Var_π(R)/(2β)] with R held fixed (what the sample estimator targets), by autograd."""
    theta = theta.detach().requires_grad_(True)
    pi = torch.softmax(theta, 0)
    mean = pi @ returns
    objective = mean - (pi @ returns.square() - mean.square()) / (2 * beta)
    (grad,) = torch.autograd.grad(objective, theta)
    return grad


def _expected_sample_gradient(theta, returns, k, advantage_fn):
    """E over every K-tuple y ~ π^K of (1/K)·Σ_i A_i·∇log π(y_i), A from ``advantage_fn(R [T, K])``."""
    pi = torch.softmax(theta, 0)
    groups = all_groups(len(theta), k)  # [T, K]
    weights = pi[groups].prod(-1)  # probability of each tuple
    grad_log_pi = torch.autograd.functional.jacobian(lambda t: torch.log_softmax(t, 0), theta)  # row y: ∇log π(y)
    advantages = advantage_fn(returns[groups])  # [T, K]
    per_tuple = (advantages.unsqueeze(-1) * grad_log_pi[groups]).mean(1)  # [T, N]
    return weights @ per_tuple


def _registered_onpolicy(group_returns: torch.Tensor) -> torch.Tensor:
    """verl's registered ``agro`` estimator with on_policy=true, one uid per tuple."""
    n_tuples, k = group_returns.shape
    token_rewards = group_returns.reshape(-1, 1)
    config = agro_config(BETA, on_policy=True)
    advantages, _ = get_adv_estimator_fn("agro")(
        token_level_rewards=token_rewards,
        response_mask=torch.ones_like(token_rewards),
        index=np.repeat(np.arange(n_tuples), k),
        config=config,
    )
    return advantages[:, 0].reshape(n_tuples, k)


def _old_mean_square_baseline(group_returns: torch.Tensor) -> torch.Tensor:
    """The previous form A_i = D_i − (D_i² − mean_j D_j²)/(2β), written out here for comparison."""
    k = group_returns.shape[1]
    diff = group_returns - (group_returns.sum(1, keepdim=True) - group_returns) / (k - 1)
    square = diff.square()
    return diff - (square - square.mean(1, keepdim=True)) / (2 * BETA)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_onpolicy_baseline_is_unbiased_exactly(k):
    target = _objective_gradient(THETA, R, BETA)
    expected = _expected_sample_gradient(THETA, R, k, _registered_onpolicy)
    torch.testing.assert_close(expected, target, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("k", [2, 3, 4])
def test_previous_mean_square_baseline_is_biased(k):
    # mean_j D_j² shrinks the variance term by (K−2)/(K−1) (zero at K = 2): its expectation misses the target
    target = _objective_gradient(THETA, R, BETA)
    old = _expected_sample_gradient(THETA, R, k, _old_mean_square_baseline)
    assert (old - target).abs().max() > 1e-2


# ------------------------------------------------------------------ spurious minimum (2-arm bandit)


def test_onpolicy_agro_converges_to_the_wrong_arm_when_success_rate_is_below_half_minus_beta():
    # 0/1 rewards, β = 0.1, π = π_ref with p(correct) = 0.3 < ½ − β = 0.4: at π_ref the correct answer's
    # expected on-policy advantage is (1 − p) − ((1 − p)² − p(1 − p))/(2β) = 0.7 − 1.4 < 0, and the
    # exact-expectation dynamics through the registered estimator and loss collapse onto the wrong arm
    pi = agro_onpolicy_run(p_correct=0.3, beta=0.1, steps=300, lr=1.0)
    assert pi[1] < 1e-3
    # control: p = 0.45 > ½ − β learns the correct arm with the same code
    pi = agro_onpolicy_run(p_correct=0.45, beta=0.1, steps=300, lr=1.0)
    assert pi[1] > 0.99


# ------------------------------------------------------------------ startup checks


ONPOLICY_ONLY = "on-policy AGRO (algorithm.offpolicy.on_policy=true) needs fresh on-policy samples"


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["algorithm.offpolicy.sync_interval=2"], "set algorithm.offpolicy.sync_interval=1"),
        (["algorithm.offpolicy.sync_offset=1"], "set algorithm.offpolicy.sync_offset=0"),
        (["algorithm.offpolicy.ratio_anchor=behaviour"], "set algorithm.offpolicy.ratio_anchor=proximal"),
        (["actor_rollout_ref.actor.ppo_epochs=2"], "set actor_rollout_ref.actor.ppo_epochs=1"),
        (
            ["actor_rollout_ref.actor.ppo_mini_batch_size=8"],
            "set actor_rollout_ref.actor.ppo_mini_batch_size=16 (= data.train_batch_size; got 8",
        ),
        (["actor_rollout_ref.rollout.n=1"], "set actor_rollout_ref.rollout.n >= 2"),
    ],
)
def test_onpolicy_agro_on_data_that_is_not_on_policy_is_rejected(overrides, message):
    cfg = compose_main_ppo("offpolicy_trainer", ["algorithm=agro_onpolicy", *VALID_SIZES, *overrides])
    with pytest.raises(ValueError) as info:
        validate_offpolicy_config(cfg)
    assert ONPOLICY_ONLY in str(info.value) and message in str(info.value)


def test_offpolicy_agro_accepts_the_same_staleness():
    cfg = compose_main_ppo(
        "offpolicy_trainer",
        ["algorithm=agro", *VALID_SIZES, "algorithm.offpolicy.sync_interval=2", "actor_rollout_ref.actor.ppo_epochs=2"],
    )
    validate_offpolicy_config(cfg)


@pytest.mark.parametrize("preset", ["agro", "agro_onpolicy"])
@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.rollout_correction.bypass_mode=true", "algorithm.offpolicy.ratio_anchor=rollout"],
        ["algorithm.offpolicy.ratio_anchor=rollout"],
        ["algorithm.rollout_correction.bypass_mode=true"],
    ],
)
def test_agro_with_rollout_log_probs_in_old_log_prob_is_rejected(preset, overrides):
    cfg = compose_main_ppo(
        "offpolicy_trainer",
        [f"algorithm={preset}", *VALID_SIZES, "actor_rollout_ref.rollout.calculate_log_probs=true", *overrides],
    )
    with pytest.raises(ValueError) as info:
        validate_offpolicy_config(cfg)
    message = str(info.value)
    assert "algorithm.rollout_correction.bypass_mode" in message and "algorithm.offpolicy.ratio_anchor" in message
    assert "proximal log-prob" in message
