"""TOPR (``loss_mode=topr``, docs/algo/topr.md): its loss adapter (no rule beyond the typed config)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from verl.trainer.ppo.core_algos import register_policy_loss

from verl_offpolicy.core import losses as core
from verl_offpolicy.glue.algorithms.adapters import aggregate, as_metrics, check_dtype, our_loss_config

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
    our_loss_config("topr", config)
    check_dtype("topr", log_prob)
    mask = response_mask.bool()
    loss_mat, weight = core.topr_loss(log_prob, old_log_prob, advantages, mask)
    loss = aggregate(loss_mat, mask, loss_agg_mode, config, rollout_is_weights)
    log_ratio = core.clamp_log_ratio(core.token_log_ratio(log_prob, old_log_prob, mask))
    ratio = torch.exp(log_ratio)
    truncated = weight >= 1.0  # kept at full weight; tapered tokens count as "clipped" (below the band)
    return loss, as_metrics(core.ratio_metrics(log_ratio, ratio, mask, truncated, torch.zeros_like(ratio)))
