"""Advantage estimators of ``ALGORITHMS.md``: pure math on per-sequence scores (torch only, no verl).

Every estimator takes scores r [B] (one scalar reward per response) and integer group ids g [B]
(responses to the same prompt share an id, 0 ≤ g < B) and returns per-sequence advantages A [B].
Group statistics are segment reductions over the ids (``index_add_``, ``scatter_reduce``), never a
Python loop over groups.

Conventions of the spec, kept by every function here:

- a singleton group (K = 1) has baseline 0, so A = r;
- a group whose rewards are all equal gets A = 0 bit-exactly: group statistics are computed
  relative to the group maximum M (mean = M + Σ(r − M)/K), so they return the common value exactly;
- log-sum-exp is shifted by the group (or leave-one-out) maximum, so rewards of 1e4 with τ = 0.01
  stay finite.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

_UINT32 = 0xFFFFFFFF


class Groups(NamedTuple):
    """Group ids with the per-sample group size, built once per estimator call."""

    ids: Tensor  # [B] int64 in [0, num)
    num: int  # number of segments G (ids need not use all of them)
    size: Tensor  # [B] K of each sample's group, in the scores' dtype


def make_groups(group_ids: Tensor, dtype: torch.dtype) -> Groups:
    """Validate ``group_ids`` ([B] integer, ≥ 0) and count the members of each group."""
    if group_ids.dim() != 1 or group_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"group_ids must be a 1-D int64 tensor, got shape {tuple(group_ids.shape)} {group_ids.dtype}")
    ids = group_ids.long()
    num = int(ids.max()) + 1 if ids.numel() else 0
    count = torch.zeros(num, dtype=dtype, device=ids.device).index_add_(0, ids, torch.ones_like(ids, dtype=dtype))
    return Groups(ids, num, count[ids])


def group_sum(values: Tensor, groups: Groups) -> Tensor:
    """S_g = Σ_{i ∈ g} v_i, gathered back to each sample ([B])."""
    return values.new_zeros(groups.num).index_add_(0, groups.ids, values)[groups.ids]


def group_max(values: Tensor, groups: Groups) -> Tensor:
    """M_g = max_{i ∈ g} v_i, gathered back to each sample ([B])."""
    init = values.new_full((groups.num,), -math.inf)
    return init.scatter_reduce_(0, groups.ids, values, reduce="amax")[groups.ids]


def group_mean(values: Tensor, groups: Groups) -> Tensor:
    """v̄_g = M_g + Σ_{i ∈ g}(v_i − M_g)/K_g ([B]); exactly the common value if all v_i of g are equal."""
    top = group_max(values, groups)
    return top + group_sum(values - top, groups) / groups.size


def mean_baseline(scores: Tensor, groups: Groups) -> Tensor:
    """b_i = r̄ (group mean); 0 for a singleton group."""
    return torch.where(groups.size > 1, group_mean(scores, groups), 0.0)


def leave_one_out_mean_baseline(scores: Tensor, groups: Groups) -> Tensor:
    """b_i = r̄_{−i} = Σ_{j≠i} r_j/(K − 1); 0 for a singleton group."""
    top = group_max(scores, groups)
    centred = scores - top
    others = (group_sum(centred, groups) - centred) / (groups.size - 1).clamp_min(1)
    return torch.where(groups.size > 1, top + others, 0.0)


def logavgexp_baseline(scores: Tensor, groups: Groups, tau: float) -> Tensor:
    """b_i = τ·(logsumexp_{j∈g}(r_j/τ) − log K) = M + τ·(log Σ_j exp((r_j − M)/τ) − log K); 0 if K = 1."""
    top = group_max(scores, groups)
    sum_exp = group_sum(torch.exp((scores - top) / tau), groups)
    return torch.where(groups.size > 1, top + tau * (torch.log(sum_exp) - torch.log(groups.size)), 0.0)


def leave_one_out_logavgexp_baseline(scores: Tensor, groups: Groups, tau: float) -> Tensor:
    """b_i = τ·log((1/(K−1))·Σ_{j≠i} exp(r_j/τ)), exact (no clamp); 0 if K = 1.

    Shifted by the leave-one-out maximum M_{−i} so the sum is ≥ 1 and nothing over- or underflows:
    if another member attains the group maximum M, M_{−i} = M and Σ_{j≠i} = Σ_j − exp((r_i − M)/τ)
    (≥ 1, no cancellation); if i is the unique maximum, M_{−i} is the second largest value M₂ and the
    sum runs over the members below M.
    """
    top = group_max(scores, groups)
    at_top = scores == top
    unique_top = at_top & (group_sum(at_top.to(scores.dtype), groups) == 1)
    second = group_max(torch.where(at_top, -math.inf, scores), groups)  # -inf if all members are at M

    others_below_top = group_sum(torch.where(at_top, 0.0, torch.exp((scores - second) / tau)), groups)
    exp_vs_top = torch.exp((scores - top) / tau)
    others_with_top = group_sum(exp_vs_top, groups) - exp_vs_top

    shift = torch.where(unique_top, second, top)
    others = torch.where(unique_top, others_below_top, others_with_top)
    log_mean = torch.log(others) - torch.log((groups.size - 1).clamp_min(1))
    return torch.where(groups.size > 1, shift + tau * log_mean, 0.0)


def opmd_advantage(scores: Tensor, group_ids: Tensor, baseline: str = "mean", tau: float = 1.0) -> Tensor:
    """``opmd``: A_i = r_i − b, b = r̄ (``mean``) or b = τ·(logsumexp(r/τ) − log K) (``logavgexp``, τ > 0)."""
    groups = make_groups(group_ids, scores.dtype)
    if baseline == "mean":
        return scores - mean_baseline(scores, groups)
    if baseline == "logavgexp":
        return scores - logavgexp_baseline(scores, groups, tau)
    raise ValueError(f"opmd baseline must be 'mean' or 'logavgexp', got {baseline!r}")


def pmd_partition_advantage(scores: Tensor, group_ids: Tensor, tau: float) -> Tensor:
    """``pmd_partition``: A_i = r_i − τ·log((1/(K−1))·Σ_{j≠i} exp(r_j/τ)), τ > 0.

    τ → ∞ gives RLOO (r_i − r̄_{−i}); τ → 0 gives r_i − max_{j≠i} r_j.
    """
    groups = make_groups(group_ids, scores.dtype)
    return scores - leave_one_out_logavgexp_baseline(scores, groups, tau)


def asymre_advantage(scores: Tensor, group_ids: Tensor, shift: float) -> Tensor:
    """``asymre``: A_i = r_i − (r̄ + shift); a singleton has baseline 0 (A = r).

    A group of equal rewards gets A = −shift exactly: the shift is AsymRE's forward-KL pull
    (REINFORCE − c·log π ≡ shift −c), so it is not removed there.
    """
    groups = make_groups(group_ids, scores.dtype)
    return torch.where(groups.size > 1, (scores - group_mean(scores, groups)) - shift, scores)


def red_weight_advantage(scores: Tensor, group_ids: Tensor, temperature: float) -> Tensor:
    """``red_weight``: A_i = (r_i − r̄)·exp(min((r_i − r̄)/T, 20)), T > 0; a singleton gets A = r.

    The exponent is clamped at 20 (weight ≤ e²⁰ ≈ 4.9e8) so a large reward gap cannot overflow.
    A singleton has no group to weight against: its weight is 1 and A = r (spec: singletons get A = r).
    """
    groups = make_groups(group_ids, scores.dtype)
    centred = scores - group_mean(scores, groups)
    weighted = centred * torch.exp((centred / temperature).clamp(max=20.0))
    return torch.where(groups.size > 1, weighted, scores)


def agro_advantage(scores: Tensor, group_ids: Tensor, beta: float, on_policy: bool) -> Tensor:
    """``agro``: D_i = R_i − R̄_{−i}; off-policy A_i = D_i; on-policy A_i = D_i − (D_i² − mean_j D_j²)/(2β).

    ``scores`` are the regularised returns R_i = r_i − β·log(π(y_i)/π_ref(y_i)) (KL already in the
    reward). A singleton has D = R and mean_j D_j² = D², so A = R in both forms.
    """
    groups = make_groups(group_ids, scores.dtype)
    diff = scores - leave_one_out_mean_baseline(scores, groups)
    if not on_policy:
        return diff
    square = diff * diff
    return diff - (square - group_mean(square, groups)) / (2.0 * beta)


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit integer bit mixer (x in [0, 2³²) as int64; intermediates stay below 2⁶³)."""
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _UINT32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _UINT32
    return (x >> 16) ^ x


