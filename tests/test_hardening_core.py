"""Hardening of the pure math: non-finite log-probs raise naming the sample (M2PO, k2, k2_seq and
every other loss), and integer or bool rewards give floating-point advantages.

Losses are called through verl's registry (``get_policy_loss_fn``) as verl's worker calls them, and the
M2PO pre-pass's two core steps (:func:`token_log_ratio` per micro-batch, :func:`m2po_threshold` over the
gathered values) directly. Estimators are the core functions of every registered name. Expected values
are derived by hand in the comments.
"""

from __future__ import annotations

import math

import pytest
import torch

import verl  # noqa: F401  (loads the verl.plugins entry point: registers our names)
from verl_offpolicy.core import advantages as core_adv
from verl_offpolicy.core.losses import m2po_keep, token_log_ratio
from verl_offpolicy.glue.registration import ADV_ESTIMATORS, POLICY_LOSSES
from verl_offpolicy.tabular import actor

from tests.loss_helpers import call

F64 = torch.float64
NAN, NINF = math.nan, -math.inf


def _batch(bad_value, row=1, token=0):
    """Three responses of two tokens (the third's second token is padding, with −inf there: allowed);
    ``bad_value`` is the old log-prob of response token (``row``, ``token``)."""
    old = torch.tensor([[-1.0, -0.5], [-0.7, -1.2], [-0.3, NINF]], dtype=F64)
    old[row, token] = bad_value
    log_prob = torch.tensor([[-1.1, -0.4], [-0.6, -1.3], [-0.2, 0.0]], dtype=F64)
    mask = torch.tensor([[True, True], [True, True], [True, False]])
    adv = torch.tensor([[1.0], [-1.0], [0.5]], dtype=F64).expand(3, 2) * mask
    return old, log_prob, adv, mask


# ---------------------------------------------------------------- item 5: M2PO and a NaN old log-prob


def test_m2po_nan_old_log_prob_raises_naming_the_sample():
    # before: θ* = NaN, every token masked: loss 0, gradient 0, pg_clipfrac 1.0, no error
    old, log_prob, adv, mask = _batch(NAN)
    with pytest.raises(ValueError, match=r"1 sample\(s\) .*batch position 1, token 0: log_prob -0.6, old_log_prob nan"):
        call(actor("m2po"), old, log_prob, adv, mask)


def test_m2po_pre_pass_steps_raise_on_a_nan():
    # the engine's pre-pass computes token_log_ratio per micro-batch, then m2po_keep over the gathered
    # values: each raises, so a NaN cannot reach the cut (before: θ* = NaN, every token of the mini-batch dropped)
    old, log_prob, _, mask = _batch(NAN, row=2, token=0)
    with pytest.raises(ValueError, match=r"batch position 2, token 0"):
        token_log_ratio(log_prob, old, mask)
    with pytest.raises(ValueError, match=r"m2po: 1 of the mini-batch's 3 values .* not finite"):
        m2po_keep(torch.tensor([0.01, NAN, 0.02], dtype=F64), 0.04)
    with pytest.raises(ValueError, match=r"m2po: 1 of the mini-batch's 2 values .* not finite"):
        m2po_keep(torch.tensor([math.inf, 0.02], dtype=F64), 0.04)


def test_m2po_keep_of_finite_values_is_unchanged():
    # values 1, 0.01, 4, 0.0025, 0.01 with τ = 0.04 (as in test_algorithms_losses): sorted 0.0025, 0.01, 0.01,
    # 1, 4; prefix means 0.0025, 0.00625, 0.0075, 0.255…: the three small ones kept
    assert m2po_keep(torch.tensor([1.0, 0.01, 4.0, 0.0025, 0.01]), 0.04).tolist() == [False, True, False, True, True]


# ---------------------------------------------------------------- item 12: k2 / k2_seq and a −inf anchor


@pytest.mark.parametrize("regularizer", ["k2", "k2_seq"])
def test_minus_inf_anchor_on_a_response_token_raises_for_k2(regularizer):
    # before: (log π − (−inf))² = inf, an infinite loss
    old, log_prob, adv, mask = _batch(NINF, row=0, token=1)
    config = actor("rec", regularizer=regularizer, regularizer_coef=0.1)
    with pytest.raises(ValueError, match=r"batch position 0, token 1: log_prob -0.4, old_log_prob -inf"):
        call(config, old, log_prob, adv, mask)


