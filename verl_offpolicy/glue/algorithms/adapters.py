"""What the adapters of the algorithms part share: estimators' prepare/broadcast, losses' config/aggregation.

Estimators (``@register_adv_est``). verl calls ``fn(token_level_rewards, response_mask, config=<algorithm
config>, index=uid)`` and
expects ``(advantages, returns)``, both [B, T]. Each function here reads its hyperparameters from
``algorithm.offpolicy`` (its family's ``offpolicy_knobs``, validated at startup), turns the uids into group ids
(a hash table),
calls the formula in :mod:`verl_offpolicy.core.advantages` on the per-sequence scores
r_i = Σ_t token_level_rewards, and broadcasts A_i over the response tokens (× mask).

The formulas run in float64 (``COMPUTE_DTYPE``) on the per-sequence scores: for rewards of any
finite float16, bfloat16 or float32 value no intermediate overflows there (centred rewards and their
sums stay below 1e45 for groups of up to 1e6, agro's D² below 1e78, red_weight's d·e²⁰ below 1e48).
The advantages come back in the rewards' dtype, as verl's estimators return them (float32 for integer or bool
rewards); an advantage that
this dtype cannot hold (e.g. red_weight's d·e²⁰ for a reward gap of 2e30 in float32), or that
overflows float64 itself (float64 rewards near its maximum, or agro's D²/(2β) with an extreme β), is
a ValueError naming the estimator and the samples, never inf or NaN. The sum over tokens is taken in
float64 too when it exceeds the rewards' dtype.

Losses (``@register_policy_loss``). verl's ``ppo_loss`` calls ``fn(old_log_prob, log_prob, advantages,
response_mask, loss_agg_mode,
config=ActorConfig, rollout_is_weights)`` and expects ``(loss, metrics)``. Each function here reads
its parameters from ``config.policy_loss`` (an :class:`OffPolicyLossConfig`) and ε_low/ε_high from the
actor, builds the per-token loss with :mod:`verl_offpolicy.core.losses`, multiplies it by
``rollout_is_weights`` when given, and aggregates with verl's ``agg_loss(...,
**config.global_batch_info)`` so that micro-batch sums equal the global-batch value.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from verl_offpolicy.core import losses as core
from verl_offpolicy.glue.knobs import LOSS_PREFIX, Knob, OffPolicySection, read

# ---------------------------------------------------------------------- estimators

_MAX_REPORTED = 5
COMPUTE_DTYPE = torch.float64


def _check_finite(name: str, scores: Tensor, index: np.ndarray) -> None:
    """Raise naming the batch position and uid of every (first few) sample with a NaN/inf reward."""
    if math.isfinite(scores.sum()):  # a NaN/inf anywhere makes the sum non-finite
        return
    finite = torch.isfinite(scores)
    if bool(finite.all()):  # the sum overflowed, every reward is finite
        return
    bad = (~finite).nonzero().flatten().tolist()
    listed = _list_samples(bad, index, lambda i: f"{scores[i].item()}")
    raise ValueError(
        f"adv_estimator={name}: {len(bad)} sample(s) have a non-finite reward (sum of token_level_rewards): "
        f"{listed}. Fix the reward function or filter these samples."
    )


def _list_samples(bad: list[int], index: np.ndarray, describe) -> str:
    """The first few bad batch positions with their uid and ``describe(i)``, and how many more there are."""
    listed = "; ".join(f"batch position {i} (uid {str(index[i])!r}): {describe(i)}" for i in bad[:_MAX_REPORTED])
    return listed + (f"; and {len(bad) - _MAX_REPORTED} more" if len(bad) > _MAX_REPORTED else "")


def _group_ids(index: Any, size: int, device: torch.device) -> Tensor:
    """uids → dense group ids in [0, G), in order of first appearance.

    A hash table (``pandas.factorize``, O(B)) instead of verl's ``as_torch_index``, whose ``np.unique``
    sorts the uid strings: 0.9 ms instead of 5.2 ms for 16k uuid uids, most of an estimator's time.
    """
    codes, _ = pd.factorize(np.asarray(index, dtype=object))
    if codes.size != size:
        raise ValueError(f"index (uid) has {codes.size} entries but token_level_rewards has {size} rows")
    if size and codes.min() < 0:
        raise ValueError(f"index (uid) has a missing value at batch position {int(np.argmin(codes))}")
    return torch.from_numpy(codes).to(device)


def prepare(
    name: str, token_level_rewards: Tensor, index: Any, config: Any, knobs: tuple[Knob, ...] = ()
) -> tuple[SimpleNamespace, Tensor, Tensor]:
    """The values of ``knobs`` in ``algorithm.offpolicy`` (checked at startup), scores r_i [B] and group ids [B]."""
    section = SimpleNamespace(**read(config.get("offpolicy", None) if config is not None else None, knobs))
    if index is None:
        raise ValueError(f"adv_estimator={name} needs the group of each response (verl's non_tensor_batch['uid'])")
    index = np.asarray(index)
    scores = token_level_rewards.sum(dim=-1)
    if not math.isfinite(scores.sum()):  # a NaN/inf reward, or a sum beyond the rewards' dtype
        scores = token_level_rewards.to(COMPUTE_DTYPE).sum(dim=-1)
        _check_finite(name, scores, index)
    return section, scores.to(COMPUTE_DTYPE), _group_ids(index, scores.shape[0], scores.device)


def _check_representable(name: str, advantage: Tensor, result: Tensor, token_level_rewards: Tensor, index) -> None:
    """Raise naming the (first few) samples whose float64 advantage is not finite in the output's dtype."""
    if bool(torch.isfinite(result).all()):
        return
    bad = (~torch.isfinite(result)).nonzero().flatten().tolist()
    scores = token_level_rewards.to(COMPUTE_DTYPE).sum(dim=-1)
    listed = _list_samples(
        bad, np.asarray(index), lambda i: f"reward {scores[i].item():.6g}, advantage {advantage[i].item():.6g}"
    )
    dtype = result.dtype
    raise ValueError(
        f"adv_estimator={name}: {len(bad)} sample(s) get an advantage that {dtype} (the advantages' dtype, largest "
        f"finite value {torch.finfo(dtype).max:.6g}) cannot hold: {listed}. Scale the rewards down "
        "(or give them a wider dtype, e.g. float64) so that every advantage fits."
    )


