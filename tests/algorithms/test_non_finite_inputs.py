"""Non-finite log-probs raise naming the sample, in every loss (M2PO's pre-pass and the k2 regularisers too).

Losses are called through verl's registry (``get_policy_loss_fn``) as verl's worker calls them, and the M2PO
pre-pass's two core steps (:func:`token_log_ratio` per micro-batch, :func:`m2po_threshold` over the gathered
values) directly. Expected values are derived by hand in the comments.
"""

from __future__ import annotations

import math

import pytest
import torch
import verl  # noqa: F401  (loads the verl.plugins entry point: registers our names)

from tests.loss_helpers import call
from verl_offpolicy.core.losses import m2po_keep, token_log_ratio
from verl_offpolicy.glue.registration import POLICY_LOSSES
from verl_offpolicy.tabular import actor

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


# ---------------------------------------------------------------- M2PO and a NaN old log-prob


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


# ---------------------------------------------------------------- k2 / k2_seq and a −inf anchor


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
