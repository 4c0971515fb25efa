"""Advantage estimators of ``docs/algorithms.md``: pure math on per-sequence scores (torch only, no verl).

Every estimator takes scores r [B] (one scalar reward per response) and integer group ids g [B]
(responses to the same prompt share an id ≥ 0) and returns per-sequence advantages A [B]. Group
statistics are segment reductions over the ids (``index_add_``, ``scatter_reduce``) computed once
per group and gathered back, never a Python loop over groups.

Conventions of the spec, kept by every function here:

- a singleton group (K = 1) has baseline 0, so A = r;
- a group whose rewards are all equal gets A = 0 bit-exactly: rewards are centred on the group
  maximum M (c_i = r_i − M, which is exactly 0 for every member of such a group) and advantages are
  computed from c, e.g. r_i − r̄ = c_i − Σ_j c_j/K;
- log-sum-exp is shifted by the group (or leave-one-out) maximum, so rewards of 1e4 with τ = 0.01
  stay finite;
- the arithmetic is floating point whatever the scores' dtype: integer and bool scores are converted
  to float64 first (:func:`float_scores`), so [3, 0, 0, 0] gives [2.25, −0.75, −0.75, −0.75], never a
  truncated [2, 0, 0, 0]; floating scores keep their dtype.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

_UINT32 = 0xFFFFFFFF
# Exponents of the shifted log-sum-exp are ≤ 0 and the sums hold a term e⁰ = 1; terms below e⁻⁸⁰
# (≈ 1.8e−35) cannot change such a sum in float32 or float64, but float32 subnormals (below e⁻⁸⁷)
# make ``exp`` an order of magnitude slower, so exponents are floored at −80.
_EXP_FLOOR = -80.0


class Groups(NamedTuple):
    """Group ids [B] and the size K_g of every group [G] (G = max id + 1; unused ids have K = 0)."""

    ids: Tensor
    count: Tensor


def float_scores(scores: Tensor) -> Tensor:
    """``scores`` as floating point: float64 for integer or bool scores (exact for integers up to 2⁵³), else
    unchanged."""
    return scores if scores.is_floating_point() else scores.to(torch.float64)


def make_groups(group_ids: Tensor, dtype: torch.dtype) -> Groups:
    """Validate ``group_ids`` (1-D, integer, ≥ 0) and count the members of each group."""
    if group_ids.dim() != 1 or group_ids.dtype not in (torch.int64, torch.int32):
        shape = tuple(group_ids.shape)
        raise ValueError(f"group_ids must be a 1-D integer tensor, got shape {shape} {group_ids.dtype}")
    ids = group_ids.long()
    return Groups(ids, torch.bincount(ids).to(dtype))


def gather(group_values: Tensor, groups: Groups) -> Tensor:
    """The value of each sample's group: v_{g_i} ([G] → [B])."""
    return group_values.index_select(0, groups.ids)


def segment_sum(values: Tensor, groups: Groups) -> Tensor:
    """S_g = Σ_{i ∈ g} v_i ([B] → [G])."""
    return values.new_zeros(groups.count.shape).index_add_(0, groups.ids, values)


def segment_max(values: Tensor, groups: Groups) -> Tensor:
    """M_g = max_{i ∈ g} v_i ([B] → [G]; −inf for an empty id)."""
    return values.new_full(groups.count.shape, -math.inf).scatter_reduce_(0, groups.ids, values, reduce="amax")


def centre_on_max(scores: Tensor, groups: Groups) -> tuple[Tensor, Tensor]:
    """(M_g [G], c_i = r_i − M_{g_i} [B]); c_i is exactly 0 for members at their group maximum."""
    top = segment_max(scores, groups)
    return top, scores - gather(top, groups)


def _exp(exponent: Tensor) -> Tensor:
    """exp of a log-sum-exp exponent (≤ 0 wherever it is used), clamped to [``_EXP_FLOOR``, 0]."""
    return torch.exp(exponent.clamp(_EXP_FLOOR, 0.0))


