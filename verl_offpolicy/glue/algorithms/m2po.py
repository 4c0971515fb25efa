"""M2PO's whole-mini-batch mask inside verl's per-micro-batch ``ppo_loss``: a no-gradient pre-pass.

M2PO (Zheng, Zhao, Chen, "Prosperity before Collapse", arXiv 2510.01161, Algorithm 1) chooses its token
mask from the second moment of log ρ_t over the whole optimizer mini-batch S (all micro-batches, all
data-parallel ranks): starting from the token pool (``policy_loss.m2po_token_pool``: ``trust_region``,
the harmful tokens (A > 0 ∧ ρ > 1) ∨ (A < 0 ∧ ρ < 1), the default; or ``all``), it removes the token with
the largest (log ρ_t)², one at a time, until the pool's mean is ≤ τ_M2 (:func:`verl_offpolicy.core.losses.m2po_keep`).
Tokens outside the pool are never masked. verl 0.9.1's FSDP engine runs the loss per micro-batch
(``FSDPEngine.forward_backward_batch``: one forward, loss and backward per micro-batch), so no
micro-batch sees S. The mask needs log π_θ of every token of S at the weights of this optimizer step,
which only a forward pass gives; so, for ``loss_mode=m2po`` only, :func:`install_mini_batch_pre_pass`
wraps ``forward_backward_batch``: before the micro-batch loop it runs the same micro-batches forward
without gradient, gathers the pool's values (log π_θ − log π_old)² from every data-parallel rank, runs
Algorithm 1 over them in the mini-batch's order (rank, micro-batch, response, token) and records each
micro-batch's mask for the loss calls of this mini-batch, in order (:func:`mini_batch_scope`). The loss
uses the recorded mask as is (no second comparison, so last-bit differences between the two forward
passes cannot change it). Every other loss, and forward-only calls, go straight to verl's method. Cost:
one extra forward pass per mini-batch (about a third of a forward + backward).

The authors' public code (github.com/Infini-AI-Lab/M2PO, ``verl/trainer/ppo/core_algos.py``,
``compute_m2po_policy_loss``) calls its trust-region solver inside the micro-batch loop of verl's old
``dp_actor``, so per micro-batch, and maps the cut to PPO clip bounds. We keep the paper's extent, the
whole mini-batch, and its masked, importance-weighted loss without clipping; the pool and the
one-at-a-time removal are Algorithm 1's. The default budget is 0.04, the authors' scripts' ``M2_budget``.

This module is M2PO's whole part (docs/algo/m2po.md): the loss adapter, the pre-pass, the rule that
the engine runs it (:func:`check_m2po_strategy`) and the warning that with one update per batch at (1, 0) it
is plain PPO (:func:`warn_m2po_single_update`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, Callable, Iterator

import torch
from torch import Tensor
from verl.trainer.ppo.core_algos import register_policy_loss

from verl_offpolicy.core import losses as core
from verl_offpolicy.glue.algorithms.adapters import aggregate, as_metrics, check_dtype, our_loss_config
from verl_offpolicy.glue.algorithms.kl_reward import one_update_per_batch_fixes
from verl_offpolicy.glue.family import Family, LossExample
from verl_offpolicy.glue.knobs import LOSS_PREFIX, Knob, OffPolicyConfigError, positive
from verl_offpolicy.glue.patching import patch_once
from verl_offpolicy.glue.scheduler.knobs import BEHAVIOUR, PROXIMAL

logger = logging.getLogger("verl_offpolicy")

LOSS_MODE = "m2po"
LOSS_KNOBS = (
    Knob(
        "m2po_threshold",
        0.04,
        "m2po budget τ_M2 > 0 of the mini-batch's second moment mean (log ρ_t)² (the M2PO authors' 0.04).",
        check=positive,
    ),
    Knob(
        "m2po_token_pool",
        "trust_region",
        "m2po: the tokens it may mask: trust_region (the harmful ones, (A > 0 and ρ > 1) or (A < 0 and ρ < 1), "
        "M2PO's Algorithm 1 and the authors' code) | all. Tokens outside the pool are never masked.",
        choices=core.M2PO_TOKEN_POOLS,
    ),
)
# Engines whose forward_backward_batch carries the whole-mini-batch pre-pass (install_mini_batch_pre_pass).
M2PO_STRATEGIES = ("fsdp", "fsdp2")
# id(actor config) -> the masks M_t of the mini-batch's micro-batches not yet trained, in order (set by the
# pre-pass, consumed by the loss calls).
_MASKS: dict[int, list[Tensor]] = {}


def next_micro_batch_mask(config: Any) -> Tensor | None:
    """The pre-pass's mask for the next micro-batch trained with ``config``, or None outside a pre-pass scope."""
    queue = _MASKS.get(id(config))
    if queue is None:
        return None
    if not queue:
        raise RuntimeError(
            f"{LOSS_PREFIX}.loss_mode=m2po: the loss was called for more micro-batches than the whole-mini-batch "
            "pre-pass prepared masks for (verl's engine split the mini-batch differently from the pre-pass)"
        )
    return queue.pop(0)


