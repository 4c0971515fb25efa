"""No loss or estimator returns NaN/inf for any finite input of its documented dtype.

Everything goes through verl's registries (``get_policy_loss_fn``, ``get_adv_estimator_fn``) with the
names of ``registration`` and the choices of ``glue.config``, so a new loss, estimator, clip mode,
weight or regulariser is swept automatically. Losses: extreme log-ratios (±100, an old log-prob of
−1e4, −inf on padding), zero advantages, empty and all-padding batches, float32/float64/bfloat16; the
loss, its gradient (backward through the real loss) and every metric must be finite. Estimators:
rewards at each dtype's largest and smallest values, reward gaps of 2e30, token sums beyond the
dtype, empty batches, singleton groups, float16/bfloat16/float32/float64; the result must be finite in
the rewards' dtype, or a ValueError naming the estimator and the sample.

Expected values in the comments are derived by hand from the formulas and the ±20 log-ratio clamp.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the verl.plugins entry point: registers our names)
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.workers.utils.losses import ppo_loss

from tests.loss_helpers import LOSS, RESPONSE_LENS, call, compose_actor, engine_batch, nested
from verl_offpolicy.core.losses import m2po_mask, token_log_ratio
from verl_offpolicy.glue.algorithms.m2po import mini_batch_scope
from verl_offpolicy.glue.algorithms.rec import CLIP_MODES, REGULARIZERS, WEIGHTS
from verl_offpolicy.glue.registration import ADV_ESTIMATORS, POLICY_LOSSES
from verl_offpolicy.tabular import actor

F64 = torch.float64
E20 = math.exp(20.0)  # the largest ratio: log-ratios are clamped to [−20, 20] before exp
LOSS_DTYPES = [torch.float32, F64, torch.bfloat16]
REWARD_DTYPES = [torch.float16, torch.bfloat16, torch.float32, F64]
AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum"]


# ---------------------------------------------------------------- losses: hand-derived cases


def _one_token(log_prob, old, adv, dtype=F64):
    t = lambda v: torch.tensor([[v]], dtype=dtype)  # noqa: E731
    return t(old), t(log_prob), t(adv), torch.ones(1, 1, dtype=torch.bool)


def test_rec_importance_weight_is_clamped_at_e20():
    # log π − log π_old = −1 − (−101) = +100 → ρ = e^20 (clamped); A = 1, token-sum:
    # ℓ = −ρ·A·log π = e^20, ∂ℓ/∂log π = −e^20; ratio_max = e^20, ppo_kl = −20
    old, log_prob, adv, mask = _one_token(-1.0, -101.0, 1.0)
    loss, grad, metrics = call(actor("rec", weight="importance_sampling"), old, log_prob, adv, mask)
    assert loss.item() == pytest.approx(E20, rel=1e-12)
    assert grad.item() == pytest.approx(-E20, rel=1e-12)
    assert metrics["actor/ratio_max"] == pytest.approx(E20, rel=1e-12)
    assert metrics["actor/ppo_kl"] == pytest.approx(-20.0)
    # log π − log π_old = −100.5 − (−0.5) = −100 → ρ = e^−20; A = −1: ℓ = −e^−20·(−1)·(−100.5),
    # ppo_kl = 20
    old, log_prob, adv, mask = _one_token(-100.5, -0.5, -1.0)
    loss, grad, metrics = call(actor("rec", weight="importance_sampling"), old, log_prob, adv, mask)
    assert loss.item() == pytest.approx(-100.5 * math.exp(-20.0), rel=1e-12)
    assert grad.item() == pytest.approx(math.exp(-20.0), rel=1e-12)  # −ρ·A = e^−20
    assert metrics["actor/ppo_kl"] == pytest.approx(20.0)


@pytest.mark.parametrize("clip_mode", ["one-side", "none"])
@pytest.mark.parametrize("weight", ["importance_sampling", "gspo_importance_sampling"])
@pytest.mark.parametrize("dtype", LOSS_DTYPES, ids=str)
def test_zero_advantage_token_with_huge_ratio_gives_zero_not_nan(clip_mode, weight, dtype):
    # every answer correct: A = 0 on all tokens. One-side keeps A = 0 tokens whatever ρ, so ρ·A must be
    # a finite ρ times 0: loss 0, gradient 0 (unclamped, e^100 = inf in float32 and inf·0 = NaN).
    old = torch.tensor([[-101.0, -1e4, 0.0]], dtype=dtype)
    log_prob = torch.tensor([[-1.0, -2.0, 0.0]], dtype=dtype)
    mask = torch.tensor([[True, True, False]])
    adv = torch.zeros(1, 3, dtype=dtype)
    config = actor("rec", clip_mode=clip_mode, weight=weight)
    loss, grad, metrics = call(config, old, log_prob, adv, mask, "token-mean")
    assert loss.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))
    # both tokens at the clamp: ratio_mean = ratio_max = e^20 (in the dtype's precision)
    assert metrics["actor/ratio_max"] == pytest.approx(E20, rel=1e-2)
    assert metrics["actor/ratio_mean"] == pytest.approx(E20, rel=1e-2)


def test_gspo_sequence_ratio_is_clamped_at_e20():
    # two tokens with log-ratio +100 each: Δ/|y| = 100 → ρ̄ = e^20; A = 1, log π = [−1, −2], token-sum:
    # ℓ = e^20·(1 + 2) = 3e^20, ∂ℓ/∂log π_t = −e^20 on both tokens
    old = torch.tensor([[-101.0, -102.0]], dtype=F64)
    log_prob = torch.tensor([[-1.0, -2.0]], dtype=F64)
    adv, mask = torch.ones(1, 2, dtype=F64), torch.ones(1, 2, dtype=torch.bool)
    config = actor("rec", clip_mode="none", weight="gspo_importance_sampling")
    loss, grad, _ = call(config, old, log_prob, adv, mask)
    assert loss.item() == pytest.approx(3 * E20, rel=1e-12)
    torch.testing.assert_close(grad, torch.full((1, 2), -E20, dtype=F64))


@pytest.mark.parametrize("loss_mode", ["opmd", "pmd"])
def test_ratio_metrics_of_losses_without_a_ratio_are_finite(loss_mode):
    # tokens with log-ratio +100 and −100 (and an old log-prob of −1e4): ρ = e^20, e^−20, e^20
    # ratio_max = e^20, ratio_mean = (2e^20 + e^−20)/3, ppo_kl = −(20 − 20 + 20)/3
    old = torch.tensor([[-101.0, -0.5, -1e4]], dtype=F64)
    log_prob = torch.tensor([[-1.0, -100.5, -3.0]], dtype=F64)
    adv, mask = torch.ones(1, 3, dtype=F64), torch.ones(1, 3, dtype=torch.bool)
    _, _, metrics = call(actor(loss_mode, tau=1.0), old, log_prob, adv, mask)
    assert metrics["actor/ratio_max"] == pytest.approx(E20, rel=1e-12)
    assert metrics["actor/ratio_mean"] == pytest.approx((2 * E20 + math.exp(-20)) / 3, rel=1e-12)
    assert metrics["actor/ppo_kl"] == pytest.approx(-20.0 / 3)


def test_pmd_delta_is_not_clamped():
    # pmd has no ratio: Δ = −1 − (−1e4) = 9999 enters the quadratic as is. τ = 1, A = 0, |y| = 1:
    # L = ½·(0 − 9999)² = 49990000.5, ∂L/∂log π = −(A − τΔ)/|y| = 9999
    old, log_prob, adv, mask = _one_token(-1.0, -1e4, 0.0)
    loss, grad, _ = call(actor("pmd", tau=1.0), old, log_prob, adv, mask)
    assert loss.item() == pytest.approx(49990000.5, rel=1e-12)
    assert grad.item() == pytest.approx(9999.0, rel=1e-12)


def _configs():
    """Every registered loss with its defaults, and every rec clip_mode × weight × regularizer."""
    configs = {name: actor(name) for name in POLICY_LOSSES if name != "rec"}
    for clip_mode, weight, regularizer in itertools.product(CLIP_MODES, WEIGHTS, REGULARIZERS):
        coef = 0.0 if regularizer == "none" else 0.1
        configs[f"rec {clip_mode} {weight} {regularizer}"] = actor(
            "rec", clip_mode=clip_mode, weight=weight, regularizer=regularizer, regularizer_coef=coef
        )
    return configs


CONFIGS = _configs()


def _extreme_batches(dtype):
    """Named (old, log_prob, advantages, mask) batches of extreme but finite log-probs."""
    t = lambda rows: torch.tensor(rows, dtype=dtype)  # noqa: E731
    ninf = -math.inf
    old = t([[-101.0, -1.0, ninf], [-0.5, -1e4, -2.0], [-1e4, ninf, ninf], [ninf, ninf, ninf], [-1.0, -2.0, -3.0]])
    log_prob = t([[-1.0, -1.0, 0.0], [-100.5, -1.0, -2.0], [-3.0, 0.0, 0.0], [0.0, 0.0, 0.0], [-1.0, -2.0, -3.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool)
    batches = {}
    for adv_name, adv in {"zero": [0.0] * 5, "mixed": [0.0, 1.0, -1.0, 0.5, -1e3]}.items():
        a = t(adv).unsqueeze(-1).expand(5, 3) * mask
        batches[f"mixed rows, A {adv_name}"] = (old, log_prob, a, mask)
        batches[f"singleton, ratio e^100, A {adv_name}"] = (old[:1], log_prob[:1], a[:1], mask[:1])
    batches["old log-prob -1e4 everywhere"] = (torch.full_like(old, -1e4), log_prob, t([[1.0]] * 5).expand(5, 3), mask)
    batches["all padding"] = (old[3:4], log_prob[3:4], torch.zeros(1, 3, dtype=dtype), mask[3:4])
    batches["empty"] = (old[:0], log_prob[:0], old[:0].clone().zero_(), mask[:0])
    return batches


def _global_info(mask):
    """verl's global_batch_info for a micro-batch inside a global mini-batch with more responses."""
    return {"dp_size": 1, "batch_num_tokens": int(mask.sum()) + 3, "global_batch_size": int(mask.any(-1).sum()) + 1}