def _singleton_or(values: Tensor, singleton_value: Tensor, groups: Groups) -> Tensor:
    """Group-level ``values``, replaced by ``singleton_value`` for groups with K = 1."""
    return torch.where(groups.count > 1, values, singleton_value)


def opmd_advantage(scores: Tensor, group_ids: Tensor, baseline: str = "mean", tau: float = 1.0) -> Tensor:
    """``opmd``: A_i = r_i − b, b = r̄ (``mean``) or b = τ·(logsumexp_j(r_j/τ) − log K) (``logavgexp``, τ > 0).

    Computed as A_i = c_i − q_g with q = Σ_j c_j/K (mean) or q = τ·(log Σ_j exp(c_j/τ) − log K)
    (logavgexp: the log-sum-exp shifted by the group maximum). A singleton has b = 0 (q = −M).
    """
    scores = float_scores(scores)
    groups = make_groups(group_ids, scores.dtype)
    top, centred = centre_on_max(scores, groups)
    if baseline == "mean":
        offset = segment_sum(centred, groups) / groups.count
    elif baseline == "logavgexp":
        offset = log_mean_exp(centred, groups, tau)
    else:
        raise ValueError(f"opmd baseline must be 'mean' or 'logavgexp', got {baseline!r}")
    return centred - gather(_singleton_or(offset, -top, groups), groups)


# Below this |c|/T the expansion mean(c) + var(c)/(2T) is log-mean-exp to float64 rounding (its next term is
# below |c|·2⁻⁵²/6), and it cannot underflow.
_EXPANSION_BELOW = 2.0**-26


def log_mean_exp(centred: Tensor, groups: Groups, temperature: float) -> Tensor:
    """q_g = T·log((1/K_g)·Σ_{j ∈ g} exp(c_j/T)) for c = r − M_g (≤ 0, 0 at the maximum): the group's
    T·log((1/K)·Σ_j exp(r_j/T)) minus M_g ([B] → [G], in ``centred``'s dtype).

    Computed as T·log1p((1/K)·Σ_j expm1(c_j/T)): every term expm1(c_j/T) lies in [−1, 0], so the sum does not
    cancel, and for T ≫ |c| each term is c_j/T to its own rounding, so q tends to the group mean of c as T grows
    (T·(log Σ exp − log K) subtracts two numbers near log K and, once |c|/T is below their rounding, returns 0 or
    the opposite limit). Where every |c_j|/T < 2⁻²⁶, q is the expansion mean(c) + var(c)/(2T) itself (exact to
    rounding there, and free of the underflow of c/T). The arithmetic is float64 whatever ``centred``'s dtype: a
    float32 T cannot hold 1e300, and its rounding would make q = 0 (A = r − max) from T ≈ 1e8 on.
    """
    c = centred.to(torch.float64)
    groups64 = Groups(groups.ids, groups.count.to(torch.float64))
    scaled = c / temperature
    mean = segment_sum(c, groups64) / groups64.count
    spread = segment_sum((c - gather(mean, groups64)) ** 2, groups64) / groups64.count
    expansion = mean + spread / (2.0 * temperature)
    log_mean = torch.log1p(segment_sum(torch.expm1(scaled.clamp(min=_EXP_FLOOR)), groups64) / groups64.count)
    small = segment_max(scaled.abs(), groups64) < _EXPANSION_BELOW
    return torch.where(small, expansion, temperature * log_mean).to(centred.dtype)


