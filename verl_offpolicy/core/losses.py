"""Policy losses of ``docs/algorithms.md``: pure per-token math (torch only, no verl).

Inputs are [B, T] token tensors: ``log_prob`` = log π_θ (the only path of the gradient),
``old_log_prob`` = log π_old, ``advantages`` (per-sequence A broadcast over tokens), ``mask`` m
(bool). Every ratio, mask and weight is computed from detached values. Functions return per-token
loss matrices (aggregation over the batch is the caller's, with verl's ``agg_loss``), keep masks
and metric tensors. Padded tokens (m = 0) get a zero loss coefficient, so a response whose mask is
all zero contributes nothing and produces no NaN (``log_prob`` must be finite on padding, as verl's
zero padding is); ``old_log_prob`` may be anything on padding, even −inf: it is selected away
before any arithmetic uses it. On response tokens both log-probs must be finite: every loss forms
log π_t − log π_old,t through :func:`token_log_ratio` or :func:`sequence_delta`, which raise a
ValueError naming the samples with a NaN or ±inf there (:class:`NonFiniteLogProb`), never a NaN
loss, an infinite one or a silently masked batch.

Every ratio is finite by construction: a log-ratio is clamped to [−20, 20] (``LOG_RATIO_BOUND``, the
bound of verl's own losses) before ``exp``, so ρ ∈ [e⁻²⁰, e²⁰] ≈ [2.1e−9, 4.9e8] even for a token with
log π − log π_old = ±100 or an old log-prob of −1e4, and a kept token with A = 0 contributes 0, not
inf·0 = NaN. The band masks compare these clamped ratios (the same verdict as the raw ratio for every
band edge within [e⁻²⁰, e²⁰]). Log-probs are float32, float64 or bfloat16 (verl's float32; e²⁰
exceeds float16's range, so float16 is rejected by the glue).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

# |log ρ| ≤ 20 before exp, as in verl's ppo losses (core_algos.compute_policy_loss_vanilla and others).
LOG_RATIO_BOUND = 20.0


_MAX_REPORTED = 5  # samples named in an error


class NonFiniteLogProb(ValueError):
    """A NaN or ±inf log-probability (current or old) on a response token."""


def check_finite_response(difference: Tensor, log_prob: Tensor, old_log_prob: Tensor, mask: Tensor) -> None:
    """Raise :class:`NonFiniteLogProb` naming the samples whose log π_t − log π_old,t is NaN or ±inf on a
    response token.

    ``difference`` is that difference with 0 on padding (where anything is allowed); it is NaN or ±inf
    exactly where one of the log-probs is (or where finite ones overflow). One device sync when all is finite.
    """
    finite = torch.isfinite(difference)
    if bool(finite.all()):
        return
    bad = mask & ~finite
    rows = bad.any(-1).nonzero().flatten().tolist()

    def describe(row: int) -> str:
        token = int(bad[row].nonzero()[0, 0])
        return (
            f"batch position {row}, token {token}: log_prob {float(log_prob[row, token].detach())}, "
            f"old_log_prob {float(old_log_prob[row, token])} ({int(bad[row].sum())} such token(s))"
        )

    listed = "; ".join(describe(row) for row in rows[:_MAX_REPORTED])
    more = f"; and {len(rows) - _MAX_REPORTED} more" if len(rows) > _MAX_REPORTED else ""
    raise NonFiniteLogProb(
        f"policy loss: {len(rows)} sample(s) have a non-finite log-probability on a response token: {listed}{more}. "
        "The loss needs finite log_prob and old_log_prob on every response token (padding may hold anything): "
        "check the model's outputs and where old_log_prob comes from (a token the old policy gave probability 0 "
        "cannot have been sampled from it)."
    )


def token_log_ratio(log_prob: Tensor, old_log_prob: Tensor, mask: Tensor) -> Tensor:
    """log ρ_t = m·(log π_t − log π_old,t), detached (0 on padded tokens); not clamped.

    Raises :class:`NonFiniteLogProb` if a response token's log-probs are not finite (:func:`check_finite_response`).
    """
    log_ratio = torch.where(mask, log_prob.detach() - old_log_prob, 0.0)
    check_finite_response(log_ratio, log_prob, old_log_prob, mask)
    return log_ratio


def clamp_log_ratio(log_ratio: Tensor) -> Tensor:
    """clamp(log ρ, −20, 20) (``LOG_RATIO_BOUND``): its exp is finite, in [e⁻²⁰, e²⁰], even for ±inf."""
    return log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def sequence_log_ratio(log_ratio: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Δ_i = Σ_t m·log ρ_t and |y_i| = Σ_t m (as a float, ≥ 1 to keep empty responses finite)."""
    return log_ratio.sum(-1), mask.sum(-1).to(log_ratio.dtype).clamp_min(1)