def test_minus_inf_anchor_on_padding_is_still_allowed_for_k2():
    # the same batch with the −inf only on padding (row 2, token 1): k2 = 0.1·Σ_t (log π − log π_old)² over the
    # response tokens, gaps −0.1, 0.1, 0.1, −0.1, 0.1 → 0.1·5·0.01 = 0.005; REINFORCE part −Σ A·log π =
    # −(1·(−1.1 − 0.4) − 1·(−0.6 − 1.3) + 0.5·(−0.2)) = −(−1.5 + 1.9 − 0.1) = −0.3 (token-sum;
    # rec's defaults clip_mode none, weight none: every response token is kept with weight 1)
    old, log_prob, adv, mask = _batch(-0.7)
    loss, _, _ = call(actor("rec", regularizer="k2", regularizer_coef=0.1), old, log_prob, adv, mask)
    assert loss.item() == pytest.approx(-0.3 + 0.005, rel=1e-12)


# ---------------------------------------------------------------- every loss: non-finite inputs raise


@pytest.mark.parametrize("bad_value", [NAN, NINF, math.inf], ids=["nan", "-inf", "+inf"])
@pytest.mark.parametrize("loss_mode", POLICY_LOSSES)
def test_every_loss_raises_on_a_non_finite_old_log_prob(loss_mode, bad_value):
    old, log_prob, adv, mask = _batch(bad_value)
    with pytest.raises(ValueError, match=r"non-finite log-probability on a response token: batch position 1, token 0"):
        call(actor(loss_mode), old, log_prob, adv, mask)


@pytest.mark.parametrize("loss_mode", POLICY_LOSSES)
def test_every_loss_raises_on_a_nan_log_prob(loss_mode):
    old, log_prob, adv, mask = _batch(-0.7)
    log_prob[2, 0] = NAN
    with pytest.raises(ValueError, match=r"batch position 2, token 0: log_prob nan, old_log_prob -0.3"):
        call(actor(loss_mode), old, log_prob, adv, mask)


# ---------------------------------------------------------------- item 10: integer rewards


def _expected_integer_advantages():
    """A for r = [3, 0, 0, 0] in one group, per estimator, derived by hand (r̄ = 0.75, d = r − r̄)."""
    e3 = math.exp(3.0)
    d = [2.25, -0.75, -0.75, -0.75]
    # logavgexp, τ = 1: b = ln((e³ + 3)/4), A = r − b
    b = math.log((e3 + 3) / 4)
    return {
        # opmd, mean baseline: A = d
        ("opmd", "mean"): d,
        ("opmd", "logavgexp"): [3 - b, -b, -b, -b],
        # pmd_partition, τ = 1: A_0 = 3 − ln((1+1+1)/3) = 3; A_i = 0 − ln((e³ + 1 + 1)/3) for the others
        ("pmd_partition",): [3.0] + [-math.log((e3 + 2) / 3)] * 3,
        # asymre, shift 0.1: A = d − 0.1
        ("asymre",): [2.15, -0.85, -0.85, -0.85],
        # red_weight, T = 1: A = d·e^d
        ("red_weight",): [x * math.exp(x) for x in d],
        # agro off-policy: D_i = r_i − mean of the others: 3 − 0 = 3, 0 − 1 = −1
        ("agro", "off"): [3.0, -1.0, -1.0, -1.0],
        # agro on-policy, β = 1: A = D − (D² − c)/2, c_i = K/(K−1)·s²_{−i}: i = 0: others 0,0,0 → c = 0,
        # A = 3 − 9/2 = −1.5; i ≥ 1: others 3,0,0, mean 1, s² = (4+1+1)/2 = 3, c = 4/3·3 = 4 → A = −1 − (1−4)/2 = 0.5
        ("agro", "on"): [-1.5, 0.5, 0.5, 0.5],
        # pairwise_opmd, τ = 1: A = 2·K·τ·d/(1+τ)² = 2·4·d/4 = 2d
        ("pairwise_opmd",): [4.5, -1.5, -1.5, -1.5],
        # topr, raw reward, c = 0: A = r (no group statistic; 'signed' takes 0/1 rewards only)
        ("topr",): [3.0, 0.0, 0.0, 0.0],
        # oapl, β1 = 1: V̂* = ln((e³ + 3)/4) = b (the logavgexp baseline, the sample itself included), A = r − b
        ("oapl",): [3 - b, -b, -b, -b],
    }


def _core_call(key, scores, ids):
    name = key[0]
    if name == "opmd":
        return core_adv.opmd_advantage(scores, ids, baseline=key[1], tau=1.0)
    if name == "pmd_partition":
        return core_adv.pmd_partition_advantage(scores, ids, tau=1.0)
    if name == "asymre":
        return core_adv.asymre_advantage(scores, ids, shift=0.1)
    if name == "red_weight":
        return core_adv.red_weight_advantage(scores, ids, temperature=1.0)
    if name == "agro":
        return core_adv.agro_advantage(scores, ids, beta=1.0, on_policy=key[1] == "on")
    if name == "pairwise_opmd":
        return core_adv.pairwise_opmd_advantage(scores, ids, tau=1.0)
    if name == "topr":
        return core_adv.topr_advantage(scores, 0.0, "raw")
    if name == "oapl":
        return core_adv.oapl_advantage(scores, ids, beta1=1.0)
    raise AssertionError(name)