def oapl_advantage(scores: Tensor, group_ids: Tensor, beta1: float) -> Tensor:
    """``oapl``: A_i = r_i − V̂*(x), V̂*(x) = β1·log((1/K)·Σ_j exp(r_j/β1)), β1 > 0 (all K samples of the prompt).

    V̂* estimates the optimal value of the KL-regularised objective against the policy that sampled the group
    (OAPL, Ritter et al., arXiv 2602.19362; the authors' code: ``values = β1·log(mean(exp(r/β1)))`` over the
    prompt's responses). A singleton has V̂* = r, so A = 0. β1 → 0 gives V̂* → max_j r_j; β1 → ∞ gives r̄.
    """
    scores = float_scores(scores)
    groups = make_groups(group_ids, scores.dtype)
    _, centred = centre_on_max(scores, groups)
    return centred - gather(log_mean_exp(centred, groups, beta1), groups)


def pmd_partition_advantage(scores: Tensor, group_ids: Tensor, tau: float, clamp: float | None = None) -> Tensor:
    """``pmd_partition``: A_i = r_i − τ·log((1/(K−1))·Σ_{j≠i} exp(r_j/τ)), τ > 0; clamped if ``clamp`` = c.

    With c ∈ (0, 1): A_i = −τ·max(log((1/(K−1))·Σ_{j≠i} exp((r_j − r_i)/τ)), log c) = min(A_i, −τ·log c)
    (:func:`clamp_partition`); a singleton keeps A = r.

    τ → ∞ gives RLOO (r_i − r̄_{−i}); τ → 0 gives r_i − max_{j≠i} r_j. The leave-one-out sum is
    shifted by the leave-one-out maximum, so it is ≥ 1 and nothing over- or underflows:

    - if another member also attains the group maximum M (or r_i < M):
      A_i = c_i − τ·(log(Σ_j e_j − e_i) − log(K−1)), e_j = exp((r_j − M)/τ), the sum holding a term 1;
    - if i is the unique maximum, with M₂ the largest other reward:
      A_i = r_i − M₂ − τ·(log Σ_{j≠i} exp((r_j − M₂)/τ) − log(K−1)).
    """
    scores = float_scores(scores)
    groups = make_groups(group_ids, scores.dtype)
    top, centred = centre_on_max(scores, groups)
    at_top = centred == 0
    unique_top = at_top & (gather(segment_sum(at_top.to(scores.dtype), groups), groups) == 1)
    log_others = torch.log((groups.count - 1).clamp_min(1))

    exp_vs_top = _exp(centred / tau)
    sum_vs_top = gather(segment_sum(exp_vs_top, groups), groups)
    shared_top = centred - tau * (torch.log(sum_vs_top - exp_vs_top) - gather(log_others, groups))

    second = segment_max(scores.masked_fill(at_top, -math.inf), groups)  # −inf if all members are at M
    below_top = _exp((scores - gather(second, groups)) / tau).masked_fill_(at_top, 0.0)
    sum_below = segment_sum(below_top, groups)
    max_baseline = _singleton_or(second + tau * (torch.log(sum_below) - log_others), torch.zeros_like(top), groups)
    advantage = torch.where(unique_top, scores - gather(max_baseline, groups), shared_top)
    return advantage if clamp is None else clamp_partition(advantage, groups, tau, clamp)


def clamp_partition(advantage: Tensor, groups: Groups, tau: float, clamp: float) -> Tensor:
    """A_i ← min(A_i, −τ·log c) for K > 1: the leave-one-out partition term floored at log c (OpenKimi).

    OpenKimi's ``ploo`` (openkimi/pmd/core_algos.py, ``compute_partition_loo_outcome_advantage``)
    computes A_i = r_i − M − τ·log(max((1/(K−1))·Σ_{j≠i} exp((r_j − M)/τ), 1e-8)), M the group maximum.
    For r_i = M this is the floor above; for r_i < M the sum holds exp(0) = 1, so the floor is inactive
    in both forms whenever K − 1 < 1/c. A lone correct answer among 0/1 rewards at τ = 0.01, c = 1e-8
    gets A = 0.01·ln(1e8) ≈ 0.184 instead of 1 (a target log-ratio A/τ of 18.4 nats instead of 100).
    """
    capped = advantage.clamp(max=-tau * math.log(clamp))
    return torch.where(gather(groups.count, groups) > 1, capped, advantage)