def broadcast(
    name: str, advantage: Tensor, response_mask: Tensor, token_level_rewards: Tensor, index: Any
) -> tuple[Tensor, Tensor]:
    """A_i (float64) over the response tokens, in the rewards' dtype when it is a floating type and in
    float32 (verl's own reward dtype) for integer or bool rewards: (advantages, returns), both A_i·m_t."""
    dtype = token_level_rewards.dtype if token_level_rewards.is_floating_point() else torch.float32
    result = advantage.to(dtype)
    _check_representable(name, advantage, result, token_level_rewards, index)
    token_advantages = result.unsqueeze(-1) * response_mask
    return token_advantages, token_advantages


# ---------------------------------------------------------------------- losses


def our_loss_config(loss_mode: str, config: Any) -> Any:
    """The actor's ``policy_loss`` as our typed config, ``OffPolicyLossConfig`` (a TypeError naming the fix if
    it is verl's)."""
    policy_loss = getattr(config, "policy_loss", None)
    if not isinstance(policy_loss, OffPolicySection):
        raise TypeError(
            f"{LOSS_PREFIX}.loss_mode={loss_mode} is a verl-offpolicy loss, but {LOSS_PREFIX} is a "
            f"{type(policy_loss).__name__}, not verl-offpolicy's OffPolicyLossConfig: set "
            f"{LOSS_PREFIX}._target_=verl_offpolicy.glue.config.OffPolicyLossConfig or use a preset "
            "(+algorithm=<name>)"
        )
    return policy_loss


def check_dtype(loss_mode: str, log_prob: Tensor) -> None:
    """float16 cannot hold the clamped ratio e²⁰ ≈ 4.9e8 (nor pmd's (A/τ − Δ)²): a clear error, not inf."""
    if log_prob.dtype == torch.float16:
        raise TypeError(
            f"{LOSS_PREFIX}.loss_mode={loss_mode}: log_prob is float16, whose range (±65504) cannot hold the "
            "loss's ratios and squares (up to e^20 ≈ 4.9e8), so the loss could be inf. Compute the log-probs "
            "in float32 (verl's default), bfloat16 or float64."
        )


def aggregate(
    loss_mat: Tensor, mask: Tensor, loss_agg_mode: str, config: Any, rollout_is_weights: Tensor | None
) -> Tensor:
    """The per-token loss × verl's rollout IS weights (if any), aggregated by verl's ``agg_loss``."""
    if rollout_is_weights is not None:
        loss_mat = loss_mat * rollout_is_weights
    # imported here: importing verl's core_algos runs our registration, which imports this module's families
    from verl.trainer.ppo.core_algos import agg_loss

    return agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=loss_agg_mode, **config.global_batch_info)


def as_metrics(values: Tensor, fraction_metric: str | None = None) -> dict[str, float]:
    """verl's metric names as plain Python floats (one device sync); with ``fraction_metric`` (the family's
    ``Family.loss_fraction_metric(loss_mode)``, e.g. ``actor/offpolicy/rec/clipped_frac``), also the loss's fraction
    of response tokens clipped, masked or truncated under its own name, which is ``actor/pg_clipfrac``'s value (the
    fraction of response tokens with M_t = 0, or with w_i < 1 for TOPR): verl's name is shared by every loss."""
    metrics = dict(zip(core.METRIC_NAMES, values.detach().tolist(), strict=True))
    if fraction_metric is not None:
        metrics[fraction_metric] = metrics[core.METRIC_NAMES[0]]
    return metrics


def unclipped_metrics(log_prob: Tensor, old_log_prob: Tensor, mask: Tensor) -> dict[str, float]:
    """Metrics of a loss without a mask: ratio statistics of the clamped ratio (finite), nothing clipped."""
    log_ratio = core.clamp_log_ratio(core.token_log_ratio(log_prob, old_log_prob, mask))
    return as_metrics(core.ratio_metrics(log_ratio, torch.exp(log_ratio), mask))
