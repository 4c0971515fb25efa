"""The mirror-descent family, OPMD and PMD (docs/algo/opmd.md, docs/algo/pmd.md): knobs, adapters and rules.

Estimators ``opmd``, ``pmd_partition``, ``pairwise_opmd`` and losses ``opmd``, ``pmd``, ``pairwise_opmd``.
τ is one hyperparameter of the family (``algorithm.offpolicy.tau``; each reader's default in
:data:`DEFAULT_TAU`): :func:`check_loss_tau` keeps a loss's τ equal to it. ``pairwise_opmd``'s estimator
and loss go together, on verl's KL-in-reward with one optimizer update per batch (:func:`check_pairwise_opmd`).
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
from verl_offpolicy.glue.algorithms.kl_reward import (
    check_kl_in_reward,
    check_proximal_kl_reward,
    one_update_per_batch_fixes,
)
from verl_offpolicy.glue.family import EstimatorExample, Family, LossExample
from verl_offpolicy.glue.knobs import (
    ALGO_PREFIX,
    LOSS_PREFIX,
    Knob,
    OffPolicyConfigError,
    check_number,
    optional_finite,
)

PAIRWISE_OPMD = "pairwise_opmd"
# The losses that read ``policy_loss.tau``.
TAU_LOSSES = ("opmd", "pmd")
# The default τ of each reader (docs/algorithms.md), used while ``tau`` is left unset (null).
DEFAULT_TAU = {"opmd": 1.0, "pmd_partition": 0.01, "pmd": 0.01, PAIRWISE_OPMD: 0.1}
OPMD_BASELINES = ("mean", "logavgexp")
# How the presets set the loss's τ: one hyperparameter, set as algorithm.offpolicy.tau.
TAU_INTERPOLATION = "${" + ALGO_PREFIX + ".tau}"
# pmd is a mean over sequences of per-sequence losses spread as L_i/|y_i| over their tokens; pairwise_opmd
# is a mean over sequences of −A_i·log π(y_i) = −A_i·Σ_t log π_t.
PMD_AGG_MODE = "seq-mean-token-sum"
PAIRWISE_OPMD_AGG_MODE = "seq-mean-token-sum"


def _partition_clamp(key: str, clamp: Any) -> None:
    if clamp is not None and (isinstance(clamp, bool) or not isinstance(clamp, int | float) or not 0 < clamp < 1):
        raise ValueError(f"{key} must be null (exact form) or a number in (0, 1) (OpenKimi: 1e-8), got {clamp!r}")


OFFPOLICY_KNOBS = (
    Knob(
        "tau",
        None,
        "Temperature τ of opmd (logavgexp baseline), pmd_partition, pairwise_opmd (also its KL coefficient) and "
        "the opmd/pmd losses; null = each one's default (opmd 1.0, pmd_partition 0.01, pmd 0.01, pairwise_opmd 0.1).",
        check=optional_finite,
    ),
    Knob(
        "baseline",
        "mean",
        "opmd estimator baseline: mean (r̄) | logavgexp (τ·(logsumexp(r/τ) − log K)).",
        choices=OPMD_BASELINES,
    ),
    Knob(
        "partition_clamp",
        None,
        "pmd_partition floor c ∈ (0, 1) of the leave-one-out partition term, A = min(A, −τ·log c) (OpenKimi's "
        "ploo uses 1e-8); null = the exact form.",
        check=_partition_clamp,
    ),
)
LOSS_KNOBS = (
    Knob(
        "tau",
        None,
        "opmd: ℓ = −A·log π/(1+τ), τ ≥ 0; pmd: ½τ(A/τ − Δ)²/|y|, τ > 0. One value: set algorithm.offpolicy.tau "
        "(startup rejects a loss τ overridden apart from it); null = the loss's default (opmd 1.0, pmd 0.01).",
        yaml=TAU_INTERPOLATION,
    ),
)


def resolve_tau(tau: float | None, reader: str) -> float:
    """τ as ``reader`` (an estimator or loss name) uses it: ``tau`` if set, else ``DEFAULT_TAU[reader]``."""
    return DEFAULT_TAU.get(reader, 1.0) if tau is None else tau


def estimator_reads_tau(adv_estimator: str | None, baseline: str) -> bool:
    """True if ``adv_estimator`` reads τ: ``pmd_partition``, ``pairwise_opmd``, and ``opmd`` with the
    ``logavgexp`` baseline."""
    return adv_estimator in ("pmd_partition", PAIRWISE_OPMD) or (adv_estimator == "opmd" and baseline == "logavgexp")


# ---------------------------------------------------------------------- rules


def check_estimator_tau(view) -> None:
    """An estimator that reads τ needs τ > 0 (it divides by it)."""
    adv_estimator, offpolicy = view.adv_estimator, view.offpolicy
    if estimator_reads_tau(adv_estimator, offpolicy.baseline):
        tau = resolve_tau(offpolicy.tau, adv_estimator)
        check_number(f"{ALGO_PREFIX}.tau (used by adv_estimator={adv_estimator})", tau, positive=True)


def check_tau_coupling(offpolicy: Any, adv_estimator: str | None, loss_config: Any) -> None:
    """τ is one hyperparameter: a loss that reads τ must use ``algorithm.offpolicy.tau``'s value.

    The presets interpolate ``policy_loss.tau: ${algorithm.offpolicy.tau}``; overriding the loss's key
    alone would split them silently. Compared: the loss's resolved τ with the estimator's resolved τ
    when the estimator reads τ too, else with ``algorithm.offpolicy.tau`` when it is set.
    """
    if loss_config.loss_mode not in TAU_LOSSES:
        return
    loss_tau = resolve_tau(loss_config.tau, loss_config.loss_mode)
    if estimator_reads_tau(adv_estimator, offpolicy.baseline):
        expected, reader = resolve_tau(offpolicy.tau, adv_estimator), f", also read by adv_estimator={adv_estimator}"
    elif offpolicy.tau is not None:
        expected, reader = offpolicy.tau, ""
    else:
        return
    if loss_tau != expected:
        raise ValueError(
            f"{LOSS_PREFIX}.tau={loss_config.tau} (loss_mode={loss_config.loss_mode}) and {ALGO_PREFIX}.tau="
            f"{offpolicy.tau}{reader} differ (τ {loss_tau} vs {expected}): τ is one hyperparameter, "
            f"the presets interpolate the loss's from {ALGO_PREFIX}.tau; set {ALGO_PREFIX}.tau only and remove "
            f"the override of {LOSS_PREFIX}.tau"
        )


def check_loss_tau(view) -> None:
    """τ of a loss that reads it: > 0 for ``pmd`` (it divides by τ), ≥ 0 for ``opmd``; then
    :func:`check_tau_coupling`. The error names the loss's key, or ``algorithm.offpolicy.tau`` when the loss
    reads it from there (the presets' interpolation)."""
    loss = view.loss
    if loss is None or loss.loss_mode not in TAU_LOSSES:
        return
    loss_mode = loss.loss_mode
    if _raw_loss_tau(view) == TAU_INTERPOLATION:
        key = f"{ALGO_PREFIX}.tau (read by loss_mode={loss_mode} as {LOSS_PREFIX}.tau)"
    else:
        key = f"{LOSS_PREFIX}.tau (loss_mode=pmd)" if loss_mode == "pmd" else f"{LOSS_PREFIX}.tau"
    check_number(key, resolve_tau(loss.tau, loss_mode), positive=loss_mode == "pmd", non_negative=loss_mode != "pmd")
    check_tau_coupling(view.offpolicy, view.adv_estimator, loss)


def _raw_loss_tau(view) -> Any:
    """The loss's τ as written in the config (the interpolation string, unresolved)."""
    from omegaconf import OmegaConf

    node = view.select("actor_rollout_ref.actor.policy_loss")
    return OmegaConf.to_container(node, resolve=False).get("tau") if node is not None else None


def check_pairwise_opmd(view) -> None:
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
    check_kl_in_reward(view.select("algorithm"), resolve_tau(view.offpolicy.tau, PAIRWISE_OPMD), PAIRWISE_OPMD, "tau")
    check_proximal_kl_reward(view, PAIRWISE_OPMD, "τ")
    fixes = one_update_per_batch_fixes(view)
    if fixes:
        raise OffPolicyConfigError(
            f"adv_estimator={PAIRWISE_OPMD} computes each group's coefficients once per batch, at the weights of its "
            "first optimizer update; later updates would follow stale coefficients: " + "; ".join(fixes)
        )


ROLLOUT_CORRECTION = "algorithm.rollout_correction"


def check_pairwise_opmd_correction(view) -> None:
    """The pairwise gradient is exact for any data: verl's rollout correction (a per-sample weight or rejection)
    has nothing to correct and would bias it."""
    if view.adv_estimator != PAIRWISE_OPMD:
        return
    corrections = [
        f"{ROLLOUT_CORRECTION}.{key}={value}"
        for key in ("rollout_is", "rollout_rs")
        if (value := view.select(f"{ROLLOUT_CORRECTION}.{key}")) is not None
    ]
    if corrections:
        raise OffPolicyConfigError(
            f"algorithm.adv_estimator={PAIRWISE_OPMD} with {' and '.join(corrections)}: the pairwise gradient is exact "
            "for any data without a per-sample weight or rejection (fully off-policy); remove the correction"
        )


# ---------------------------------------------------------------------- estimators


@register_adv_est("opmd")
@torch.no_grad()
def compute_opmd_advantage(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    """A_i = r_i − r̄ (``algorithm.offpolicy.baseline=mean``) or r_i − τ·(logsumexp(r/τ) − log K) (``logavgexp``)."""
    section, scores, group_ids = prepare("opmd", token_level_rewards, index, config, OFFPOLICY_KNOBS)
    advantage = core_advantages.opmd_advantage(scores, group_ids, section.baseline, resolve_tau(section.tau, "opmd"))
    return broadcast("opmd", advantage, response_mask, token_level_rewards, index)


@register_adv_est("pmd_partition")
@torch.no_grad()
def compute_pmd_partition_advantage(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    """A_i = r_i − τ·log((1/(K−1))·Σ_{j≠i} exp(r_j/τ)), τ = ``algorithm.offpolicy.tau``.

    With ``algorithm.offpolicy.partition_clamp`` = c: A_i = min(A_i, −τ·log c) (OpenKimi's floor, K > 1).
    """
    section, scores, group_ids = prepare("pmd_partition", token_level_rewards, index, config, OFFPOLICY_KNOBS)
    tau = resolve_tau(section.tau, "pmd_partition")
    advantage = core_advantages.pmd_partition_advantage(scores, group_ids, tau, section.partition_clamp)
    return broadcast("pmd_partition", advantage, response_mask, token_level_rewards, index)


@register_adv_est("pairwise_opmd")
@torch.no_grad()
def compute_pairwise_opmd_advantage(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    """A_i = 2·K·τ·(a_i − ā)/(1+τ)², τ = ``algorithm.offpolicy.tau``, a_i = Σ_t token_level_rewards.

    a_i = r_i − τ·log(π(y_i)/π_ref(y_i)): verl's KL-in-reward (kl_penalty=kl, fixed kl_coef = τ) at the
    proximal weights, so −Σ_i A_i·∇log π(y_i) is the exact gradient of Σ_{i<j}(a_i − a_j)²/(1+τ)² there.
    """
    section, scores, group_ids = prepare(PAIRWISE_OPMD, token_level_rewards, index, config, OFFPOLICY_KNOBS)
    tau = resolve_tau(section.tau, PAIRWISE_OPMD)
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
    loss_mat = core.opmd_loss(log_prob, advantages, mask, resolve_tau(loss_config.tau, "opmd"))
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
    loss_mat = core.pmd_loss(log_prob, old_log_prob, advantages, mask, resolve_tau(loss_config.tau, "pmd"))
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


FAMILY = Family(
    "opmd",
    offpolicy_knobs=OFFPOLICY_KNOBS,
    loss_knobs=LOSS_KNOBS,
    loss_rules=(check_loss_tau,),
    estimator_rules=(check_estimator_tau, check_pairwise_opmd, check_pairwise_opmd_correction),
    # opmd: A = r − r̄; pmd_partition: A = r − τ·log mean_{j≠i} exp(r_j/τ) = 0 for equal rewards; a singleton keeps
    # A = r in both (baseline 0). pairwise_opmd: A = 2Kτ(a − ā)/(1+τ)², 0 for equal rewards and for a singleton
    estimators={
        "opmd": (EstimatorExample({"tau": 1.0, "baseline": "mean"}, singleton="reward", equal_group=0.0),),
        "pmd_partition": (EstimatorExample({"tau": 0.01}, singleton="reward", equal_group=0.0),),
        PAIRWISE_OPMD: (EstimatorExample({"tau": 0.1}, singleton="zero", equal_group=0.0),),
    },
    losses={
        "opmd": (LossExample({"tau": 1.0}),),
        "pmd": (LossExample({"tau": 0.01}),),
        PAIRWISE_OPMD: (LossExample({"tau": 0.1}),),
    },
)
