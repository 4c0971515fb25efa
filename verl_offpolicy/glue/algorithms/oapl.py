"""OAPL (``adv_estimator=oapl``, ``loss_mode=oapl``, docs/algo/oapl.md): its estimator, loss and pairing rule.

Optimal Advantage-based Policy Optimization with a Lagged Inference policy (Ritter et al., arXiv 2602.19362):
the estimator gives A_i = r_i − V̂*(x), V̂* = β1·log mean_j exp(r_j/β1) over the prompt's group
(``algorithm.offpolicy.oapl_beta1``); the loss regresses β2·log(π(y_i)/π_old(y_i)) on it,
L_i = (β2·Δ_i − A_i)² (``policy_loss.oapl_beta2``), mean over sequences, with π_old the ratio anchor (the
lagged policy that generated the batch under ``ratio_anchor=behaviour``). The two go together
(:func:`check_oapl_pair`): the loss's target is in reward units only with this estimator. Startup also refuses
one response per group (:func:`check_oapl_group`: every advantage 0) and the ``proximal`` anchor
(:func:`check_oapl_anchor`: Δ must be against the policy that generated the group).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from verl.trainer.ppo.core_algos import register_adv_est, register_policy_loss

from verl_offpolicy.core import advantages as core_adv
from verl_offpolicy.core import losses as core
from verl_offpolicy.glue.algorithms.adapters import (
    aggregate,
    broadcast,
    check_dtype,
    our_loss_config,
    prepare,
    unclipped_metrics,
)
from verl_offpolicy.glue.family import EstimatorExample, Family, LossExample
from verl_offpolicy.glue.knobs import LOSS_PREFIX, Knob, OffPolicyConfigError, positive
from verl_offpolicy.glue.scheduler.knobs import BEHAVIOUR, ROLLOUT

OAPL = "oapl"
# A mean over sequences of per-sequence losses spread as L_i/|y_i| over their tokens (as pmd's).
OAPL_AGG_MODE = "seq-mean-token-sum"

OFFPOLICY_KNOBS = (
    Knob(
        "oapl_beta1",
        1.0,
        "oapl estimator: β1 > 0 of the value estimate V̂* = β1·log mean_j exp(r_j/β1) over the group "
        "(the OAPL authors' 1.0).",
        check=positive,
    ),
)
LOSS_KNOBS = (
    Knob(
        "oapl_beta2",
        1.0e-3,
        "oapl loss: β2 > 0 of L_i = (β2·Σ_t log(π_t/π_old,t) − A_i)², the KL strength against the lagged "
        "policy (the OAPL authors' 1e-3, for responses of thousands of tokens).",
        check=positive,
    ),
)


def check_oapl_pair(view) -> None:
    """The ``oapl`` estimator and the ``oapl`` loss only make sense together."""
    adv_estimator, loss_mode = view.adv_estimator, view.loss_mode
    if (adv_estimator == OAPL) != (loss_mode == OAPL):
        raise OffPolicyConfigError(
            f"algorithm.adv_estimator={adv_estimator} and {LOSS_PREFIX}.loss_mode={loss_mode}: OAPL needs both set "
            f"to {OAPL} (the loss regresses β2·log(π/π_old) on the estimator's r − V̂*, in reward units)"
        )


def check_oapl_group(view) -> None:
    """V̂* is estimated from the prompt's group: with one response per prompt V̂* = r, so every advantage is 0."""
    if view.adv_estimator != OAPL:
        return
    n = view.select("actor_rollout_ref.rollout.n")
    if isinstance(n, int) and not isinstance(n, bool) and n < 2:
        raise OffPolicyConfigError(
            f"algorithm.adv_estimator={OAPL} estimates V̂* from the prompt's group, but "
            f"actor_rollout_ref.rollout.n={n} "
            "gives one response per group: V̂* = r, every advantage is 0 and the run learns nothing; set "
            "actor_rollout_ref.rollout.n >= 2"
        )


# The anchors that hold the log-probs of the policy that generated the batch (π_lag).
OAPL_ANCHORS = (BEHAVIOUR, ROLLOUT)


def check_oapl_anchor(view) -> None:
    """OAPL's Δ = Σ_t log(π_θ/π_lag) is against the policy that generated the group, the ``behaviour`` (or
    ``rollout``) anchor; ``proximal`` is recomputed at the current weights at every step, so under staleness the
    regression would pull towards the current weights, not π_lag (and Δ = 0 at each step's first update)."""
    if view.adv_estimator != OAPL:
        return
    anchor = view.offpolicy.ratio_anchor
    if anchor not in OAPL_ANCHORS:
        raise OffPolicyConfigError(
            f"algorithm.adv_estimator={OAPL} regresses β2·log(π/π_lag) against the policy that generated the group "
            f"(π_lag), but algorithm.offpolicy.ratio_anchor={anchor} recomputes π_old at the current weights: set "
            f"algorithm.offpolicy.ratio_anchor to one of {', '.join(OAPL_ANCHORS)} (behaviour: the preset's, the "
            "training engine at the generating weights)"
        )


@register_adv_est("oapl")
@torch.no_grad()
def compute_oapl_advantage(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    """A_i = r_i − β1·log((1/K)·Σ_j exp(r_j/β1)), β1 = ``algorithm.offpolicy.oapl_beta1`` (a singleton: A = 0)."""
    section, scores, group_ids = prepare(OAPL, token_level_rewards, index, config, OFFPOLICY_KNOBS)
    advantage = core_adv.oapl_advantage(scores, group_ids, section.oapl_beta1)
    return broadcast(OAPL, advantage, response_mask, token_level_rewards, index)


@register_policy_loss("oapl")
def compute_policy_loss_oapl(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = OAPL_AGG_MODE,
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """L_i = (β2·Δ_i − A_i)², Δ_i = Σ_t log(π_t/π_old,t), β2 = ``policy_loss.oapl_beta2``; loss = mean of L_i
    over sequences.

    The sequence mean is the loss's definition (the authors' ``loss.mean()``), so it does not depend on
    ``loss_agg_mode``: the matrix L_i/|y_i| is aggregated with ``seq-mean-token-sum``.
    """
    loss_config = our_loss_config(OAPL, config)
    check_dtype(OAPL, log_prob)
    mask = response_mask.bool()
    loss_mat = core.oapl_loss(log_prob, old_log_prob, advantages, mask, loss_config.oapl_beta2)
    loss = aggregate(loss_mat, mask, OAPL_AGG_MODE, config, rollout_is_weights)
    return loss, unclipped_metrics(log_prob, old_log_prob, mask)


FAMILY = Family(
    OAPL,
    offpolicy_knobs=OFFPOLICY_KNOBS,
    loss_knobs=LOSS_KNOBS,
    estimator_rules=(check_oapl_pair, check_oapl_group, check_oapl_anchor),
    # V̂* = β1·log mean_j exp(r_j/β1) = r for a singleton or a group of equal rewards: A = 0
    estimators={OAPL: (EstimatorExample({"oapl_beta1": 1.0}, singleton="zero", equal_group=0.0),)},
    losses={OAPL: (LossExample({"oapl_beta2": 1.0e-3}),)},
)