@contextlib.contextmanager
def mini_batch_scope(config: Any, masks: list[Tensor]) -> Iterator[None]:
    """Within the block, the m2po loss calls with ``config`` take ``masks`` (one per micro-batch) in order."""
    _MASKS[id(config)] = list(masks)
    try:
        yield
    finally:
        _MASKS.pop(id(config), None)


def _m2po_actor_config(loss_function: Callable | None) -> Any:
    """The ActorConfig bound in verl's ``partial(ppo_loss, config=...)`` if it selects m2po, else None."""
    config = getattr(loss_function, "keywords", {}).get("config") if loss_function is not None else None
    policy_loss = getattr(config, "policy_loss", None)
    return config if policy_loss is not None and policy_loss.get("loss_mode", None) == LOSS_MODE else None


def gather_values(local: torch.Tensor, dp_group) -> tuple[torch.Tensor, int]:
    """(the 1-D tensors of every rank of the data-parallel group, concatenated in rank order; this rank's offset)."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size(dp_group) == 1:
        return local, 0
    parts: list[Any] = [None] * torch.distributed.get_world_size(dp_group)
    torch.distributed.all_gather_object(parts, local.cpu(), group=dp_group)
    rank = torch.distributed.get_rank(dp_group)
    return torch.cat(parts), sum(part.numel() for part in parts[:rank])


def micro_batch_masks(
    parts: list[tuple[Tensor, Tensor, Tensor]], budget: float, pool: str, gather: Callable | None = None
) -> list[Tensor]:
    """M_t of each micro-batch ``(log ρ, A, m)`` [B, T] of this rank, chosen over the whole mini-batch.

    The pool's values (log ρ_t)² are taken in micro-batch, row-major order, ``gather``-ed over the
    data-parallel ranks (``gather(local) -> (all values, this rank's offset)``; None: one rank) and
    :func:`~verl_offpolicy.core.losses.m2po_keep` runs over all of them; each micro-batch gets its slice back.
    With contiguous micro-batches the order is the mini-batch's row-major order for any micro-batch size.
    """
    pools = [core.m2po_pool(log_ratio, advantages, mask, pool) for log_ratio, advantages, mask in parts]
    local = [log_ratio[in_pool].square() for (log_ratio, _, _), in_pool in zip(parts, pools, strict=True)]
    local = torch.cat(local) if local else torch.zeros(0, dtype=torch.float64)
    values, offset = (local, 0) if gather is None else gather(local)
    keep = core.m2po_keep(values, budget)[offset : offset + local.numel()]
    sizes = [int(in_pool.sum()) for in_pool in pools]
    return [
        core.scatter_pool_keep(in_pool, part) for in_pool, part in zip(pools, torch.split(keep, sizes), strict=True)
    ]


def mini_batch_parts(engine: Any, data: Any) -> list[tuple[Tensor, Tensor, Tensor]]:
    """(log π_θ − log π_old, A, m) [B, T] of each micro-batch of ``data`` on this rank (no gradient, CPU, float64).

    The micro-batches are those verl's ``forward_backward_batch`` trains next (the same ``prepare_micro_batches``
    call on the same data), in the same order.
    """
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import prepare_micro_batches
    from verl.workers.utils.padding import no_padding_2_padding

    tu.assign_non_tensor(data, sp_size=engine.ulysses_sequence_parallel_size)
    micro_batches, _ = prepare_micro_batches(
        data=data, dp_group=engine.get_data_parallel_group(), same_micro_num_in_dp=True
    )
    parts = []
    with torch.no_grad():
        for micro_batch in micro_batches:
            _, output = engine.forward_step(micro_batch, loss_function=None, forward_only=True)
            log_prob = no_padding_2_padding(output["model_output"]["log_probs"], micro_batch)
            padded = micro_batch.select("response_mask", "old_log_probs", "advantages").to_padded_tensor()
            mask = padded["response_mask"].bool().cpu()
            log_ratio = core.token_log_ratio(log_prob.double().cpu(), padded["old_log_probs"].double().cpu(), mask)
            parts.append((log_ratio, padded["advantages"].double().cpu(), mask))
    return parts


def install_mini_batch_pre_pass() -> bool:
    """Wrap verl's ``FSDPEngine.forward_backward_batch`` with the m2po pre-pass (once). Returns True."""
    from verl.workers.engine.fsdp import transformer_impl

    patch_once(transformer_impl.FSDPEngine, "forward_backward_batch", _with_pre_pass)
    return True


def _with_pre_pass(original: Callable) -> Callable:
    """verl's ``forward_backward_batch`` preceded, for an m2po update, by the masks of the whole mini-batch."""

    @functools.wraps(original)
    def forward_backward_batch(self, data, loss_function, forward_only=False):
        config = None if forward_only else _m2po_actor_config(loss_function)
        if config is None:
            return original(self, data, loss_function, forward_only)
        loss_config = config.policy_loss
        gather = functools.partial(gather_values, dp_group=self.get_data_parallel_group())
        masks = micro_batch_masks(
            mini_batch_parts(self, data), loss_config.m2po_threshold, loss_config.m2po_token_pool, gather
        )
        with mini_batch_scope(config, masks):
            return original(self, data, loss_function, forward_only)

    return forward_backward_batch


def check_m2po_strategy(view) -> None:
    """m2po's mask needs the pre-pass, which only verl's FSDP engines run (:data:`M2PO_STRATEGIES`)."""
    if view.loss is None or view.loss.loss_mode != LOSS_MODE:
        return
    actor = "actor_rollout_ref.actor"
    strategy = view.select(f"{actor}.strategy", "fsdp")
    if strategy not in M2PO_STRATEGIES:
        raise OffPolicyConfigError(
            f"{LOSS_PREFIX}.loss_mode=m2po chooses its mask over the whole mini-batch with a pre-pass of verl's "
            f"FSDP engine, which {actor}.strategy={strategy} does not run: set {actor}.strategy to one of "
            f"{', '.join(M2PO_STRATEGIES)} or choose another loss"
        )


def warn_m2po_single_update(view) -> None:
    """With one optimizer update per batch on ratios the trainer recomputes at the update's own weights (the
    ``proximal`` anchor, or ``behaviour`` at (s, d) = (1, 0)), every ratio is 1: the pool is empty, nothing is
    masked and the loss is PPO's first update, −A·log π (a startup warning naming ``ppo_mini_batch_size``)."""
    if view.loss is None or view.loss.loss_mode != LOSS_MODE or view.select("data.train_batch_size") is None:
        return  # (config parts built in code have no batch to count updates in)
    if one_update_per_batch_fixes(view):
        return
    offpolicy = view.offpolicy
    if offpolicy.ratio_anchor == PROXIMAL:
        where = "algorithm.offpolicy.ratio_anchor=proximal"
    elif offpolicy.ratio_anchor == BEHAVIOUR and not offpolicy.schedule.is_stale:
        where = "(s, d) = (1, 0) under algorithm.offpolicy.ratio_anchor=behaviour"
    else:
        return
    actor = "actor_rollout_ref.actor"
    logger.warning(
        "verl-offpolicy: %s.loss_mode=m2po with one optimizer update per batch (%s.ppo_mini_batch_size=%s = "
        "data.train_batch_size, ppo_epochs=1) at %s: every ratio is 1 at the update, so M2PO masks nothing and is "
        "plain PPO (−A·log π); set %s.ppo_mini_batch_size below data.train_batch_size (the m2po preset's: >= 4 "
        "updates per batch) or a stale schedule for its trust region to act",
        LOSS_PREFIX,
        actor,
        view.select(f"{actor}.ppo_mini_batch_size"),
        where,
        actor,
    )


def _whole_mini_batch(log_prob: Tensor, config: Any) -> bool:
    """True if this call holds every sequence of the optimizer mini-batch (or is not inside verl's engine)."""
    info = getattr(config, "global_batch_info", None) or {}
    global_size = info.get("global_batch_size")
    if global_size is None:
        return True
    return info.get("dp_size", 1) == 1 and log_prob.shape[0] == global_size


@register_policy_loss("m2po")
def compute_policy_loss_m2po(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """ℓ_t = −M_t·ρ_t·A·log π_t, M_t of Algorithm 1 over the whole mini-batch's token pool (no clipping).

    M comes from the engine's pre-pass over the mini-batch (:func:`install_mini_batch_pre_pass`); a call that
    holds the whole mini-batch (one micro-batch on one rank, or a direct call) computes it from its own
    tokens (:func:`~verl_offpolicy.core.losses.m2po_mask`). A micro-batch without the pre-pass is an error,
    never a silently per-micro-batch mask.
    """
    loss_config = our_loss_config("m2po", config)
    check_dtype("m2po", log_prob)
    mask = response_mask.bool()
    keep = next_micro_batch_mask(config)
    if keep is None:
        if not _whole_mini_batch(log_prob, config):
            raise RuntimeError(
                f"{LOSS_PREFIX}.loss_mode=m2po: this call holds {log_prob.shape[0]} of the mini-batch's "
                f"{config.global_batch_info.get('global_batch_size')} sequences, but the whole-mini-batch pre-pass "
                "(verl_offpolicy.glue.algorithms.m2po, installed on verl's FSDP engine) did not run: m2po needs "
                "actor_rollout_ref.actor.strategy=fsdp or fsdp2"
            )
        log_ratio = core.token_log_ratio(log_prob, old_log_prob, mask)
        keep = core.m2po_mask(log_ratio, advantages, mask, loss_config.m2po_threshold, loss_config.m2po_token_pool)
    elif keep.shape != mask.shape:
        raise RuntimeError(
            f"{LOSS_PREFIX}.loss_mode=m2po: the pre-pass's mask for this micro-batch has shape {tuple(keep.shape)}, "
            f"the micro-batch {tuple(mask.shape)} (verl's engine split the mini-batch differently from the pre-pass)"
        )
    loss_mat, keep, log_ratio, ratio = core.m2po_loss(log_prob, old_log_prob, advantages, mask, keep.to(mask.device))
    loss = aggregate(loss_mat, mask, loss_agg_mode, config, rollout_is_weights)
    return loss, as_metrics(
        core.ratio_metrics(log_ratio, ratio, mask, keep, ratio), FAMILY.loss_fraction_metric(LOSS_MODE)
    )


FAMILY = Family(
    "m2po",
    loss_knobs=LOSS_KNOBS,
    loss_rules=(check_m2po_strategy, warn_m2po_single_update),
    loss_fractions={LOSS_MODE: "masked"},
    losses={LOSS_MODE: (LossExample({"m2po_threshold": 0.04, "m2po_token_pool": "trust_region"}),)},
)
