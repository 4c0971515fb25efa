"""The eight tabular properties of docs/algorithms.md, driven through the REGISTERED estimators and losses.

Single prompt, softmax policy over n arms, each "sequence" is one token (T = 1), gradient ascent on
the logits θ (descent on the registered loss). Expectations are exact: a batch holds each arm with a
multiplicity proportional to its behaviour probability (μ = [0.3, 0.6, 0.1] → counts [3, 6, 1]), so
verl's token-mean over the batch is E_{y∼μ}[ℓ(y)] and the group mean is V^μ. With exact expectations
the dynamics are deterministic, so a step whose gradient is exactly zero is a fixed point.
The testbed (configs, registered-function calls, training loops) is :mod:`verl_offpolicy.tabular`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn

from verl_offpolicy.tabular import (  # the shared tabular testbed (also used by benchmarks/tabular_studies.py)
    F64,
    MU,
    MU_ARMS,
    V_MU,
    actor,
    estimate,
    expected_reward,
    loss_gradient,
    regularised_optimum,
    regularised_run,
    train,
)
from verl_offpolicy.tabular import kl as _kl
from verl_offpolicy.tabular import sync_run as _sync_run

# ---------------------------------------------------------------- 1. REINFORCE / OPMD → the 0.8 arm


@pytest.mark.parametrize(
    "estimator, config",
    [("grpo", actor("rec")), ("opmd", actor("rec"))] + [("opmd", actor("opmd", tau=tau)) for tau in (0.0, 1.0, 4.0)],
)
def test_1_mean_baseline_reinforce_converges_to_the_08_arm(estimator, config):
    # off-policy REINFORCE ascends μ⊙(r − V^μ)/(1+τ) = [−0.174, 0.132, 0.042]/(1+τ): arm 1 wins
    theta, _ = train(config, estimate(estimator, MU_ARMS), steps=1000, lr=1.0)
    pi = torch.softmax(theta, 0)
    assert pi[1] > 0.99 and pi[2] < 0.01, pi


# ---------------------------------------------------------------- 2. REC with IS, no clipping → best arm


def test_2_rec_importance_sampling_reaches_the_best_arm():
    # w = ρ = π/μ turns E_μ into E_π: the on-policy gradient π⊙(r − V^π), maximised by the best arm
    config = actor("rec", clip_mode="none", weight="importance_sampling")
    theta, _ = train(config, estimate("grpo", MU_ARMS), steps=3000, lr=2.0)
    assert torch.softmax(theta, 0)[2] > 0.99


# ---------------------------------------------------------------- 3. every clip mode stops in its trust region


@pytest.mark.parametrize("weight", ["none", "importance_sampling"])
@pytest.mark.parametrize("clip_mode", ["one-side", "two-side", "ring", "gspo-one-side"])
@pytest.mark.parametrize("lr", [0.1, 1.0])
def test_3_clip_modes_stop_inside_the_trust_region(clip_mode, weight, lr):
    config = actor("rec", clip=(0.2, 0.2), clip_mode=clip_mode, weight=weight)
    # gspo's sequence ratio needs a sequence-level aggregation (a startup rule); one-token responses: equal to
    # token-mean
    agg = "seq-mean-token-mean" if clip_mode == "gspo-one-side" else "token-mean"
    theta, steps = train(config, estimate("grpo", MU_ARMS), steps=5000, lr=lr, agg=agg)
    assert steps < 5000, "the masked gradient never reached exactly zero"
    assert expected_reward(theta) > V_MU + 0.1
    log_ratio = torch.log_softmax(theta, 0) - torch.log(MU)
    assert log_ratio.abs().max() < 0.75, log_ratio  # ≈ 0.7 for ε = 0.2 (log 1.2 = 0.18 per token)


# ---------------------------------------------------------------- 4. behaviour refreshed every s = 1000 steps


@pytest.mark.parametrize(
    "algorithm, config, estimator, offpolicy",
    [
        ("reinforce", actor("rec"), "opmd", {"baseline": "mean"}),
        ("asymre", actor("rec"), "asymre", {"shift": -0.1}),
        ("rec one-side", actor("rec", clip_mode="one-side"), "opmd", {"baseline": "mean"}),
    ],
)
def test_4_sync_interval_1000_reinforce_and_asymre_stay_rec_reaches_best(algorithm, config, estimator, offpolicy):
    # REINFORCE/REC use the mean baseline (opmd estimator, baseline=mean: A = r − r̄, as grpo without std)
    pi = _sync_run(config, estimator, phases=8, **offpolicy)
    if algorithm == "rec one-side":
        assert pi[2] > 0.98, pi
    else:
        assert pi[1] > 0.99, pi


# ---------------------------------------------------------------- 5. AsymRE limits


@pytest.mark.parametrize("shift", [-1.0, -0.5, -0.1])
def test_5_asymre_negative_shift_limit_beats_the_behaviour(shift):
    theta, _ = train(actor("rec"), estimate("asymre", MU_ARMS, shift=shift), steps=3000, lr=2.0)
    pi = torch.softmax(theta, 0)
    assert expected_reward(theta) >= V_MU
    # Hand-derived limits, c = −shift: the ascent direction on θ_a is μ_a(r_a − V^μ + c) − c·π_a.
    # c = 1: interior zero at π_a = μ_a(1 + (r_a − V^μ)/c) = [0.126, 0.732, 0.142].
    # c = 0.5: arm 0 always decreases; on {1, 2} equal rates need 0.432 − 0.5π₁ = 0.092 − 0.5π₂ → π = [0, 0.84, 0.16].
    # c = 0.1: 0.192 − 0.1π₁ > 0.052 − 0.1π₂ always → arm 1.
    expected = {-1.0: [0.126, 0.732, 0.142], -0.5: [0.0, 0.84, 0.16], -0.1: [0.0, 1.0, 0.0]}[shift]
    torch.testing.assert_close(pi, torch.tensor(expected, dtype=F64), atol=2e-3, rtol=0)


@pytest.mark.parametrize("shift", [0.0, 0.1])
def test_5_asymre_non_negative_shift_collapses(shift):
    theta, _ = train(actor("rec"), estimate("asymre", MU_ARMS, shift=shift), steps=3000, lr=2.0)
    assert torch.softmax(theta, 0).max() > 0.999


# ---------------------------------------------------------------- 6. AGRO reaches π* ∝ π_ref·exp(r/β)

BETA = 0.1
PI_STAR = regularised_optimum(BETA)  # π_ref·exp(r/β), normalised; REWARD6 over 6 arms, π_ref from exact counts


def test_6_agro_converges_to_the_regularised_optimum():
    # verl's KL-in-reward at the current (proximal) weights: R = r − β·(log π − log π_ref); agro estimator,
    # rec loss with seq-mean-token-sum (verl_offpolicy.tabular.regularised_run)
    theta, _ = regularised_run("agro", BETA, steps=500, lr=20.0)
    assert _kl(torch.softmax(theta, 0), PI_STAR) < 1e-8


def test_6_grpo_with_k2_kl_loss_misses_the_regularised_optimum():
    # mean baseline on the raw reward + β·k2 KL loss (verl's kl_penalty "k2" and agg_loss)
    theta, grad = regularised_run("k2", BETA, steps=3000, lr=10.0)
    assert grad.abs().max() < 1e-9  # converged, to the wrong point
    assert _kl(torch.softmax(theta, 0), PI_STAR) > 1e-2


# ---------------------------------------------------------------- 7. RED-Drop on binary rewards


def test_7_red_drop_binary_rewards():
    rewards = torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0])
    uids = np.array(["a"] * 8 + ["b"] * 4, dtype=object)
    adv, _ = get_adv_estimator_fn("red_drop")(rewards.unsqueeze(-1), torch.ones(12, 1), uids, config=None)
    a = adv[:, 0]
    # group a: one negative kept, A = +0.5 / −0.5, six zeros
    assert a[0] == 0.5 and sorted(a[1:8].tolist()) == [-0.5] + [0.0] * 6
    # group b: nothing dropped, A = [0.25, 0.25, 0.25, −0.75]
    assert a[8:].tolist() == [0.25, 0.25, 0.25, -0.75]


# ---------------------------------------------------------------- 8. PMD gradient and the OPMD pairwise identity


def test_8_pmd_gradient_is_minus_a_minus_tau_delta_grad_delta_over_length():
    # sequences of several tokens over a 4-token vocabulary: log π_t = log_softmax(θ_t)[y_t]
    g = torch.Generator().manual_seed(0)
    b, t, vocab, tau = 4, 3, 4, 0.05
    theta = torch.randn(b, t, vocab, generator=g, dtype=F64, requires_grad=True)
    tokens = torch.randint(0, vocab, (b, t), generator=g)
    old = torch.log_softmax(torch.randn(b, t, vocab, generator=g, dtype=F64), -1).gather(-1, tokens[..., None])[..., 0]
    mask = torch.arange(t) < torch.tensor([3, 1, 2, 3]).unsqueeze(-1)
    adv = torch.randn(b, 1, generator=g, dtype=F64) * mask
    log_prob = torch.log_softmax(theta, -1).gather(-1, tokens[..., None])[..., 0]
    loss, _ = get_policy_loss_fn("pmd")(old, log_prob, adv, mask, "seq-mean-token-mean", actor("pmd", tau=tau))
    (grad,) = torch.autograd.grad(loss, theta, retain_graph=True)

    # closed form: (1/N)·Σ_i −(A_i − τΔ_i)·∇Δ_i/|y_i|, ∇Δ_i = Σ_t m_t·∇log π_t (autograd only for ∇log π)
    length = mask.sum(-1).to(F64)
    delta = ((log_prob - old) * mask).sum(-1).detach()
    coef = -(adv.sum(-1) / length - tau * delta) / length / b
    (expected,) = torch.autograd.grad((coef.unsqueeze(-1) * mask * log_prob).sum(), theta)
    torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("tau", [0.5, 2.0])
def test_8_opmd_pairwise_identity(tau):
    # a_i = r_i − τ·log(π_θ(y_i)/π_t(y_i)); at θ = θ_t:
    # ∇ Σ_{i<j} (a_i − a_j)²/(1+τ)² = −(2τK/(1+τ)²)·Σ_i (r_i − r̄)·∇log π(y_i)
    # and the registered opmd loss (token-sum) has ∇ = −(1/(1+τ))·Σ_i (r_i − r̄)·∇log π(y_i).
    g = torch.Generator().manual_seed(1)
    theta_t = torch.randn(5, generator=g, dtype=F64)
    arms = torch.tensor([0, 1, 1, 3, 4, 2])
    rewards = torch.rand(5, generator=g, dtype=F64)
    k = len(arms)

    theta = theta_t.clone().requires_grad_(True)
    log_pi = torch.log_softmax(theta, 0)[arms]
    a = rewards[arms] - tau * (log_pi - torch.log_softmax(theta_t, 0)[arms])
    pairwise = sum((a[i] - a[j]) ** 2 for i in range(k) for j in range(i + 1, k)) / (1 + tau) ** 2
    (lhs,) = torch.autograd.grad(pairwise, theta)

    advantages = estimate("opmd", arms, rewards=rewards)
    behaviour = torch.softmax(theta_t, 0)
    grad = loss_gradient(actor("opmd", tau=tau), theta_t, arms, behaviour, advantages, agg="token-sum")
    torch.testing.assert_close(lhs, (2 * tau * k / (1 + tau)) * grad)
    # and the closed form of the spec
    theta = theta_t.clone().requires_grad_(True)
    centred = rewards[arms] - rewards[arms].mean()
    (rhs,) = torch.autograd.grad((centred * torch.log_softmax(theta, 0)[arms]).sum(), theta)
    torch.testing.assert_close(lhs, -(2 * tau * k / (1 + tau) ** 2) * rhs)
    assert not math.isclose(float(lhs.abs().sum()), 0.0)


# ---------------------------------------------------------------- second round: topr, m2po

# A stale batch in TOPR's ±1-reward setting (no baseline: A = r): behaviour μ = [0.5, 0.4, 0.1, 0] sampled
# arms 0-2 exactly (counts 5, 4, 1); arm 3 (reward −1) is absent from the data, but the current policy
# π(0) = [0.3, 0.3, 0.1, 0.3] has drifted onto it since the batch was generated.
STALE_REWARD = torch.tensor([-1.0, -1.0, 1.0, -1.0], dtype=F64)
STALE_MU = torch.tensor([0.5, 0.4, 0.1, 0.0], dtype=F64)
STALE_ARMS = torch.repeat_interleave(torch.arange(4), torch.tensor([5, 4, 1, 0]))
STALE_PI0 = torch.tensor([0.3, 0.3, 0.1, 0.3], dtype=F64)


@pytest.mark.parametrize("loss_mode", ["rec", "topr"])
def test_topr_on_fixed_stale_data_does_not_collapse_to_a_deterministic_wrong_arm(loss_mode):
    # Ascent direction on logit k: g_k = Σ_i μ_i·w_i·A_i·([i = k] − π_k) = μ_k·w_k·A_k − π_k·S, S = Σ_i μ_i·w_i·A_i.
    # REINFORCE (w = 1): S = −0.5 − 0.4 + 0.1 = −0.8, so g_3 − g_2 = 0.8·(π_3 − π_2) − 0.1 = +0.06 at π(0) and
    # growing: the unseen wrong arm 3 takes all the mass. TOPR tapers the negatives to w_i = π_i/μ_i once
    # π_i < μ_i, so S = 0.1 − π_0 − π_1 → 0.1 and the positive arm 2 (g_2 − g_3 = 0.1·(1 − π_2 + π_3) > 0) wins.
    adv = STALE_REWARD[STALE_ARMS].unsqueeze(-1)
    theta, _ = train(
        actor(loss_mode), adv, steps=2000, lr=1.0, behaviour=STALE_MU, theta=STALE_PI0.log(), arms=STALE_ARMS
    )
    pi = torch.softmax(theta, 0)
    if loss_mode == "rec":
        assert pi[3] > 0.99, pi  # plain REINFORCE collapses onto the unseen −1 arm
    else:
        assert pi[2] > 0.99 and pi[3] < 0.01, pi


@pytest.mark.parametrize("pool, masked", [("trust_region", [5, 38]), ("all", [5, 17, 38])])
def test_m2po_drops_exactly_the_extreme_pool_tokens_and_fits_the_second_moment(pool, masked):
    # 40 tokens with |log ρ| ≤ 0.1 ((log ρ)² ≤ 0.01) and 3 extremes log ρ = 2, −3, 2.5 ((log ρ)² = 4, 9, 6.25), A = +1.
    # Pool: trust_region = the tokens with ρ > 1 (harmful for A > 0): the small positive ones, 2 and 2.5; the −3
    # (ρ < 1, its gradient pulls ρ back up) is outside it. all = every token. In either pool the small ones have
    # mean ≤ 0.01 and adding the smallest extreme of the pool gives ≥ 4/41 > 0.04, so exactly the pool's
    # extremes are masked (zero gradient), every other token keeps −ρ_t·A (non-zero), and the kept pool
    # tokens' second moment is ≤ 0.04 (through the registered loss).
    g = torch.Generator().manual_seed(0)
    log_ratio = torch.rand(1, 43, generator=g, dtype=F64) * 0.2 - 0.1
    extreme = torch.tensor([5, 17, 38])
    log_ratio[0, extreme] = torch.tensor([2.0, -3.0, 2.5], dtype=F64)
    old = -torch.rand(1, 43, generator=g, dtype=F64) - 1.0
    mask = torch.ones(1, 43, dtype=torch.bool)
    adv = torch.ones(1, 43, dtype=F64)
    config = actor("m2po", m2po_token_pool=pool)
    log_prob = (old + log_ratio).requires_grad_(True)
    loss, _ = get_policy_loss_fn("m2po")(old, log_prob, adv, mask, "token-sum", config)
    (grad,) = torch.autograd.grad(loss, log_prob)
    dropped = grad[0] == 0
    assert dropped.nonzero().flatten().tolist() == masked
    torch.testing.assert_close(grad[0, ~dropped], -torch.exp(log_ratio[0, ~dropped]))
    in_pool = log_ratio[0] > 0 if pool == "trust_region" else torch.ones(43, dtype=torch.bool)
    assert float(log_ratio[0, in_pool & ~dropped].square().mean()) <= config.policy_loss.m2po_threshold
    assert float(log_ratio[0, in_pool].square().mean()) > config.policy_loss.m2po_threshold


@pytest.mark.parametrize("tau, lr", [(0.1, 20.0), (1.0, 0.1)])  # the curvature grows like 2Kτ²/(1+τ)²
def test_pairwise_opmd_from_fixed_reference_data_converges_to_the_regularised_optimum(tau, lr):
    # data from π_ref only (exact counts), KL-in-reward a_i = r_i − τ·log(π/π_ref) at the current weights,
    # registered pairwise_opmd estimator and loss: the stationary point has a_i equal on every arm, i.e.
    # π* ∝ π_ref·exp(r/τ) (verl_offpolicy.tabular.regularised_run)
    theta, _ = regularised_run("pairwise_opmd", tau, steps=3000, lr=lr)
    assert _kl(torch.softmax(theta, 0), regularised_optimum(tau)) < 1e-8


@pytest.mark.parametrize(
    "tau, ref_counts, lr, p_star",
    [
        # the pairwise_opmd preset's τ = 0.1, a hard prompt: π_ref(correct) = p = 0.01 (99 wrong, 1 correct sample).
        # π* ∝ π_ref·exp(r/τ) with r = [0, 1]: p* = p·e^{1/τ}/(p·e^{1/τ} + 1 − p) = 0.01·e^10/(0.01·e^10 + 0.99)
        # = 220.2647/221.2647 = 0.995526
        (0.1, [99, 1], 4.0, 0.01 * math.exp(10) / (0.01 * math.exp(10) + 0.99)),
        # τ = 1 (the report's §3 step size, the preset's former τ): p = 0.3 → 0.3·e/(0.3·e + 0.7) =
        # 0.8155/1.5155 = 0.538
        (1.0, [7, 3], 0.5, 0.3 * math.e / (0.3 * math.e + 0.7)),
    ],
)
def test_pairwise_opmd_fixed_point_lifts_a_prompts_success_rate_as_derived(tau, ref_counts, lr, p_star):
    # one prompt, arms [wrong (r = 0), correct (r = 1)], data from π_ref only, registered estimator and loss
    # (verl_offpolicy.tabular.regularised_run): the fixed point's success rate is the hand-derived p*
    theta, grad = regularised_run(
        "pairwise_opmd",
        tau,
        steps=2000,
        lr=lr,
        rewards=torch.tensor([0.0, 1.0], dtype=F64),
        ref_counts=torch.tensor(ref_counts),
    )
    assert float(torch.softmax(theta, 0)[1]) == pytest.approx(p_star, abs=1e-9)
    assert float(grad.abs().max()) < 1e-12
    if tau == 0.1:
        assert p_star == pytest.approx(0.995526, abs=1e-6)
    else:
        assert p_star == pytest.approx(0.538102, abs=1e-6)