def occurrence_in_group(groups: Groups) -> Tensor:
    """o_i = #{j < i : g_j = g_i}, the position of each sample among its group's members in batch order."""
    order = torch.argsort(groups.ids, stable=True)
    starts = torch.cumsum(torch.bincount(groups.ids, minlength=groups.num), 0) - torch.bincount(
        groups.ids, minlength=groups.num
    )
    occurrence = torch.empty_like(order)
    occurrence[order] = torch.arange(order.numel(), device=order.device) - starts[groups.ids[order]]
    return occurrence


def red_drop_advantage(scores: Tensor, group_ids: Tensor, group_seeds: Tensor) -> Tensor:
    """``red_drop``: drop surplus negatives at random, then A_i = r_i − mean(kept rewards); dropped get 0.

    Positives are r_i ≥ r̄ (ties positive). If #neg > #pos in a group, #neg − #pos negatives are
    dropped uniformly at random (each negative's random key is a hash of its group's seed and of
    its occurrence index in the group, and the #pos smallest keys are kept), so the drop depends only
    on the group's seed (derived from (seed, uid)) and its rewards in batch order. A singleton gets A = r.

    Args:
        group_seeds: [G] int64 in [0, 2³²), one seed per group id.
    """
    groups = make_groups(group_ids, scores.dtype)
    ids = groups.ids
    positive = scores >= group_mean(scores, groups)
    n_pos = group_sum(positive.to(scores.dtype), groups)
    quota = torch.minimum(n_pos, groups.size - n_pos)  # negatives kept

    key = _mix32((group_seeds[ids] + occurrence_in_group(groups) * 0x9E3779B9) & _UINT32)
    # sort by (group, positive, key): each group's negatives come first, ordered by key
    order = torch.argsort((ids << 34) | (positive.long() << 33) | key, stable=True)
    counts = torch.bincount(ids, minlength=groups.num)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device) - starts[ids[order]]
    kept = positive | (rank < quota)

    top = group_max(scores, groups)
    kept_f = kept.to(scores.dtype)
    kept_mean = top + group_sum((scores - top) * kept_f, groups) / group_sum(kept_f, groups)
    advantage = torch.where(kept, scores - kept_mean, 0.0)
    return torch.where(groups.size > 1, advantage, scores)
