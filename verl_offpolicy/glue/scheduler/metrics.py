"""The metrics the ``offpolicy`` trainer logs: one place for their names (``docs/scheduler.md``, "What it logs").

Staleness is logged under verl's own names: verl 0.9.1's v1 trainer (``PPOTrainer._compute_metrics``)
computes ``training/off_policy/trajectory_staleness/{mean,max,min}`` = (t − 1) − (version of the weights
that generated each trajectory), from the version tag the rollout server puts on each trajectory (the
``global_steps`` the trainer passes to ``update_weights``), plus ``trajectory_staleness_worst/*`` and
``trajectory_spans/*``. This package does not log a second copy: the trainer checks the same version tags
against the schedule before it trains a batch (:func:`verl_offpolicy.glue.scheduler.rollout.check_observed_version`),
and logs under ``offpolicy/`` only what verl has no name for.

Off-policy health (:func:`anchor_corr_metrics`): on a stale batch the trainer logs verl's own ``rollout_corr/*``
statistics, computed by verl's functions between the ratio anchor and the proximal policy, under
``offpolicy/anchor_corr/`` with verl's suffixes (verl computes them only between the rollout and the proximal
log-probs, and only with ``algorithm.rollout_correction`` set): the staleness gap. The other gap, the inference
and training engines' mismatch at the weights that generated the batch, is logged with the same statistics under
``offpolicy/engine_mismatch/`` on every step where both log-probs exist (:func:`engine_mismatch_metrics`,
:func:`engine_mismatch_pair`), with or without a rollout correction.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from verl.trainer.ppo.rollout_corr_helper import (
    SAFETY_BOUND,
    compute_offpolicy_metrics,
    compute_rollout_correction_weights,
)

from verl_offpolicy.glue.scheduler.knobs import BEHAVIOUR, PROXIMAL

# verl's names (verl/trainer/ppo/v1/trainer_base.py, _compute_metrics), logged by verl itself.
VERL_STALENESS = "training/off_policy/trajectory_staleness"
VERL_STALENESS_WORST = "training/off_policy/trajectory_staleness_worst"
VERL_SPANS = "training/off_policy/trajectory_spans"
STATS = ("mean", "max", "min")

# Ours: what verl lacks.
VERSION = "offpolicy/version"
QUEUE_LEN = "offpolicy/queue_len"
ROLLOUT_BATCHES_PER_SYNC = "offpolicy/rollout_batches_per_sync"
ROLLOUT_CALLS = "offpolicy/rollout_calls"
GENERATED_BATCHES = "offpolicy/generated_batches"
ANCHOR_LOG_RATIO = "offpolicy/anchor_log_ratio/mean"
WAIT_S = "offpolicy/wait_s"  # the trainer's wait for its batch at this step
SYNC_WAIT_S = "offpolicy/sync_wait_s"  # overlapped: the wait for a weight push to the rollout
WEIGHT_PUSHES = "offpolicy/weight_pushes"  # overlapped: the schedule's pushes so far
VALIDATION_PUSHES = (
    "offpolicy/validation_pushes"  # overlapped: pushes made only so that validation sees the step's weights
)
ROLLOUT_BUSY_FRACTION = "offpolicy/rollout_busy_fraction"
OBSERVED_VERSION_MIN = "offpolicy/observed_version/min"  # the versions the rollout reported for the trained batch
OBSERVED_VERSION_MAX = "offpolicy/observed_version/max"
# Partial rollouts (algorithm.offpolicy.partial_rollout): the versions that sampled the trained batch's tokens.
TOKEN_VERSION = "offpolicy/token_version"  # /min, /max, /mean over response tokens
TOKEN_STALENESS = "offpolicy/token_staleness"  # /mean, /max: (t − 1) − the token's version
SPANNING_FRACTION = "offpolicy/token_version/spanning_fraction"  # of responses whose tokens span versions
TOKENS_AT_OFFSET = "offpolicy/token_version/tokens_at_offset_"  # + k: tokens sampled k versions after v(t)
# of the response tokens, those checked against the server's own record of the weights that sampled them (hf)
SERVER_RECORDED_FRACTION = "offpolicy/token_version/server_recorded_fraction"
# the tokens the trainer's own weights (version t − 1) sampled, and the largest |trainer − rollout| log-prob gap on them
FRESH_TOKENS = "offpolicy/token_version/fresh_tokens"
FRESH_LOGPROB_GAP_MAX = "offpolicy/token_version/fresh_logprob_gap_max"

# DAPO group filtering (algorithm.filter_groups, glue/scheduler/filtering.py), logged at the step that trains the
# batch: verl's names for what was filtered (verl counts prompt groups as "samples"), ours for the rounds.
FILTER_EVICTED = "training/filter_groups/evicted_samples"
FILTER_SURPLUS = "training/filter_groups/discarded_surplus_samples"
FILTER_GENERATED = "offpolicy/filter_groups/generated_groups"
FILTER_ROUNDS = "offpolicy/filter_groups/gen_rounds"

# verl's rollout_corr/* statistics, computed between the ratio anchor and the proximal policy on every batch
# trained stale: ANCHOR_CORR_PREFIX + each of ANCHOR_CORR_STATS (verl's suffixes, rollout_corr_helper.py).
ANCHOR_CORR_PREFIX = "offpolicy/anchor_corr/"
# compute_offpolicy_metrics: every key it returns when given both log-probs
ANCHOR_CORR_DIVERGENCE = (
    "kl",
    "k3_kl",
    "chi2_token",
    "chi2_seq",
    "training_ppl",
    "training_log_ppl",
    "rollout_ppl",
    "rollout_log_ppl",
    "log_ppl_diff",
    "log_ppl_abs_diff",
    "log_ppl_diff_max",
    "log_ppl_diff_min",
    "ppl_ratio",
)
# compute_rollout_correction_weights (token level): the keys that do not depend on a truncation threshold
ANCHOR_CORR_WEIGHTS = (
    "rollout_is_eff_sample_size",
    "rollout_is_mean",
    "rollout_is_std",
    "rollout_is_max",
    "rollout_is_min",
    "rollout_is_seq_mean",
    "rollout_is_seq_std",
    "rollout_is_seq_max",
    "rollout_is_seq_min",
    "rollout_is_seq_max_deviation",
)
ANCHOR_CORR_STATS = ANCHOR_CORR_DIVERGENCE + ANCHOR_CORR_WEIGHTS
# The same statistics between the training engine's log-probs at the weights that generated the batch (verl's π_old
# place) and the inference engine's (π_rollout): ENGINE_MISMATCH_PREFIX + each of ANCHOR_CORR_STATS.
ENGINE_MISMATCH_PREFIX = "offpolicy/engine_mismatch/"
# No truncation: the weights are verl's SAFETY_BOUND-clamped ratios (ρ ≤ e²⁰, as in our losses), so the ESS is
# the raw ratio's.
UNTRUNCATED = math.exp(SAFETY_BOUND)


def staleness_key(stat: str = "mean") -> str:
    """verl's name of one statistic of the trained batch's staleness, e.g. ``.../trajectory_staleness/mean``."""
    return f"{VERL_STALENESS}/{stat}"


def queue_metrics(version: int, queue_len: int, rollout_batches_per_sync: int) -> dict[str, float]:
    """The trained batch's version v(t), the FIFO length (its own batch included) and the size of the
    last rollout call, in batches."""
    return {
        VERSION: float(version),
        QUEUE_LEN: float(queue_len),
        ROLLOUT_BATCHES_PER_SYNC: float(rollout_batches_per_sync),
    }


def filter_metrics(generated: int, dropped: int, surplus: int, rounds: int, dropped_values: dict | None = None) -> dict:
    """What group filtering did to one trained batch: the prompt groups generated for it over all rounds
    (= data.train_batch_size + dropped + surplus), the groups dropped (the same metric on every sample) and
    the surplus discarded, and the generation rounds its version took (1: no top-up). ``dropped_values``
    ({shared metric value: groups}) goes under verl's key, which verl's trainer turns into its wandb table."""
    metrics = {
        FILTER_GENERATED: float(generated),
        FILTER_EVICTED: float(dropped),
        FILTER_SURPLUS: float(surplus),
        FILTER_ROUNDS: float(rounds),
    }
    if dropped_values:
        # verl's key (imported here: importing verl.trainer.ppo.v1 registers the trainers, which import this module)
        from verl.trainer.ppo.v1.replay_buffer import DAPO_FILTERED_REWARD_COUNTS_KEY

        metrics[DAPO_FILTERED_REWARD_COUNTS_KEY] = dict(dropped_values)
    return metrics


def token_version_metrics(stats, scheduled: int) -> dict[str, float]:
    """The per-token provenance of a trained batch (a :class:`~verl_offpolicy.core.token_versions.TokenVersionStats`,
    None when it has no response token) scheduled at version ``scheduled``; the tokens per version are named by their
    offset from ``scheduled`` (at most the schedule's staleness bound), so a run logs a fixed set of names."""
    if stats is None:
        return {}
    metrics = {
        f"{TOKEN_VERSION}/min": float(stats.version_min),
        f"{TOKEN_VERSION}/max": float(stats.version_max),
        f"{TOKEN_VERSION}/mean": stats.version_mean,
        f"{TOKEN_STALENESS}/mean": stats.staleness_mean,
        f"{TOKEN_STALENESS}/max": float(stats.staleness_max),
        SPANNING_FRACTION: stats.spanning_fraction,
    }
    for version, tokens in stats.tokens_per_version.items():
        metrics[f"{TOKENS_AT_OFFSET}{version - scheduled}"] = float(tokens)
    return metrics


def fresh_token_metrics(trainer: Tensor, rollout: Tensor, fresh: Tensor) -> dict[str, float]:
    """On the tokens ``fresh`` (bool [B, T]: sampled by the trainer's own weights): their number and
    max |log π_trainer − log π_rollout| over them (absent when there is none)."""
    tokens = int(fresh.sum())
    if tokens == 0:
        return {FRESH_TOKENS: 0.0}
    gap = (trainer.float() - rollout.float()).abs()[fresh]
    return {FRESH_TOKENS: float(tokens), FRESH_LOGPROB_GAP_MAX: float(gap.max())}


def rollout_call_metrics(generated_batches: int) -> dict[str, float]:
    """Whether this step made a rollout call (a wake-up and weight sync) and how many batches it generated."""
    return {ROLLOUT_CALLS: float(generated_batches > 0), GENERATED_BATCHES: float(generated_batches)}


def anchor_corr_metrics(proximal: Tensor, anchor: Tensor, response_mask: Tensor) -> dict[str, float]:
    """verl's ``rollout_corr/*`` statistics with π_old := the proximal policy and π_rollout := the ratio anchor,
    under :data:`ANCHOR_CORR_PREFIX` (padded [B, T] tensors; empty when no token is a response token).

    Per response token t of sequence i, log ρ_t = log π_proximal − log π_anchor (verl's ρ = π_old/π_rollout with
    the anchor in the sampling policy's place), ρ_t = exp(clamp(log ρ_t, ±20)); ⟨·⟩ is the mean over response
    tokens, mean_i over sequences:

    - ``kl`` = ⟨−log ρ_t⟩ (verl's KL(π_anchor‖π_proximal) estimator; = −``offpolicy/anchor_log_ratio/mean``),
      ``k3_kl`` = ⟨ρ_t − log ρ_t − 1⟩;
    - ``chi2_token`` = ⟨ρ_t²⟩ − 1, ``chi2_seq`` = mean_i exp(2·clamp(Σ_t log ρ_t, ±20)) − 1;
    - ``rollout_is_eff_sample_size`` = ⟨ρ_t⟩² / ⟨ρ_t²⟩ (the ESS as a fraction of the tokens, in (0, 1]);
      ``rollout_is_mean/std/max/min`` of ρ_t; ``rollout_is_seq_*`` of the per-sequence means ρ̄_i = mean_t ρ_t
      (``seq_max_deviation`` = max_i |ρ̄_i − 1|, ``seq_std`` unbiased);
    - ``training_*`` are the proximal policy's perplexities, ``rollout_*`` the anchor's, ``log_ppl_diff`` =
      mean_i(⟨log π_anchor⟩_i − ⟨log π_proximal⟩_i) (with ``_abs``, ``_max``, ``_min``), ``ppl_ratio`` = mean_i
      exp of it.

    The arithmetic is verl's own (``compute_offpolicy_metrics``; ``compute_rollout_correction_weights`` with
    token weights and no truncation, keeping the keys of :data:`ANCHOR_CORR_WEIGHTS`); its masked sums select
    the response tokens, so anything on padding (−inf, NaN) is ignored. Except that every exponent is capped at
    ±SAFETY_BOUND (20, verl's cap of ρ), as in :func:`capped_exponentials`: verl's ``k3_kl``, perplexities and
    ``ppl_ratio`` exponentiate raw log-quantities and are inf for a finite anchor far from the proximal policy.
    """
    return _rollout_corr_statistics(proximal, anchor, response_mask, ANCHOR_CORR_PREFIX)


def engine_mismatch_pair(staleness: int, behaviour_stored: bool, rollout_log_probs: bool, bypass: bool) -> str | None:
    """Which of the trainer's log-probs were computed at the weights that generated the batch, for
    :func:`engine_mismatch_metrics`: ``"proximal"`` on a fresh batch (staleness 0: the proximal weights generated
    it), ``"behaviour"`` on a stale batch whose behaviour log-probs were stored (the ``behaviour`` anchor), else
    None: no rollout log-probs (``actor_rollout_ref.rollout.calculate_log_probs=false``), verl's bypass mode (its
    old_log_probs are the rollout's own; the trainer computes none), or a stale batch under the ``proximal`` or
    ``rollout`` anchor (no trainer log-probs at the generating weights: that would be an extra forward pass)."""
    if not rollout_log_probs or bypass:
        return None
    if staleness == 0:
        return PROXIMAL
    return BEHAVIOUR if behaviour_stored else None


def engine_mismatch_metrics(trainer: Tensor, rollout: Tensor, response_mask: Tensor) -> dict[str, float]:
    """The engines' mismatch: verl's ``rollout_corr/*`` statistics with π_old := the training engine's log-probs at
    the weights that generated the batch (:func:`engine_mismatch_pair`) and π_rollout := the inference engine's,
    under :data:`ENGINE_MISMATCH_PREFIX`; per token ρ_t = π_trainer/π_rollout, every formula as in
    :func:`anchor_corr_metrics` with π_trainer in π_proximal's place and π_rollout in π_anchor's. The pair verl's
    own ``rollout_corr/*`` compares under the ``behaviour`` anchor, here without a rollout correction too."""
    return _rollout_corr_statistics(trainer, rollout, response_mask, ENGINE_MISMATCH_PREFIX)


def _rollout_corr_statistics(old: Tensor, rollout: Tensor, response_mask: Tensor, prefix: str) -> dict[str, float]:
    """verl's statistics with ``old`` in its π_old place and ``rollout`` in its π_rollout place, under ``prefix``."""
    proximal, anchor = old, rollout
    mask = response_mask.bool()
    if not bool(mask.any()):
        return {}
    stats = compute_offpolicy_metrics(old_log_prob=proximal, rollout_log_prob=anchor, response_mask=mask)
    _, weights = compute_rollout_correction_weights(
        log_ratio=proximal - anchor, response_mask=mask, rollout_is="token", rollout_is_threshold=UNTRUNCATED
    )
    stats.update((key, weights[key]) for key in ANCHOR_CORR_WEIGHTS)
    stats.update(capped_exponentials(proximal, anchor, mask))
    return {prefix + key: float(stats[key]) for key in ANCHOR_CORR_STATS}


def capped_exponentials(proximal: Tensor, anchor: Tensor, mask: Tensor) -> dict[str, float]:
    """verl's exponentiated ``rollout_corr`` statistics with each exponent clamped to [−B, B], B = SAFETY_BOUND:

        c_t = clamp(log π_proximal − log π_anchor, ±B),  k3_kl = ⟨e^{c_t} − c_t − 1⟩,
        training_ppl = mean_i e^{min(−⟨log π_proximal⟩_i, B)},  rollout_ppl = the same of π_anchor,
        ppl_ratio = mean_i e^{clamp(⟨log π_anchor⟩_i − ⟨log π_proximal⟩_i, ±B)}

    (⟨·⟩_i the mean over sequence i's response tokens, ⟨·⟩ over all; sequences without one are left out).
    Equal to verl's values while every exponent is within ±B; finite for any finite log-probs."""
    weight = mask.to(torch.float64)
    proximal = proximal.to(torch.float64).masked_fill(~mask, 0.0)
    anchor = anchor.to(torch.float64).masked_fill(~mask, 0.0)
    clamped = (proximal - anchor).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    k3 = ((clamped.exp() - clamped - 1) * weight).sum() / weight.sum()
    tokens = weight.sum(-1)
    rows = tokens > 0
    mean_proximal = proximal.sum(-1)[rows] / tokens[rows]
    mean_anchor = anchor.sum(-1)[rows] / tokens[rows]
    return {
        "k3_kl": float(k3),
        "training_ppl": float((-mean_proximal).clamp(max=SAFETY_BOUND).exp().mean()),
        "rollout_ppl": float((-mean_anchor).clamp(max=SAFETY_BOUND).exp().mean()),
        "ppl_ratio": float((mean_anchor - mean_proximal).clamp(-SAFETY_BOUND, SAFETY_BOUND).exp().mean()),
    }
