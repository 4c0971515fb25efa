"""TOPR (``adv_estimator=topr``, ``loss_mode=topr``, docs/algo/topr.md): its estimator and loss adapters.

The ``topr`` estimator is the paper's: the raw reward (0/1 rewards as ±1) minus one scalar baseline c
(``algorithm.offpolicy.topr_baseline``, default 0). The ``topr_group_mean`` preset, ours, pairs the loss with
verl's group-mean ``grpo`` advantage instead. ``topr_reward=signed`` refuses rewards outside {0, 1} in every
batch; at startup, where the reward function can be called before the run, :func:`check_topr_reward_range`
refuses it already (a ±1 reward passes a batch in which every answer is right).
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
    as_metrics,
    broadcast,
    check_dtype,
    our_loss_config,
    prepare,
)
from verl_offpolicy.glue.family import EstimatorExample, Family, LossExample
from verl_offpolicy.glue.knobs import Knob, OffPolicyConfigError, finite
from verl_offpolicy.glue.reward_probe import GROUND_TRUTH, first_row_answers, reward_of

OFFPOLICY_KNOBS = (
    Knob(
        "topr_baseline",
        0.0,
        "topr: scalar baseline c of A = R − c (TOPR's default 0; no group statistic).",
        check=finite,
    ),
    Knob(
        "topr_reward",
        "signed",
        "topr: reward R: signed (2r − 1: 0/1 rewards as TOPR's ±1; other rewards are an error) | raw (r).",
        choices=core_adv.TOPR_REWARDS,
        variant=False,
    ),  # the rewards' scale (0/1 or already ±1), not another algorithm: TOPR either way
)


# The responses the startup check scores on the first training row: a correct one and a wrong one.
PROBES = ((GROUND_TRUTH, "its ground truth"), ("", "an empty response"))


def check_topr_reward_range(view) -> None:
    """``topr_reward=signed`` maps 0/1 rewards to ±1: the reward function's rewards of the first training row's
    ground truth and of an empty response must be 0 or 1, where they can be known before the run (verl's
    rule-based reward managers, a training file; :func:`verl_offpolicy.glue.reward_probe.first_row_answers`).
    A reward function that fails on the probe is left to the per-batch check."""
    if view.adv_estimator != "topr" or view.offpolicy.topr_reward != "signed":
        return
    try:
        answers = first_row_answers(view.cfg, [solution for solution, _ in PROBES])
    except Exception:  # noqa: BLE001 - the run's own per-batch check still applies
        return
    if isinstance(answers, str):
        return
    found = [(reward_of(answer), what) for answer, (_, what) in zip(answers, PROBES)]
    outside = [f"{reward:g} for {what}" for reward, what in found if reward not in (0.0, 1.0)]
    if outside:
        path = view.select("reward.custom_reward_function.path")
        name = view.select("reward.custom_reward_function.name")
        function = f"{path}:{name}" if path else "verl's default_compute_score"
        raise OffPolicyConfigError(
            f"algorithm.offpolicy.topr_reward=signed maps 0/1 rewards to TOPR's ±1 (R = 2r − 1), but the reward "
            f"function ({function}) gives {' and '.join(outside)} on the first training row: set "
            "algorithm.offpolicy.topr_reward=raw (R = r: rewards already on TOPR's scale, e.g. ±1, or partial credit) "
            "or use a 0/1 reward"
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
        raise ValueError(
            f"adv_estimator=topr, algorithm.offpolicy.topr_reward={section.topr_reward}: {error}"
        ) from None
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
    return loss, as_metrics(
        core.ratio_metrics(log_ratio, ratio, mask, full_weight, torch.zeros_like(ratio)),
        FAMILY.loss_fraction_metric("topr"),
    )


FAMILY = Family(
    "topr",
    offpolicy_knobs=OFFPOLICY_KNOBS,
    estimator_rules=(check_topr_reward_range,),
    loss_fractions={"topr": "truncated"},
    # raw: A = r − c with c = 0 and no group statistic, so a singleton and each member of an equal group get A = r
    estimators={
        "topr": (
            EstimatorExample({"topr_reward": "raw", "topr_baseline": 0.0}, singleton="reward", equal_group="reward"),
        )
    },
    losses={"topr": (LossExample(),)},
)
