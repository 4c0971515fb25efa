"""verl glue of the policy losses: one ``@register_policy_loss`` function per name.

verl's ``ppo_loss`` calls ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
config=ActorConfig, rollout_is_weights)`` and expects ``(loss, metrics)``. Each function here reads
its parameters from ``config.policy_loss`` (an :class:`OffPolicyLossConfig`) and ε_low/ε_high from the
actor, builds the per-token loss with :mod:`verl_offpolicy.core.losses`, multiplies it by
``rollout_is_weights`` when given, and aggregates with verl's ``agg_loss(...,
**config.global_batch_info)`` so that micro-batch sums equal the global-batch value.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss

from verl_offpolicy.core import losses as core
from verl_offpolicy.glue.config import LOSS_PREFIX, OffPolicyLossConfig, check_clip_ratios, clip_ratios

# pmd is a mean over sequences of per-sequence losses spread as L_i/|y_i| over their tokens; pairwise_opmd
# is a mean over sequences of −A_i·log π(y_i) = −A_i·Σ_t log π_t.
PMD_AGG_MODE = "seq-mean-token-sum"
PAIRWISE_OPMD_AGG_MODE = "seq-mean-token-sum"


def _loss_config(loss_mode: str, config: Any) -> OffPolicyLossConfig:
    policy_loss = getattr(config, "policy_loss", None)
    if not isinstance(policy_loss, OffPolicyLossConfig):
        raise TypeError(
            f"{LOSS_PREFIX}.loss_mode={loss_mode} is a verl-offpolicy loss, but {LOSS_PREFIX} is a "
            f"{type(policy_loss).__name__}, not verl-offpolicy's OffPolicyLossConfig: set "
            f"{LOSS_PREFIX}._target_=verl_offpolicy.glue.config.OffPolicyLossConfig or use a preset "
            "(+algorithm=<name>)"
        )
    return policy_loss


def _check_dtype(loss_mode: str, log_prob: Tensor) -> None:
    """float16 cannot hold the clamped ratio e²⁰ ≈ 4.9e8 (nor pmd's (A/τ − Δ)²): a clear error, not inf."""
    if log_prob.dtype == torch.float16:
        raise TypeError(
            f"{LOSS_PREFIX}.loss_mode={loss_mode}: log_prob is float16, whose range (±65504) cannot hold the "
            "loss's ratios and squares (up to e^20 ≈ 4.9e8), so the loss could be inf. Compute the log-probs "
            "in float32 (verl's default), bfloat16 or float64."
        )


def _aggregate(
    loss_mat: Tensor, mask: Tensor, loss_agg_mode: str, config: Any, rollout_is_weights: Tensor | None
) -> Tensor:
    if rollout_is_weights is not None:
        loss_mat = loss_mat * rollout_is_weights
    return agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info)


def _metrics(values: Tensor) -> dict[str, float]:
    """verl's metric names as plain Python floats (one device sync)."""
    return dict(zip(core.METRIC_NAMES, values.detach().tolist(), strict=True))


def _unclipped_metrics(log_prob: Tensor, old_log_prob: Tensor, mask: Tensor) -> dict[str, float]:
    """Metrics of a loss without a mask: ratio statistics of the clamped ratio (finite), nothing clipped."""
    log_ratio = core.clamp_log_ratio(core.token_log_ratio(log_prob, old_log_prob, mask))
    return _metrics(core.ratio_metrics(log_ratio, torch.exp(log_ratio), mask))