def asymre_advantage(scores: Tensor, group_ids: Tensor, shift: float) -> Tensor:
    """``asymre``: A_i = r_i − (r̄ + shift) = c_i − (Σ_j c_j/K + shift); a singleton has baseline 0 (A = r).

    A group of equal rewards gets A = −shift exactly: the shift is AsymRE's forward-KL pull
    (REINFORCE − c·log π ≡ shift −c), so it is not removed there.
    """
    scores = float_scores(scores)
    groups = make_groups(group_ids, scores.dtype)
    top, centred = centre_on_max(scores, groups)
    offset = segment_sum(centred, groups) / groups.count + shift
    return centred - gather(_singleton_or(offset, -top, groups), groups)


def red_weight_advantage(scores: Tensor, group_ids: Tensor, temperature: float) -> Tensor:
    """``red_weight``: A_i = (r_i − r̄)·exp(min((r_i − r̄)/T, 20)), T > 0; a singleton gets A = r.

    The exponent is clamped at 20, so the weight itself is ≤ e²⁰ ≈ 4.9e8 and never overflows; A = d·e²⁰
    still exceeds a dtype's range when |d| does (float32: |d| > 7e29). Called in float64 (as the glue
    does) nothing overflows for rewards within float32's range; the glue raises if A does not fit the
    rewards' dtype. A singleton has no group to weight against: its weight is 1 and A = r (spec:
    singletons get A = r).
    """
    scores = float_scores(scores)
    groups = make_groups(group_ids, scores.dtype)
    top, centred = centre_on_max(scores, groups)
    diff = centred - gather(segment_sum(centred, groups) / groups.count, groups)  # 0 for a singleton
    singleton_reward = _singleton_or(torch.zeros_like(top), top, groups)  # adds r to a singleton's 0
    return diff * torch.exp((diff / temperature).clamp(max=20.0)) + gather(singleton_reward, groups)


def agro_advantage(scores: Tensor, group_ids: Tensor, beta: float, on_policy: bool) -> Tensor:
    """``agro``: D_i = R_i − R̄_{−i}; off-policy A_i = D_i; on-policy A_i = D_i − (D_i² − c_i)/(2β).

    ``scores`` are the regularised returns R_i = r_i − β·log(π(y_i)/π_ref(y_i)) (KL already in the
    reward). D_i = (K·(R_i − M) − Σ_j (R_j − M))/(K − 1), M the group maximum. A singleton has D = R
    and, in the on-policy form, c = D², so A = R in both forms.

    On-policy, c_i = K/(K−1)·s²_{−i}, s²_{−i} the unbiased sample variance of the other K−1 returns
    (:func:`agro_onpolicy_offset`), makes (1/K)·Σ_i A_i·∇log π(y_i) an unbiased estimate of
    ∇(E_π[R] − Var_π(R)/(2β)) (R held fixed): E[D_i² − c_i | y_i] = (R_i − E_π R)² − Var_π R.
    """
    scores = float_scores(scores)
    groups = make_groups(group_ids, scores.dtype)
    top, centred = centre_on_max(scores, groups)
    others = (groups.count - 1).clamp_min(1)
    scale = _singleton_or(groups.count / others, torch.ones_like(top), groups)
    offset = _singleton_or(segment_sum(centred, groups) / others, -top, groups)
    diff = gather(scale, groups) * centred - gather(offset, groups)
    if not on_policy:
        return diff
    square = diff * diff
    return diff - (square - agro_onpolicy_offset(centred, square, groups)) / (2.0 * beta)