def reinforce_loss(log_prob: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """ℓ_t = −A·log π_t on response tokens (0 on padding, whatever the padding's log-prob holds: NaN or ±inf too)."""
    return torch.where(mask, -advantages * log_prob, 0.0)


def opmd_loss(log_prob: Tensor, advantages: Tensor, mask: Tensor, tau: float) -> Tensor:
    """``opmd``: ℓ_t = −A·log π_t/(1 + τ), τ ≥ 0 (REINFORCE scaled by 1/(1+τ))."""
    return reinforce_loss(log_prob, advantages, mask) / (1.0 + tau)


def sequence_delta(log_prob: Tensor, old_log_prob: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(Δ_i = Σ_t m·(log π_t − log π_old,t) with its gradient, |y_i| ≥ 1): the regularised sequence terms' input.

    Raises :class:`NonFiniteLogProb` if a response token's log-probs are not finite (:func:`check_finite_response`).
    """
    difference = torch.where(mask, log_prob - old_log_prob, 0.0)
    check_finite_response(difference.detach(), log_prob, old_log_prob, mask)
    return difference.sum(-1), mask.sum(-1).to(log_prob.dtype).clamp_min(1)


def sequence_mean(values: Tensor, mask: Tensor, length: Tensor) -> Tensor:
    """Σ_t m·v_t / |y_i| per response (A_i from a broadcast per-sequence advantage)."""
    return torch.where(mask, values, 0.0).sum(-1) / length


def spread_over_tokens(seq_loss: Tensor, mask: Tensor, length: Tensor) -> Tensor:
    """L_i/|y_i| on each of the response's tokens (0 on padding): the token sum over a response is L_i."""
    return torch.where(mask, (seq_loss / length).unsqueeze(-1), 0.0)


def pmd_loss(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, tau: float) -> Tensor:
    """``pmd``: L_i = ½·τ·(A_i/τ − Δ_i)²/|y_i|, spread as L_i/|y_i| over the response's tokens.

    A_i is the masked mean of ``advantages`` over the sequence and Δ_i = Σ_t m·(log π_t − log π_old,t)
    carries the gradient: ∂L_i/∂Δ_i = −(A_i − τΔ_i)/|y_i|. The token sum of the returned matrix over
    a response is L_i, so aggregating it with ``seq-mean-token-sum`` gives the mean of L_i over
    sequences. τ > 0.

    Δ_i is not clamped (pmd has no ratio): it is the quadratic's argument, finite for finite log-probs
    (an old log-prob of −1e4 adds 1e4 per token), and a clamp would cancel the gradient that pulls π back
    to π_old exactly where it is largest. Padded tokens are selected away before Δ's sum, so −inf there
    is harmless; −inf on a response token (the anchor gave it probability 0) is not a finite input and
    raises (:func:`sequence_delta`).
    """
    delta, length = sequence_delta(log_prob, old_log_prob, mask)
    seq_loss = 0.5 * tau * (sequence_mean(advantages, mask, length) / tau - delta) ** 2 / length
    return spread_over_tokens(seq_loss, mask, length)


def oapl_loss(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, beta2: float) -> Tensor:
    """``oapl``: L_i = (β2·Δ_i − A_i)², spread as L_i/|y_i| over the response's tokens; β2 > 0.

    OAPL (Ritter et al., arXiv 2602.19362) regresses the policy's scaled sequence log-ratio on the optimal
    advantage: Δ_i = Σ_t m·(log π_t − log π_old,t) against the lagged policy that generated y_i (the ratio
    anchor), A_i = r_i − V̂*(x_i) the masked mean of ``advantages`` (the ``oapl`` estimator's). Its minimiser
    is β2·log(π/π_old) = A*, the closed form π ∝ π_old·exp(r/β2) when V̂* is the β2-value. The token sum
    of the returned matrix over a response is L_i, so ``seq-mean-token-sum`` gives the mean of L_i over
    sequences (the authors' ``loss.mean()``). ∂L_i/∂log π_t = 2β2·(β2·Δ_i − A_i) on each response token.
    Δ_i is not clamped (as in :func:`pmd_loss`).
    """
    delta, length = sequence_delta(log_prob, old_log_prob, mask)
    seq_loss = (beta2 * delta - sequence_mean(advantages, mask, length)) ** 2
    return spread_over_tokens(seq_loss, mask, length)


def sequence_k2(log_prob: Tensor, old_log_prob: Tensor, mask: Tensor, coef: float) -> Tensor:
    """``k2_seq``: c·Δ_i²/|y_i| per response, Δ_i = Σ_t m·(log π_t − log π_old,t), spread as c·Δ_i²/|y_i|² per token.

    The sequence-level squared log-ratio with OpenKimi's length normalisation 1/|y_i| (Kimi k1.5's objective
    has (τ/2)·Δ_i², no 1/|y_i|). A response's token sum is c·Δ_i²/|y_i|,
    so with equal per-token log-ratios it equals the token-level ``k2`` sum Σ_t c·(log π_t − log π_old,t)²
    under every aggregation. ∂/∂log π_t = 2c·Δ_i/|y_i| on each of the response's tokens (token sum).
    """
    delta, length = sequence_delta(log_prob, old_log_prob, mask)
    return torch.where(mask, (coef * delta.square() / length.square()).unsqueeze(-1), 0.0)


def rec_keep_mask(
    ratio: Tensor,
    advantages: Tensor,
    *,
    clip_mode: str,
    clip_ratio_low: float,
    clip_ratio_high: float,
    ring_clip_ratio_low: float,
    ring_clip_ratio_high: float,
) -> Tensor | None:
    """M_t of ``rec`` from the ratio ρ (ρ_t, or ρ̄_i broadcast for ``gspo-one-side``); None means all ones.

    - one-side (and gspo-one-side): (A ≥ 0 and ρ ≤ 1+ε_high) or (A ≤ 0 and ρ ≥ 1−ε_low)
    - two-side: 1−ε_low ≤ ρ ≤ 1+ε_high
    - ring: two-side, or (A ≥ 0 and ρ ≤ 1−ε′_low), or (A ≤ 0 and ρ ≥ 1+ε′_high)
    """
    if clip_mode == "none":
        return None
    below_high = ratio <= 1.0 + clip_ratio_high
    above_low = ratio >= 1.0 - clip_ratio_low
    if clip_mode in ("one-side", "gspo-one-side"):
        return ((advantages >= 0) & below_high) | ((advantages <= 0) & above_low)
    band = below_high & above_low
    if clip_mode == "two-side":
        return band
    if clip_mode == "ring":
        rescued_pos = (advantages >= 0) & (ratio <= 1.0 - ring_clip_ratio_low)
        rescued_neg = (advantages <= 0) & (ratio >= 1.0 + ring_clip_ratio_high)
        return band | rescued_pos | rescued_neg
    raise ValueError(f"unknown rec clip_mode {clip_mode!r}")


class RecTerms(NamedTuple):
    """Per-token pieces of the ``rec`` loss (all [B, T])."""

    loss: Tensor  # ℓ_t = −M_t·w_t·A·log π_t + reg_t
    keep: Tensor | None  # M_t (None: every token kept)
    band_ratio: Tensor  # the ratio the mask compared: ρ_t, or ρ̄_i for gspo-one-side
    log_ratio: Tensor  # log ρ_t (detached, 0 on padding, clamped to ±20)
    ratio: Tensor  # ρ_t = exp(log ρ_t) (detached, 1 on padding)


def rec_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_mode: str,
    weight: str,
    regularizer: str,
    regularizer_coef: float,
    clip_ratio_low: float,
    clip_ratio_high: float,
    ring_clip_ratio_low: float,
    ring_clip_ratio_high: float,
) -> RecTerms:
    """``rec``: ℓ_t = −M_t·w_t·A·log π_t + reg_t.

    ρ_t = exp(clamp(log π_t − log π_old,t, −20, 20)), ρ̄_i = exp(clamp(Δ_i/|y_i|, −20, 20)) (finite).
    w_t: ``none`` → 1, ``importance_sampling`` → ρ_t, ``gspo_importance_sampling`` → ρ̄_i.
    reg_t: ``none`` → 0, ``forward-kl`` → −c·log π_t, ``k2`` → c·(log π_t − log π_old,t)², ``k2_seq`` →
    c·Δ_i²/|y_i|² (:func:`sequence_k2`: c·Δ_i²/|y_i| per response).
    M_t, w_t are detached; the gradient is −M_t·w_t·A·∇log π_t + ∇reg_t. A NaN or ±inf log-prob on a
    response token raises (:func:`token_log_ratio`, before any term is formed): k2 and k2_seq would be inf.
    """
    log_ratio = token_log_ratio(log_prob, old_log_prob, mask)
    clamped_log_ratio = clamp_log_ratio(log_ratio)
    ratio = torch.exp(clamped_log_ratio)
    needs_seq_ratio = clip_mode == "gspo-one-side" or weight == "gspo_importance_sampling"
    if needs_seq_ratio:
        delta, length = sequence_log_ratio(log_ratio, mask)
        seq_ratio = torch.exp(clamp_log_ratio(delta / length)).unsqueeze(-1).expand_as(ratio)
    band_ratio = seq_ratio if clip_mode == "gspo-one-side" else ratio
    keep = rec_keep_mask(
        band_ratio,
        advantages,
        clip_mode=clip_mode,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        ring_clip_ratio_low=ring_clip_ratio_low,
        ring_clip_ratio_high=ring_clip_ratio_high,
    )

    if weight == "none":
        coef = advantages
    elif weight == "importance_sampling":
        coef = ratio * advantages
    elif weight == "gspo_importance_sampling":
        coef = seq_ratio * advantages
    else:
        raise ValueError(f"unknown rec weight {weight!r}")
    active = mask if keep is None else mask & keep
    loss = torch.where(active, -coef * log_prob, 0.0)  # 0 off the mask, whatever the padding's log-prob holds

    if regularizer == "forward-kl":
        loss = loss - torch.where(mask, regularizer_coef * log_prob, 0.0)
    elif regularizer == "k2":
        loss = loss + regularizer_coef * torch.where(mask, log_prob - old_log_prob, 0.0).square()
    elif regularizer == "k2_seq":
        loss = loss + sequence_k2(log_prob, old_log_prob, mask, regularizer_coef)
    elif regularizer != "none":
        raise ValueError(f"unknown rec regularizer {regularizer!r}")
    return RecTerms(loss, keep, band_ratio, clamped_log_ratio, ratio)


def topr_weight(log_ratio: Tensor, mask: Tensor, advantages: Tensor) -> Tensor:
    """``topr`` weight w_i = 1 if A_i ≥ 0, else min(1, exp(Δ_i)) = exp(clamp(Δ_i, −20, 0)), broadcast [B, T].

    Δ_i = Σ_t m·log ρ_t is the detached sequence log-ratio log π(y_i)/μ(y_i) (Le Roux et al., arXiv
    2503.14286, eq. TOPR: the sequence ratio truncated to [0, 1] on negative rewards only). A_i is the
    sequence advantage (the first response token's value; advantages are per sequence).
    """
    delta, _ = sequence_log_ratio(log_ratio, mask)
    truncated = torch.exp(clamp_log_ratio(delta).clamp_max(0.0))
    seq_advantage = torch.where(mask, advantages, 0.0).sum(-1) / mask.sum(-1).clamp_min(1)
    weight = torch.where(seq_advantage >= 0, torch.ones_like(truncated), truncated)
    return weight.unsqueeze(-1).expand_as(log_ratio)


def topr_loss(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """``topr``: ℓ_t = −w_i·A·log π_t (w_i of :func:`topr_weight`, detached); returns (ℓ, w)."""
    weight = topr_weight(token_log_ratio(log_prob, old_log_prob, mask), mask, advantages)
    return -torch.where(mask, weight * advantages, 0.0) * log_prob, weight


M2PO_TOKEN_POOLS = ("trust_region", "all")


def m2po_pool(log_ratio: Tensor, advantages: Tensor, mask: Tensor, pool: str) -> Tensor:
    """The tokens M2PO may mask: ``trust_region`` = m·((A > 0 ∧ ρ > 1) ∨ (A < 0 ∧ ρ < 1)), ``all`` = m.

    ``trust_region`` is the pool of Algorithm 1 (line 2) as the authors' code defines it: the harmful
    tokens, whose update moves ρ further from 1. A token outside the pool is never masked.
    """
    if pool == "all":
        return mask
    if pool != "trust_region":
        raise ValueError(f"m2po token pool must be one of {', '.join(M2PO_TOKEN_POOLS)}, got {pool!r}")
    return mask & (((advantages > 0) & (log_ratio > 0)) | ((advantages < 0) & (log_ratio < 0)))


def m2po_keep(log_ratio_sq: Tensor, budget: float) -> Tensor:
    """Algorithm 1 of M2PO: while mean (log ρ_t)² of the kept values > τ_M2, remove the largest, one at a time.

    ``log_ratio_sq`` are the pool's values (1-D) in the mini-batch's token order; returns the keep mask [n].
    Prefix means of the ascending values never decrease, so the loop keeps the k smallest values,
    k = #{prefix means ≤ τ_M2}; of equal values at the cut, the later token in the order is removed first
    (a stable sort), so ties are removed one at a time and the result is a function of the order alone.
    Nothing is removed when the mean of all values is ≤ τ_M2 or there are none.

    A NaN or inf value (from a non-finite log-prob) raises ValueError: it would make the mean NaN and drop
    every token of the mini-batch. The values come from :func:`token_log_ratio`, which names the sample first.
    """
    values = log_ratio_sq.detach().double().flatten()
    n = values.numel()
    keep = torch.ones(n, dtype=torch.bool, device=values.device)
    if n and not bool(torch.isfinite(values).all()):
        bad = int((~torch.isfinite(values)).sum())
        raise ValueError(
            f"m2po: {bad} of the mini-batch's {n} values (log π_t − log π_old,t)² are not finite: the trust-region "
            "cut needs finite log-probs on every response token (check log_prob and old_log_prob)"
        )
    if n == 0 or float(values.mean()) <= budget:
        return keep
    ascending, order = torch.sort(values, stable=True)
    prefix_mean = ascending.cumsum(0) / torch.arange(1, n + 1, dtype=values.dtype, device=values.device)
    kept = int((prefix_mean <= budget).sum())
    keep[order[kept:]] = False
    return keep


def m2po_mask(log_ratio: Tensor, advantages: Tensor, mask: Tensor, budget: float, pool: str) -> Tensor:
    """M_t of one whole mini-batch [B, T]: :func:`m2po_keep` over the pool's tokens in row-major order, 1 elsewhere."""
    in_pool = m2po_pool(log_ratio, advantages, mask, pool)
    return scatter_pool_keep(in_pool, m2po_keep(log_ratio[in_pool].square(), budget))


def scatter_pool_keep(in_pool: Tensor, pool_keep: Tensor) -> Tensor:
    """M_t [B, T] from the pool's keep flags (row-major order): tokens outside the pool are kept."""
    keep = torch.ones_like(in_pool)
    keep[in_pool] = pool_keep
    return keep


def m2po_loss(
    log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, mask: Tensor, keep: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``m2po``: ℓ_t = −M_t·ρ_t·A·log π_t with the mini-batch's mask M (``keep``, :func:`m2po_mask`).

    The importance-weighted objective without PPO clipping on the kept tokens (gradient −M_t·ρ_t·A·∇log π_t,
    ρ_t = exp(clamp(log ρ_t, ±20)) detached). Returns (ℓ, M, clamped log ρ, ρ).
    """
    log_ratio = token_log_ratio(log_prob, old_log_prob, mask)
    clamped = clamp_log_ratio(log_ratio)
    ratio = torch.exp(clamped)
    return -torch.where(mask & keep, ratio * advantages, 0.0) * log_prob, keep, clamped, ratio


METRIC_NAMES = (
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_upper",
    "actor/pg_clipfrac_lower",
    "actor/ratio_mean",
    "actor/ratio_max",
    "actor/ppo_kl",
)


def ratio_metrics(
    log_ratio: Tensor, ratio: Tensor, mask: Tensor, keep: Tensor | None = None, band_ratio: Tensor | None = None
) -> Tensor:
    """Metrics over response tokens, as one tensor in the order of ``METRIC_NAMES``.

    clipfrac = fraction of response tokens with M_t = 0, split into masked above the band
    (ratio > 1) and below it (ratio < 1); ratio mean/max of ρ_t; ppo_kl = mean of −log ρ_t. ``log_ratio``
    is the clamped log ρ_t and ``ratio`` its exp (as verl's ppo_kl), so every metric is finite.
    An empty batch (no response token) gives zeros.
    """
    n_tokens = mask.sum().to(log_ratio.dtype).clamp_min(1)
    zero = log_ratio.new_zeros(())
    if keep is None:
        clipped = upper = zero
    else:
        dropped = mask & ~keep
        clipped = dropped.sum() / n_tokens
        upper = (dropped & (band_ratio > 1.0)).sum() / n_tokens
    ratio_mean = torch.where(mask, ratio, 0.0).sum() / n_tokens
    ratio_max = torch.where(mask, ratio, 0.0).amax() if mask.numel() else zero
    ppo_kl = -log_ratio.sum() / n_tokens
    return torch.stack([clipped, upper, clipped - upper, ratio_mean, ratio_max, ppo_kl])