@register_policy_loss("opmd")
def compute_policy_loss_opmd(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """ℓ_t = −A·log π_t/(1 + τ), τ = ``policy_loss.tau`` ≥ 0, aggregated with ``loss_agg_mode``."""
    loss_config = _loss_config("opmd", config)
    _check_dtype("opmd", log_prob)
    mask = response_mask.bool()
    loss_mat = core.opmd_loss(log_prob, advantages, mask, loss_config.resolved_tau)
    loss = _aggregate(loss_mat, mask, loss_agg_mode, config, rollout_is_weights)
    return loss, _unclipped_metrics(log_prob, old_log_prob, mask)


@register_policy_loss("pmd")
def compute_policy_loss_pmd(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """L_i = ½·τ·(A_i/τ − Δ_i)²/|y_i|, τ = ``policy_loss.tau`` > 0; loss = mean of L_i over sequences.

    The sequence mean is the loss's definition, so it does not depend on ``loss_agg_mode``: the
    per-token matrix L_i/|y_i| is aggregated with ``seq-mean-token-sum`` (global sequence count from
    ``global_batch_info``).
    """
    loss_config = _loss_config("pmd", config)
    _check_dtype("pmd", log_prob)
    mask = response_mask.bool()
    loss_mat = core.pmd_loss(log_prob, old_log_prob, advantages, mask, loss_config.resolved_tau)
    loss = _aggregate(loss_mat, mask, PMD_AGG_MODE, config, rollout_is_weights)
    return loss, _unclipped_metrics(log_prob, old_log_prob, mask)


@register_policy_loss("rec")
def compute_policy_loss_rec(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """ℓ_t = −M_t·w_t·A·log π_t + reg_t (``policy_loss.clip_mode``, ``weight``, ``regularizer``)."""
    loss_config = _loss_config("rec", config)
    _check_dtype("rec", log_prob)
    clip_low, clip_high = clip_ratios(config)
    check_clip_ratios(clip_low, clip_high, loss_config)
    mask = response_mask.bool()
    terms = core.rec_loss(
        log_prob,
        old_log_prob,
        advantages,
        mask,
        clip_mode=loss_config.clip_mode,
        weight=loss_config.weight,
        regularizer=loss_config.regularizer,
        regularizer_coef=loss_config.regularizer_coef,
        clip_ratio_low=clip_low,
        clip_ratio_high=clip_high,
        ring_clip_ratio_low=loss_config.ring_clip_ratio_low,
        ring_clip_ratio_high=loss_config.ring_clip_ratio_high,
    )
    loss = _aggregate(terms.loss, mask, loss_agg_mode, config, rollout_is_weights)
    metrics = core.ratio_metrics(terms.log_ratio, terms.ratio, mask, terms.keep, terms.band_ratio)
    return loss, _metrics(metrics)


@register_policy_loss("topr")
def compute_policy_loss_topr(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """ℓ_t = −w_i·A·log π_t, w_i = 1 if A_i ≥ 0 else min(1, π(y_i)/π_old(y_i)) (TOPR, arXiv 2503.14286).

    ``actor/pg_clipfrac`` is the fraction of response tokens whose weight was truncated below 1.
    """
    _loss_config("topr", config)
    _check_dtype("topr", log_prob)
    mask = response_mask.bool()
    loss_mat, weight = core.topr_loss(log_prob, old_log_prob, advantages, mask)
    loss = _aggregate(loss_mat, mask, loss_agg_mode, config, rollout_is_weights)
    log_ratio = core.clamp_log_ratio(core.token_log_ratio(log_prob, old_log_prob, mask))
    ratio = torch.exp(log_ratio)
    truncated = weight >= 1.0  # kept at full weight; tapered tokens count as "clipped" (below the band)
    return loss, _metrics(core.ratio_metrics(log_ratio, ratio, mask, truncated, torch.zeros_like(ratio)))


def _whole_mini_batch(log_prob: Tensor, config: Any) -> bool:
    """True if this call holds every sequence of the optimizer mini-batch (or is not inside verl's engine)."""
    info = getattr(config, "global_batch_info", None) or {}
    global_size = info.get("global_batch_size")
    if global_size is None:
        return True
    return info.get("dp_size", 1) == 1 and log_prob.shape[0] == global_size


@register_policy_loss("m2po")
def compute_policy_loss_m2po(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """ℓ_t = −M_t·ρ_t·A·log π_t, M_t = [(log ρ_t)² < θ*], θ* from the whole mini-batch's second moment.

    θ* comes from the engine's pre-pass over the mini-batch (:mod:`verl_offpolicy.glue.m2po`); a call that
    holds the whole mini-batch (one micro-batch on one rank, or a direct call) computes it from its own
    tokens. A micro-batch without the pre-pass is an error, never a silently per-micro-batch mask.
    """
    from verl_offpolicy.glue.m2po import mini_batch_threshold

    loss_config = _loss_config("m2po", config)
    _check_dtype("m2po", log_prob)
    mask = response_mask.bool()
    threshold = mini_batch_threshold(config)
    if threshold is None:
        if not _whole_mini_batch(log_prob, config):
            raise RuntimeError(
                f"{LOSS_PREFIX}.loss_mode=m2po: this call holds {log_prob.shape[0]} of the mini-batch's "
                f"{config.global_batch_info.get('global_batch_size')} sequences, but the whole-mini-batch pre-pass "
                "(verl_offpolicy.glue.m2po, installed on verl's FSDP engine) did not run: m2po needs "
                "actor_rollout_ref.actor.strategy=fsdp or fsdp2"
            )
        log_ratio_sq = core.token_log_ratio(log_prob, old_log_prob, mask)[mask].square()
        threshold = core.m2po_threshold(log_ratio_sq, loss_config.m2po_threshold)
    loss_mat, keep, log_ratio, ratio = core.m2po_loss(log_prob, old_log_prob, advantages, mask, threshold)
    loss = _aggregate(loss_mat, mask, loss_agg_mode, config, rollout_is_weights)
    return loss, _metrics(core.ratio_metrics(log_ratio, ratio, mask, keep, ratio))


@register_policy_loss("pairwise_opmd")
def compute_policy_loss_pairwise_opmd(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Mean over sequences of −A_i·log π(y_i), A_i = 2Kτ(a_i − ā)/(1+τ)² from the ``pairwise_opmd`` estimator.

    Its gradient is (1/N)·Σ_groups ∇[Σ_{i<j}(a_i − a_j)²]/(1+τ)² at the weights that computed a_i (the
    proximal ones). The sequence sum is the identity's log π(y_i), so the aggregation is fixed
    (``seq-mean-token-sum``, global sequence count from ``global_batch_info``), whatever ``loss_agg_mode``.
    """
    _loss_config("pairwise_opmd", config)
    _check_dtype("pairwise_opmd", log_prob)
    mask = response_mask.bool()
    loss_mat = core.reinforce_loss(log_prob, advantages, mask)
    loss = _aggregate(loss_mat, mask, PAIRWISE_OPMD_AGG_MODE, config, rollout_is_weights)
    return loss, _unclipped_metrics(log_prob, old_log_prob, mask)