def pairwise_opmd_advantage(scores: Tensor, group_ids: Tensor, tau: float) -> Tensor:
    """``pairwise_opmd``: A_i = 2·K·τ·(a_i − ā)/(1+τ)², a_i the regularised return (KL in the reward).

    ``scores`` are a_i = r_i − τ·(log π(y_i) − log π_ref(y_i)) (verl's KL-in-reward, coefficient τ). Since
    Σ_{i<j}(a_i − a_j)² = K·Σ_i(a_i − ā)², the gradient of J/(1+τ)² is −Σ_i A_i·∇log π(y_i) with this A
    at the weights that computed a (OPMD report, section 2). A singleton group has no pair: A = 0.
    """
    scores = float_scores(scores)
    groups = make_groups(group_ids, scores.dtype)
    _, centred = centre_on_max(scores, groups)
    deviation = centred - gather(segment_sum(centred, groups) / groups.count, groups)
    return gather(groups.count, groups) * deviation * (2.0 * tau / (1.0 + tau) ** 2)


TOPR_REWARDS = ("signed", "raw")


def topr_reward(scores: Tensor, reward: str) -> Tensor:
    """TOPR's reward R_i: 2·r_i − 1 (``signed``: the 0/1 rewards of a verifiable task as TOPR's ±1) or r_i (``raw``).

    ``signed`` is defined for rewards in {0, 1} only: anything else raises a ValueError naming the range found
    (a ±1 reward would become {1, −3}, a fraction of partial credit a mostly negative R).
    """
    scores = float_scores(scores)
    if reward == "signed":
        check_binary(scores)
        return 2.0 * scores - 1.0
    if reward != "raw":
        raise ValueError(f"topr reward must be one of {', '.join(TOPR_REWARDS)}, got {reward!r}")
    return scores


def check_binary(scores: Tensor) -> None:
    """Raise a ValueError if a score is not 0 or 1, naming the range found and how many scores lie outside {0, 1}."""
    outside = (scores != 0) & (scores != 1)
    if bool(outside.any()):
        raise ValueError(
            f"topr reward 'signed' maps 0/1 rewards to TOPR's ±1 (R = 2r − 1), but {int(outside.sum())} of "
            f"{scores.numel()} rewards are outside {{0, 1}} (range found: [{float(scores.min()):g}, "
            f"{float(scores.max()):g}]). Rewards already on TOPR's scale (e.g. a ±1 math reward) or partial credit "
            "need topr_reward 'raw' (R = r)"
        )


def topr_advantage(scores: Tensor, baseline: float, reward: str = "signed") -> Tensor:
    """``topr``: A_i = R_i − c, R_i of :func:`topr_reward`, c one scalar baseline for every sample.

    No group statistic (Le Roux et al., arXiv 2503.14286): c sets the effective fraction of positive samples,
    so an all-correct group keeps A = 1 − c (TOPR's SFT-like term) and an all-wrong one −1 − c (its tapered
    push-down), where a group-mean baseline would give both 0. A singleton is no exception: A = R − c.
    """
    return topr_reward(scores, reward) - baseline