def test_every_registered_estimator_is_covered():
    covered = {key[0] for key in _expected_integer_advantages()} | {"red_drop"}
    assert covered == set(ADV_ESTIMATORS)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
@pytest.mark.parametrize("key", list(_expected_integer_advantages()), ids=lambda key: "-".join(key))
def test_integer_rewards_give_float_advantages(key, dtype):
    # before: the integer dtype (segment_max's −inf fill cannot be an integer) or a truncated [2, 0, 0, 0]
    scores = torch.tensor([3, 0, 0, 0], dtype=dtype)
    got = _core_call(key, scores, torch.zeros(4, dtype=torch.long))
    assert got.is_floating_point()
    torch.testing.assert_close(got, torch.tensor(_expected_integer_advantages()[key], dtype=got.dtype))


def test_bool_rewards_give_float_advantages():
    # r = [1, 0, 0, 0] (correct / wrong), opmd mean: r̄ = 0.25, A = [0.75, −0.25, −0.25, −0.25]
    got = core_adv.opmd_advantage(torch.tensor([True, False, False, False]), torch.zeros(4, dtype=torch.long))
    torch.testing.assert_close(got, torch.tensor([0.75, -0.25, -0.25, -0.25], dtype=F64))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool], ids=str)
def test_red_drop_integer_rewards(dtype):
    # r = [1, 0, 0, 0]: r̄ = 0.25, one positive, three negatives, so two negatives are dropped (A = 0) and one
    # is kept; mean of the kept rewards (1 + 0)/2 = 0.5 → A = 0.5 for the positive, −0.5 for the kept negative
    scores = torch.tensor([1, 0, 0, 0]).to(dtype)
    got = core_adv.red_drop_advantage(scores, torch.zeros(4, dtype=torch.long), torch.tensor([12345]))
    assert got.is_floating_point()
    assert got[0].item() == 0.5
    assert sorted(got[1:].tolist()) == [-0.5, 0.0, 0.0]


def test_integer_rewards_through_verls_registry():
    # opmd, mean baseline, r = [3, 0, 0, 0] in one group as int64 token rewards: A = [2.25, −0.75, −0.75, −0.75]
    import numpy as np
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    token_rewards = torch.tensor([[3], [0], [0], [0]])
    advantages, _ = get_adv_estimator_fn("opmd")(
        token_level_rewards=token_rewards,
        response_mask=torch.ones_like(token_rewards),
        index=np.array(["u"] * 4, dtype=object),
        config=OmegaConf.create({"adv_estimator": "opmd", "offpolicy": {}}),
    )
    assert advantages[:, 0].tolist() == [2.25, -0.75, -0.75, -0.75]


# ------------------------------------------------------------- a frozen rollout: the wait's bound


def test_the_generation_bound_follows_the_measured_generations():
    """A rollout frozen mid-run (SIGSTOP) used to hold the trainer for a fixed 3600 s. The bound on a wait
    without progress is the limit before anything is measured, then 10 x the slowest measured wait,
    between 300 s and the limit."""
    from verl_offpolicy.glue.scheduler.deadline import GenerationDeadline

    deadline = GenerationDeadline.from_env({})
    assert deadline.bound_s == 3600 and "no generation measured yet" in deadline.describe()
    deadline.observe(2.0)  # the CPU demo: seconds per batch
    assert deadline.bound_s == 300
    deadline.observe(45.0)
    deadline.observe(30.0)  # the slowest counts
    assert deadline.bound_s == 450
    assert "10 x the slowest generation so far, 45.0 s" in deadline.describe()
    deadline.observe(1000.0)
    assert deadline.bound_s == 3600


def test_the_generation_bound_set_in_the_environment_is_fixed_and_checked():
    from verl_offpolicy.glue.scheduler.deadline import GenerationDeadline

    deadline = GenerationDeadline.from_env({"VERL_OFFPOLICY_GENERATION_TIMEOUT": "120"})
    deadline.observe(1000.0)
    assert deadline.bound_s == 120 and "VERL_OFFPOLICY_GENERATION_TIMEOUT" in deadline.describe()
    for bad in ("-5", "0", "soon", "nan"):
        with pytest.raises(ValueError, match=f"VERL_OFFPOLICY_GENERATION_TIMEOUT must be a number of seconds > 0, got '{bad}'"):
            GenerationDeadline.from_env({"VERL_OFFPOLICY_GENERATION_TIMEOUT": bad})