@pytest.mark.parametrize("dtype", LOSS_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_loss_is_finite_for_extreme_log_probs(name, dtype):
    # alone (no global_batch_info) and as a micro-batch of a larger global mini-batch, as verl's worker
    # calls it. Alone, a batch without any response token is verl's agg_loss 0/0 (its own losses too):
    # verl always passes the global token count, so that case is only run inside a global batch.
    config = CONFIGS[name]
    for (batch_name, (old, log_prob, adv, mask)), agg in itertools.product(_extreme_batches(dtype).items(), AGG_MODES):
        for global_info in ([{}] if mask.any() else []) + [_global_info(mask)]:
            config.global_batch_info.update(global_info)
            # m2po inside a larger mini-batch reads the mask of the engine's pre-pass (here: of this batch)
            keep = m2po_mask(token_log_ratio(log_prob, old, mask), adv, mask, 0.04, "trust_region")
            scope = mini_batch_scope(config, [keep]) if global_info else contextlib.nullcontext()
            try:
                with scope:
                    loss, grad, metrics = call(config, old, log_prob, adv, mask, agg)
            finally:
                config.global_batch_info.clear()
            where = f"{name}, {batch_name}, {agg}, global_batch_info={global_info}"
            assert torch.isfinite(loss).all(), (where, loss)
            assert torch.isfinite(grad).all(), (where, grad)
            assert all(math.isfinite(v) for v in metrics.values()), (where, metrics)


def test_padding_content_does_not_matter():
    # the same batch with −inf or 0 as the old log-prob of its padded tokens: same loss and gradient
    old = torch.tensor([[-1.2, -0.7, 0.0], [-0.3, 0.0, 0.0]], dtype=F64)
    log_prob = torch.tensor([[-1.0, -0.9, 0.0], [-0.4, 0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    adv = torch.tensor([[1.0], [-0.5]], dtype=F64).expand(2, 3) * mask
    padded_inf = torch.where(mask, old, -math.inf)
    for name, config in CONFIGS.items():
        expected = call(config, old, log_prob, adv, mask)
        got = call(config, padded_inf, log_prob, adv, mask)
        torch.testing.assert_close(got[0], expected[0], msg=name)
        torch.testing.assert_close(got[1], expected[1], msg=name)
        assert got[2] == expected[2], name


# ---------------------------------------------------------------- estimators


def estimate(name, token_rewards, uids, **offpolicy):
    config = OmegaConf.create({"adv_estimator": name, "offpolicy": offpolicy})
    advantages, returns = get_adv_estimator_fn(name)(
        token_level_rewards=token_rewards,
        response_mask=torch.ones_like(token_rewards),
        index=np.array(uids, dtype=object),
        config=config,
    )
    assert advantages.dtype == token_rewards.dtype and advantages.shape == token_rewards.shape
    assert torch.equal(advantages, returns)
    return advantages


def _column(values, dtype):
    return torch.tensor(values, dtype=dtype).unsqueeze(-1)


# Every registered estimator, with each of its forms. Positive homogeneity of each formula, with its
# hyperparameters that carry the reward's unit scaled by the same s > 0 (τ, T, β, shift):
#   opmd mean: A(sr) = sA(r); logavgexp: sτ·(logsumexp(sr/(sτ)) − log K) = s·b(r; τ)
#   pmd_partition: −sτ·log mean_{j≠i} exp((sr_j − sr_i)/(sτ)) = s·A(r; τ)
#   asymre: sr − (s·r̄ + s·shift); red_weight: s·d·exp(min(sd/(sT), 20)) = s·A(r; T)
#   red_drop: r ≥ r̄ ⇔ sr ≥ s·r̄, the same drop, kept means scale; agro: sD − (s²D² − s²c)/(2sβ) = s·A;
#   pairwise_opmd: linear in the (already regularised) rewards at fixed τ; topr raw: sr − sc = s·(r − c)
ESTIMATOR_CASES = {
    "opmd mean": ("opmd", {"baseline": "mean"}, ()),
    "opmd logavgexp": ("opmd", {"baseline": "logavgexp", "tau": 1.0}, ("tau",)),
    "pmd_partition": ("pmd_partition", {"tau": 0.5}, ("tau",)),
    "asymre": ("asymre", {"shift": -0.1}, ("shift",)),
    "red_drop": ("red_drop", {"seed": 3}, ()),
    "red_weight": ("red_weight", {"temperature": 1.0}, ("temperature",)),
    "agro off-policy": ("agro", {"beta": 0.5}, ("beta",)),
    "agro on-policy": ("agro", {"beta": 0.5, "on_policy": True}, ("beta",)),
    # pairwise_opmd: 2Kτ(sa − s·ā)/(1+τ)² = s·A(a; τ), τ fixed (the KL term is already inside the reward)
    "pairwise_opmd": ("pairwise_opmd", {"tau": 1.0}, ()),
    "topr raw": ("topr", {"topr_reward": "raw", "topr_baseline": 0.5}, ("topr_baseline",)),
    # oapl: r − β1·log mean exp(r/β1) = s·A(r0; β1/s) at β1 scaled with the rewards
    "oapl": ("oapl", {"oapl_beta1": 0.5}, ("oapl_beta1",)),
}


def test_every_registered_estimator_is_swept():
    assert {case[0] for case in ESTIMATOR_CASES.values()} == set(ADV_ESTIMATORS)


R0 = [1.0, 2.0, 6.0, 4.0, 0.0, 0.0, 1.0, 3.0]
UIDS0 = ["a", "a", "a", "b", "c", "c", "c", "c"]


@pytest.mark.parametrize("dtype", REWARD_DTYPES, ids=str)
@pytest.mark.parametrize("case", list(ESTIMATOR_CASES))
def test_estimators_scale_to_the_edge_of_the_dtype(case, dtype):
    # r = s·r0 with s a power of two (exact in every dtype) as large as the dtype allows with room for
    # |A| (float64: s = 2^500, D² ≈ 1e303 still finite); the result must be s·A(r0), the small-scale
    # advantage (hand-checked in test_algorithms_estimators) scaled, rounded to the dtype.
    name, params, scaled = ESTIMATOR_CASES[case]
    base = estimate(name, _column(R0, F64), UIDS0, **params)[:, 0]
    largest = max(max(abs(r) for r in R0), base.abs().max().item())
    exponent = 500 if dtype == F64 else math.floor(math.log2(torch.finfo(dtype).max / (4 * largest)))
    s = 2.0**exponent
    scaled_params = {k: v * s if k in scaled else v for k, v in params.items()}
    got = estimate(name, _column(R0, dtype) * s, UIDS0, **scaled_params)[:, 0]
    torch.testing.assert_close(got, (base * s).to(dtype), msg=f"{case} at s = 2^{exponent} in {dtype}")


def _subnormal(dtype):
    info = torch.finfo(dtype)
    return info.tiny * info.eps  # the smallest positive value of the dtype


def _extreme_rewards(dtype):
    """Named ([B, T] token rewards, uids) of extreme finite rewards in ``dtype`` (groups of 1 or ≥ 3)."""
    top = torch.finfo(dtype).max
    tiny = _subnormal(dtype)
    gap = 2e30 if dtype != torch.float16 else 6e4
    col = lambda v: _column(v, dtype)  # noqa: E731
    return {
        "±max in one group, singletons at ±max": (col([top, -top, 0.0, top / 2, top, -top]), list("aaaabc")),
        "all at max": (col([top, top, top]), list("ggg")),
        "gap 2e30 (6e4 in float16)": (col([0.0, gap, gap / 2, -gap, gap, 0.0]), list("aaabbb")),
        "subnormal rewards": (col([tiny, 0.0, -tiny, tiny, tiny]), list("aaabc")),
        "token sum beyond the dtype": (
            torch.tensor([[0.75, 0.75], [0.7, 0.7], [0.7, 0.6]], dtype=F64).mul(top).to(dtype),
            list("ggg"),
        ),
        "singletons": (col([top, -top, tiny, 0.0]), list("abcd")),
        "empty": (torch.zeros(0, 2, dtype=dtype), []),
    }


@pytest.mark.parametrize("dtype", REWARD_DTYPES, ids=str)
@pytest.mark.parametrize("case", list(ESTIMATOR_CASES))
def test_every_estimator_is_finite_or_a_clear_error_on_extreme_rewards(case, dtype):
    name, params, _ = ESTIMATOR_CASES[case]
    for label, (rewards, uids) in _extreme_rewards(dtype).items():
        try:
            advantages = estimate(name, rewards, uids, **params)
        except ValueError as error:
            assert re.match(rf"adv_estimator={name}: \d+ sample\(s\) ", str(error)), (label, error)
            assert re.search(r"batch position \d+ \(uid '\w+'\)", str(error)), (label, error)
            continue
        assert torch.isfinite(advantages).all(), (case, label, advantages)


def test_extreme_rewards_that_fit_give_the_exact_advantage():
    # float32, r = [3e38, −3e38]: r̄ = 0 → opmd A = r (the centred −6e38 overflows float32); asymre adds 0.1
    r = _column([3e38, -3e38], torch.float32)
    expected = torch.tensor([3e38, -3e38])
    torch.testing.assert_close(estimate("opmd", r, ["g", "g"])[:, 0], expected)
    torch.testing.assert_close(estimate("asymre", r, ["g", "g"], shift=-0.1)[:, 0], expected)
    # red_drop, one positive one negative: nothing dropped, A = r − r̄ = r
    torch.testing.assert_close(estimate("red_drop", r, ["g", "g"])[:, 0], expected)
    # token sums of 4e38 and 3.9e38 (beyond float32) in one group: r̄ = 3.95e38, A = ±5e36
    tokens = torch.tensor([[2e38, 2e38], [1.95e38, 1.95e38]])
    torch.testing.assert_close(estimate("opmd", tokens, ["g", "g"])[:, 0], torch.tensor([5e36, -5e36]))


def test_red_weight_gap_beyond_float32_is_a_clear_error():
    # r = [0, 2e30]: d = ±1e30, A_1 = 1e30·e^20 ≈ 4.85e38 > float32's 3.4e38
    with pytest.raises(
        ValueError,
        match=r"adv_estimator=red_weight: 1 sample\(s\) .*float32.*batch position 1 "
        r"\(uid 'g'\): reward 2e\+30, advantage 4\.85165e\+38",
    ):
        estimate("red_weight", _column([0.0, 2e30], torch.float32), ["g", "g"])
    # in float64 it fits: A = [−1e30·e^(−1e30) = −0, 1e30·e^20]
    a = estimate("red_weight", _column([0.0, 2e30], F64), ["g", "g"])[:, 0]
    assert a[0].item() == 0.0 and a[1].item() == pytest.approx(1e30 * E20, rel=1e-12)


def test_agro_on_policy_squares_do_not_overflow():
    # float32, R = 2^62·[1, 2, 6] (D² ≈ 4e38 overflows float32): with β = 2^62·0.5 the result is 2^62 times
    # the one at R = [1, 2, 6], β = 0.5 (homogeneity, see ESTIMATOR_CASES)
    s = 2.0**62
    base = estimate("agro", _column([1.0, 2.0, 6.0], F64), ["g"] * 3, beta=0.5, on_policy=True)[:, 0]
    got = estimate("agro", _column([s, 2 * s, 6 * s], torch.float32), ["g"] * 3, beta=0.5 * s, on_policy=True)
    torch.testing.assert_close(got[:, 0], (base * s).float())
    # an advantage of order D²/β beyond float32 is an error, not NaN: R = [1e20, 0], β = 0.1
    with pytest.raises(ValueError, match=r"adv_estimator=agro: .*batch position \d \(uid 'g'\)"):
        estimate("agro", _column([1e20, 0.0, -1e20], torch.float32), ["g"] * 3, beta=0.1, on_policy=True)


@pytest.mark.parametrize("name", ADV_ESTIMATORS)
@pytest.mark.parametrize("dtype", REWARD_DTYPES, ids=str)
def test_empty_batch_gives_an_empty_result(name, dtype):
    advantages = estimate(name, torch.zeros(0, 4, dtype=dtype), [])
    assert advantages.shape == (0, 4)


# ---------------------------------------------------------------- through verl's ppo_loss (the worker's call)


@pytest.mark.parametrize("clip_mode", ["one-side", "none"])
def test_stale_ratios_through_verl_ppo_loss(clip_mode):
    # the engine's nested batch with old log-probs 100 below the model's (ρ = e^100 before the clamp) and
    # −inf on the masked tokens. A = 0 (an all-correct batch): loss and gradient exactly 0. A = 1 with
    # no clipping: loss = Σ_kept −e^20·log π / N (token-mean over the N response tokens).
    config = compose_actor(
        "rec", "token-mean", [f"+{LOSS}.clip_mode={clip_mode}", f"+{LOSS}.weight=importance_sampling"]
    )
    for advantage in (0.0, 1.0):
        model_output, data, values, padded = engine_batch(seed=1)
        old = [values.detach()[pos] - 100.0 for pos in padded["positions"]]
        for row, mask in zip(old, padded["mask"], strict=True):
            row[~mask[: row.numel()]] = -math.inf
        data["old_log_probs"] = nested(old)
        masks = padded["mask"]
        data["advantages"] = nested([advantage * m[:n].float() for n, m in zip(RESPONSE_LENS, masks, strict=True)])
        loss, metrics = ppo_loss(config, model_output, data)
        (grad,) = torch.autograd.grad(loss, values)
        assert torch.isfinite(grad).all(), grad
        assert metrics["actor/ratio_max"].values == [pytest.approx(E20, rel=1e-6)]
        if advantage == 0.0 or clip_mode == "one-side":  # one-side masks A > 0 tokens at ρ = e^20 > 1.2
            assert loss.item() == 0.0 and torch.all(grad == 0)
        else:
            positions = zip(padded["positions"], masks, strict=True)
            kept = torch.cat([values.detach()[pos][m[: pos.numel()]] for pos, m in positions])
            assert loss.item() == pytest.approx((-E20 * kept).sum().item() / padded["num_tokens"], rel=1e-6)


def test_anchor_lag_metric_ignores_minus_inf_on_masked_tokens():
    # offpolicy/anchor_log_ratio/mean over the nested batch the trainer holds: responses of 2 and 1 tokens,
    # the second token of the first masked with an anchor log-prob of −inf. Gaps on the two response
    # tokens: −1 − (−1.5) = 0.5 and −0.2 − (−0.7) = 0.5 → mean 0.5 (inf·0 = NaN before the fix)
    from verl_offpolicy.glue.scheduler.trainer import _masked_mean_gap

    proximal = nested([torch.tensor([-1.0, -2.0]), torch.tensor([-0.2])])
    anchored = nested([torch.tensor([-1.5, -math.inf]), torch.tensor([-0.7])])
    mask = nested([torch.tensor([1, 0]), torch.tensor([1])])
    assert _masked_mean_gap(proximal, anchored, mask) == pytest.approx(0.5)
