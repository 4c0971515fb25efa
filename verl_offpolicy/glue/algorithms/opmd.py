"""The mirror-descent family, OPMD and PMD (docs/algo/opmd.md, docs/algo/pmd.md): adapters and rules.

Estimators ``opmd``, ``pmd_partition``, ``pairwise_opmd`` and losses ``opmd``, ``pmd``, ``pairwise_opmd``.
τ is one hyperparameter of the family (``algorithm.offpolicy.tau``, defaults in
:data:`verl_offpolicy.glue.config.DEFAULT_TAU`): :func:`check_tau_coupling` keeps a loss's τ equal to
it. ``pairwise_opmd``'s estimator and loss go together, on verl's KL-in-reward with one optimizer
update per batch (:func:`check_pairwise_opmd`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from verl.trainer.ppo.core_algos import register_adv_est, register_policy_loss

from verl_offpolicy.core import advantages as core_advantages
from verl_offpolicy.core import losses as core
from verl_offpolicy.glue.algorithms.adapters import (
    aggregate,
    broadcast,
    check_dtype,
    our_loss_config,
    prepare,
    unclipped_metrics,
)
from verl_offpolicy.glue.algorithms.kl_reward import check_kl_in_reward, check_proximal_kl_reward, one_update_per_batch_fixes
from verl_offpolicy.glue.config import (
    ALGO_PREFIX,
    LOSS_PREFIX,
    ConfigView,
    OffPolicyConfig,
    OffPolicyConfigError,
    OffPolicyLossConfig,
)

# The losses that read ``policy_loss.tau``.
TAU_LOSSES = ("opmd", "pmd")
PAIRWISE_OPMD = "pairwise_opmd"
# pmd is a mean over sequences of per-sequence losses spread as L_i/|y_i| over their tokens; pairwise_opmd
# is a mean over sequences of −A_i·log π(y_i) = −A_i·Σ_t log π_t.
PMD_AGG_MODE = "seq-mean-token-sum"
PAIRWISE_OPMD_AGG_MODE = "seq-mean-token-sum"

# ---------------------------------------------------------------------- rules


def check_tau_coupling(offpolicy: OffPolicyConfig, adv_estimator: str, loss_config: OffPolicyLossConfig) -> None:
    """τ is one hyperparameter: a loss that reads τ must use ``algorithm.offpolicy.tau``'s value.

    The presets interpolate ``policy_loss.tau: ${algorithm.offpolicy.tau}``; overriding the loss's key
    alone would split them silently. Compared: the loss's resolved τ with the estimator's resolved τ
    when the estimator reads τ too, else with ``algorithm.offpolicy.tau`` when it is set.
    """
    if loss_config.loss_mode not in TAU_LOSSES:
        return
    if offpolicy.estimator_reads_tau(adv_estimator):
        expected, reader = offpolicy.tau_for(adv_estimator), f", also read by adv_estimator={adv_estimator}"
    elif offpolicy.tau is not None:
        expected, reader = offpolicy.tau, ""
    else:
        return
    if loss_config.resolved_tau != expected:
        raise ValueError(
            f"{LOSS_PREFIX}.tau={loss_config.tau} (loss_mode={loss_config.loss_mode}) and {ALGO_PREFIX}.tau="
            f"{offpolicy.tau}{reader} differ (τ {loss_config.resolved_tau} vs {expected}): τ is one hyperparameter, "
            f"the presets interpolate the loss's from {ALGO_PREFIX}.tau; set {ALGO_PREFIX}.tau only and remove "
            f"the override of {LOSS_PREFIX}.tau"
        )


def check_loss_tau(view: ConfigView) -> None:
    """:func:`check_tau_coupling` on the composed config (our loss only)."""
    if view.loss is not None:
        check_tau_coupling(view.offpolicy, view.adv_estimator, view.loss)


def check_pairwise_opmd(view: ConfigView) -> None:
    """pairwise_opmd's estimator and loss only make sense together, with exact group coefficients.

    The estimator's A_i = 2Kτ(a_i − ā)/(1+τ)² is the gradient coefficient of Σ_{i<j}(a_i − a_j)² at the
    proximal weights, where verl's KL-in-reward computes a_i: exact for one optimizer update per batch
    (one mini-batch, one epoch); later updates of the same batch would use coefficients of older weights.
    """
    adv_estimator, loss_mode = view.adv_estimator, view.loss_mode
    if (adv_estimator == PAIRWISE_OPMD) != (loss_mode == PAIRWISE_OPMD):
        raise OffPolicyConfigError(
            f"algorithm.adv_estimator={adv_estimator} and {LOSS_PREFIX}.loss_mode={loss_mode}: pairwise OPMD needs "
            f"both set to {PAIRWISE_OPMD} (the loss's gradient identity uses the estimator's group coefficients)"
        )
    if adv_estimator != PAIRWISE_OPMD:
        return
    check_kl_in_reward(view.select("algorithm"), view.offpolicy.tau_for(PAIRWISE_OPMD), PAIRWISE_OPMD, "tau")
    check_proximal_kl_reward(view, PAIRWISE_OPMD, "τ")
    fixes = one_update_per_batch_fixes(view)
    if fixes:
        raise OffPolicyConfigError(
            f"adv_estimator={PAIRWISE_OPMD} computes each group's coefficients once per batch, at the weights of its "
            "first optimizer update; later updates would follow stale coefficients: " + "; ".join(fixes)
        )

LOSS_RULES = (check_loss_tau,)
ESTIMATOR_RULES = (check_pairwise_opmd,)

# ---------------------------------------------------------------------- estimators


@register_adv_est("opmd")
@torch.no_grad()
def compute_opmd_advantage(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    """A_i = r_i − r̄ (``algorithm.offpolicy.baseline=mean``) or r_i − τ·(logsumexp(r/τ) − log K) (``logavgexp``)."""
    section, scores, group_ids = prepare("opmd", token_level_rewards, index, config)
    advantage = core_advantages.opmd_advantage(scores, group_ids, section.baseline, section.tau_for("opmd"))
    return broadcast("opmd", advantage, response_mask, token_level_rewards, index)


@register_adv_est("pmd_partition")
@torch.no_grad()
def compute_pmd_partition_advantage(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    """A_i = r_i − τ·log((1/(K−1))·Σ_{j≠i} exp(r_j/τ)), τ = ``algorithm.offpolicy.tau``.

    With ``algorithm.offpolicy.partition_clamp`` = c: A_i = min(A_i, −τ·log c) (OpenKimi's floor, K > 1).
    """
    section, scores, group_ids = prepare("pmd_partition", token_level_rewards, index, config)
    tau = section.tau_for("pmd_partition")
    advantage = core_advantages.pmd_partition_advantage(scores, group_ids, tau, section.partition_clamp)
    return broadcast("pmd_partition", advantage, response_mask, token_level_rewards, index)


@register_adv_est("pairwise_opmd")
@torch.no_grad()
def compute_pairwise_opmd_advantage(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    """A_i = 2·K·τ·(a_i − ā)/(1+τ)², τ = ``algorithm.offpolicy.tau``, a_i = Σ_t token_level_rewards.

    a_i = r_i − τ·log(π(y_i)/π_ref(y_i)): verl's KL-in-reward (kl_penalty=kl, fixed kl_coef = τ) at the
    proximal weights, so −Σ_i A_i·∇log π(y_i) is the exact gradient of Σ_{i<j}(a_i − a_j)²/(1+τ)² there.
    """
    section, scores, group_ids = prepare("pairwise_opmd", token_level_rewards, index, config)
    tau = section.tau_for("pairwise_opmd")
    if config is not None:  # startup checked the composed config; this guards a direct call (see prepare)
        check_kl_in_reward(config, tau, "pairwise_opmd", "tau")
    advantage = core_advantages.pairwise_opmd_advantage(scores, group_ids, tau)
    return broadcast("pairwise_opmd", advantage, response_mask, token_level_rewards, index)

# ---------------------------------------------------------------------- losses


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
    loss_config = our_loss_config("opmd", config)
    check_dtype("opmd", log_prob)
    mask = response_mask.bool()
    loss_mat = core.opmd_loss(log_prob, advantages, mask, loss_config.resolved_tau)
    loss = aggregate(loss_mat, mask, loss_agg_mode, config, rollout_is_weights)
    return loss, unclipped_metrics(log_prob, old_log_prob, mask)


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
    loss_config = our_loss_config("pmd", config)
    check_dtype("pmd", log_prob)
    mask = response_mask.bool()
    loss_mat = core.pmd_loss(log_prob, old_log_prob, advantages, mask, loss_config.resolved_tau)
    loss = aggregate(loss_mat, mask, PMD_AGG_MODE, config, rollout_is_weights)
    return loss, unclipped_metrics(log_prob, old_log_prob, mask)


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
    our_loss_config("pairwise_opmd", config)
    check_dtype("pairwise_opmd", log_prob)
    mask = response_mask.bool()
    loss_mat = core.reinforce_loss(log_prob, advantages, mask)
    loss = aggregate(loss_mat, mask, PAIRWISE_OPMD_AGG_MODE, config, rollout_is_weights)
    return loss, unclipped_metrics(log_prob, old_log_prob, mask)