def agro_onpolicy_offset(centred: Tensor, square: Tensor, groups: Groups) -> Tensor:
    """c_i = K/(K−1)·s²_{−i}, s²_{−i} = (Q − K·e_i²/(K−1))/(K−2) for K ≥ 3; c_i = 0 at K = 2; D_i² at K = 1.

    e_i = R_i − R̄ (deviation from the group mean) and Q = Σ_j e_j²: the other K−1 returns have
    sum −e_i and squared deviations Q − e_i² − e_i²/(K−1) around their own mean. At K = 2 there is
    one other return (no variance), and c_i = 0 keeps the estimate unbiased: a constant added to
    A_i has zero expected gradient. ``square`` = D_i² (the singleton's c, so that its A = R).
    """
    count = gather(groups.count, groups)
    deviation = centred - gather(segment_sum(centred, groups) / groups.count, groups)
    spread = gather(segment_sum(deviation * deviation, groups), groups)
    others_var = (spread - count / (count - 1).clamp_min(1) * deviation * deviation).clamp_min(0.0)
    others_var = others_var / (count - 2).clamp_min(1)
    offset = torch.where(count > 2, count / (count - 1).clamp_min(1) * others_var, torch.zeros_like(square))
    return torch.where(count > 1, offset, square)


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit integer bit mixer (x in [0, 2³²) as int64; intermediates stay below 2⁶³)."""
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _UINT32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _UINT32
    return (x >> 16) ^ x


def occurrence_in_group(group_ids: Tensor, order: Tensor | None = None) -> Tensor:
    """o_i = #{j < i : g_j = g_i}: each sample's position among its group's members in batch order.

    ``order`` is a stable argsort of ``group_ids`` if the caller has one (computed otherwise).
    """
    ids = group_ids.long()
    if order is None:
        order = torch.argsort(ids, stable=True)
    counts = torch.bincount(ids)
    starts = torch.cumsum(counts, 0) - counts
    in_order = torch.arange(order.numel(), device=order.device) - starts.index_select(0, ids.index_select(0, order))
    return torch.empty_like(order).scatter_(0, order, in_order)


def red_drop_advantage(
    scores: Tensor, group_ids: Tensor, group_seeds: Tensor, occurrence: Tensor | None = None
) -> Tensor:
    """``red_drop``: drop surplus negatives at random, then A_i = r_i − mean(kept rewards); dropped get 0.

    Positives are r_i ≥ r̄ (ties positive). If #neg > #pos in a group, #neg − #pos of its negatives
    are dropped uniformly at random: each member gets the key hash(seed_g, o_i) from its group's seed
    (derived from (seed, uid)) and its occurrence index o_i in the group, and the #pos negatives with
    the smallest keys are kept. The drop therefore depends only on the group's seed and its rewards
    in batch order, not on the rest of the batch. A singleton gets A = r.

    Args:
        group_seeds: [G] int64 in [0, 2³²), one seed per group id.
        occurrence: o_i from :func:`occurrence_in_group`, if the caller has it.
    """
    scores = float_scores(scores)
    groups = make_groups(group_ids, scores.dtype)
    if scores.numel() == 0:  # an empty batch has no group to drop from (and no largest group)
        return scores.clone()
    ids = groups.ids
    top, centred = centre_on_max(scores, groups)
    positive = centred >= gather(segment_sum(centred, groups) / groups.count, groups)
    n_pos = segment_sum(positive.to(scores.dtype), groups)
    quota = torch.minimum(n_pos, groups.count - n_pos)  # negatives kept per group

    if occurrence is None:
        occurrence = occurrence_in_group(ids)
    key = _mix32((gather(group_seeds, groups) + occurrence * 0x9E3779B9) & _UINT32)
    # rank of each negative among its group's negatives by key: a row sort of a [G, K_max] table of
    # keys made unique by the occurrence (positives after every negative, padding last)
    width = int(groups.count.max())
    slot = ids * width + occurrence
    table = torch.full((groups.count.numel() * width,), 2**33 * width, dtype=torch.long, device=ids.device)
    table.index_copy_(0, slot, (key + positive.long() * 2**32) * width + occurrence)
    by_key = torch.argsort(table.view(-1, width), dim=1)
    columns = torch.arange(width, device=ids.device).expand_as(by_key)
    rank = torch.empty_like(by_key).scatter_(1, by_key, columns).view(-1).index_select(0, slot)
    kept = positive | (rank < gather(quota, groups))

    kept_f = kept.to(scores.dtype)
    kept_mean = segment_sum(centred * kept_f, groups) / segment_sum(kept_f, groups)
    advantage = (centred - gather(kept_mean, groups)) * kept_f  # 0 for a singleton (its member is kept, c = 0)
    return advantage + gather(_singleton_or(torch.zeros_like(top), top, groups), groups)
