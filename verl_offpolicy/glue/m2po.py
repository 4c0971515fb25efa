"""M2PO's whole-mini-batch mask inside verl's per-micro-batch ``ppo_loss``: a no-gradient pre-pass.

M2PO (Zheng, Zhao, Chen, "Prosperity before Collapse", arXiv 2510.01161) chooses its token mask from
the second moment of log ρ_t over the whole optimizer mini-batch S (all micro-batches, all
data-parallel ranks). verl 0.9.1's FSDP engine runs the loss per micro-batch
(``FSDPEngine.forward_backward_batch``: one forward, loss and backward per micro-batch), so no
micro-batch sees S. The mask needs log π_θ of every token of S at the weights of this optimizer step,
which only a forward pass gives; so, for ``loss_mode=m2po`` only, :func:`install_mini_batch_pre_pass`
wraps ``forward_backward_batch``: before the micro-batch loop it runs the same micro-batches forward
without gradient, gathers the values (log π_θ − log π_old)² of the response tokens from every
data-parallel rank, computes the cut θ* (:func:`verl_offpolicy.core.losses.m2po_threshold`) and
records it for the loss of this mini-batch (:func:`mini_batch_threshold`). Every other loss, and
forward-only calls, go straight to verl's method. Cost: one extra forward pass per mini-batch (about a
third of a forward + backward).

The authors' public code (github.com/Infini-AI-Lab/M2PO, ``verl/trainer/ppo/core_algos.py``,
``compute_m2po_policy_loss``) calls its trust-region solver inside the micro-batch loop of verl's old
``dp_actor`` (so per micro-batch), over the "harmful" tokens only (A > 0 and ρ > 1, or A < 0 and
ρ < 1) and maps the cut to PPO clip bounds; we follow the paper's algorithm as the spec states it
(all tokens of the mini-batch, masked, importance-weighted without clipping), with the default budget
0.04 of the authors' scripts (``M2_budget=0.04``).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import torch

from verl_offpolicy.core import losses as core

LOSS_MODE = "m2po"
# id(actor config) -> θ* of the mini-batch being trained (set by the pre-pass, read by the loss).
_THRESHOLDS: dict[int, float] = {}


def mini_batch_threshold(config: Any) -> float | None:
    """θ* recorded by the pre-pass for the mini-batch being trained with ``config``, or None."""
    return _THRESHOLDS.get(id(config))


@contextlib.contextmanager
def mini_batch_scope(config: Any, threshold: float) -> Iterator[None]:
    """Within the block, the m2po loss called with ``config`` uses the mini-batch's cut θ*."""
    _THRESHOLDS[id(config)] = threshold
    try:
        yield
    finally:
        _THRESHOLDS.pop(id(config), None)


def _m2po_actor_config(loss_function: Callable | None) -> Any:
    """The ActorConfig bound in verl's ``partial(ppo_loss, config=...)`` if it selects m2po, else None."""
    config = getattr(loss_function, "keywords", {}).get("config") if loss_function is not None else None
    policy_loss = getattr(config, "policy_loss", None)
    return config if policy_loss is not None and policy_loss.get("loss_mode", None) == LOSS_MODE else None


def _gather_values(local: torch.Tensor, dp_group) -> torch.Tensor:
    """Concatenate the 1-D tensors of every rank of the data-parallel group (ragged sizes)."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size(dp_group) == 1:
        return local
    parts: list[Any] = [None] * torch.distributed.get_world_size(dp_group)
    torch.distributed.all_gather_object(parts, local.cpu(), group=dp_group)
    return torch.cat(parts)


def mini_batch_log_ratio_sq(engine: Any, data: Any) -> torch.Tensor:
    """(log π_θ − log π_old)² of every response token of ``data`` on this rank (no gradient, 1-D, float64)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import prepare_micro_batches
    from verl.workers.utils.padding import no_padding_2_padding

    tu.assign_non_tensor(data, sp_size=engine.ulysses_sequence_parallel_size)
    micro_batches, _ = prepare_micro_batches(data=data, dp_group=engine.get_data_parallel_group(), same_micro_num_in_dp=True)
    values = []
    with torch.no_grad():
        for micro_batch in micro_batches:
            _, output = engine.forward_step(micro_batch, loss_function=None, forward_only=True)
            log_prob = no_padding_2_padding(output["model_output"]["log_probs"], micro_batch)
            padded = micro_batch.select("response_mask", "old_log_probs").to_padded_tensor()
            mask = padded["response_mask"].bool()
            log_ratio = core.token_log_ratio(log_prob.double().cpu(), padded["old_log_probs"].double().cpu(), mask.cpu())
            values.append(log_ratio[mask.cpu()].square())
    return torch.cat(values) if values else torch.zeros(0, dtype=torch.float64)


def install_mini_batch_pre_pass() -> bool:
    """Wrap verl's ``FSDPEngine.forward_backward_batch`` with the m2po pre-pass (once). Returns True."""
    from verl.workers.engine.fsdp import transformer_impl

    engine_cls = transformer_impl.FSDPEngine
    original = engine_cls.forward_backward_batch
    if getattr(original, "_verl_offpolicy_m2po", False):
        return True

    @functools.wraps(original)
    def forward_backward_batch(self, data, loss_function, forward_only=False):
        config = None if forward_only else _m2po_actor_config(loss_function)
        if config is None:
            return original(self, data, loss_function, forward_only)
        local = mini_batch_log_ratio_sq(self, data)
        values = _gather_values(local, self.get_data_parallel_group())
        with mini_batch_scope(config, core.m2po_threshold(values, config.policy_loss.m2po_threshold)):
            return original(self, data, loss_function, forward_only)

    forward_backward_batch._verl_offpolicy_m2po = True
    engine_cls.forward_backward_batch = forward_backward_batch
    return True
