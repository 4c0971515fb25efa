"""TOPR (``adv_estimator=topr``, ``loss_mode=topr``, docs/algo/topr.md): its estimator and loss adapters.

The ``topr`` estimator is the paper's: the raw reward (0/1 rewards as ±1) minus one scalar baseline c
(``algorithm.offpolicy.topr_baseline``, default 0). The ``topr_group_mean`` preset, ours, pairs the loss with
verl's group-mean ``grpo`` advantage instead. No rule beyond the typed config.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from verl.trainer.ppo.core_algos import register_adv_est, register_policy_loss

from verl_offpolicy.core import advantages as core_adv
from verl_offpolicy.core import losses as core
from verl_offpolicy.glue.algorithms.adapters import aggregate, as_metrics, broadcast, check_dtype, our_loss_config, prepare
from verl_offpolicy.glue.knobs import Knob, finite

OFFPOLICY_KNOBS = (
    Knob("topr_baseline", 0.0, "topr: scalar baseline c of A = R − c (TOPR's default 0; no group statistic).",
         check=finite),
    Knob("topr_reward", "signed",
         "topr: reward R: signed (2r − 1: 0/1 rewards as TOPR's ±1; other rewards are an error) | raw (r).",
         choices=core_adv.TOPR_REWARDS),
)


@register_adv_est("topr")
@torch.no_grad()
def compute_topr_advantage(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    """A_i = R_i − c: R_i = 2r_i − 1 (``algorithm.offpolicy.topr_reward=signed``) or r_i (``raw``), c =
    ``algorithm.offpolicy.topr_baseline``."""
    section, scores, _ = prepare("topr", token_level_rewards, index, config, OFFPOLICY_KNOBS)
    try:
        advantage = core_adv.topr_advantage(scores, section.topr_baseline, section.topr_reward)
    except ValueError as error:
        raise ValueError(f"adv_estimator=topr, algorithm.offpolicy.topr_reward={section.topr_reward}: {error}") from None
    return broadcast("topr", advantage, response_mask, token_level_rewards, index)


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

    ``actor/offpolicy/topr/truncated_frac`` (and verl's ``actor/pg_clipfrac``) is the fraction of response tokens
    whose weight was truncated below 1.
    """
    our_loss_config("topr", config)
    check_dtype("topr", log_prob)
    mask = response_mask.bool()
    loss_mat, weight = core.topr_loss(log_prob, old_log_prob, advantages, mask)
    loss = aggregate(loss_mat, mask, loss_agg_mode, config, rollout_is_weights)
    log_ratio = core.clamp_log_ratio(core.token_log_ratio(log_prob, old_log_prob, mask))
    ratio = torch.exp(log_ratio)
    full_weight = weight >= 1.0  # tapered tokens (w_i < 1) count as "clipped" (below the band)
    return loss, as_metrics(core.ratio_metrics(log_ratio, ratio, mask, full_weight, torch.zeros_like(ratio)), "topr")
