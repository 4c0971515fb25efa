"""verl's rollout correction (``algorithm.rollout_correction``) under each ratio anchor: which two policies it compares.

verl 0.9.1's v1 trainer computes the IS weights (``rollout_is``: TIS, IcePop/MIS) and rejection masks
(``rollout_rs``: token, sequence, geometric ``seq_mean_k1``, ...) in ``_compute_advantage`` with its own
``compute_rollout_correction_and_add_to_batch``, from ``old_log_probs`` (the proximal policy) against the
rollout's log-probs. What a correction should compare depends on what the loss's ratio already covers:

- ``proximal``: verl's decoupled three-policy form, π_proximal/π_rollout (the loss's ratio is π_θ/π_proximal);
- ``behaviour`` on a stale batch: π_behaviour/π_rollout, the training engine at the generating weights against
  the inference engine, i.e. the engines' mismatch only; the loss's ratio π_θ/π_behaviour already covers the
  staleness. :func:`compared_with_anchor` makes verl's own function compute on that pair (no copy of it). On a
  fresh batch π_behaviour is π_proximal;
- ``rollout``: the loss's ratio is π_θ/π_rollout, so an IS weight against π_rollout would count it twice
  (``check_rollout_correction`` refuses ``rollout_is``); ``rollout_rs`` masks on π_proximal/π_rollout, verl's
  decoupled rule.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from torch import Tensor


def decoupled_correction(rollout_correction) -> bool:
    """verl's v1 trainer computes a correction from ``algorithm.rollout_correction`` (a mapping or None): decoupled
    mode (``bypass_mode`` false) with ``rollout_is`` or ``rollout_rs`` set."""
    if not rollout_correction or rollout_correction.get("bypass_mode", False):
        return False
    return rollout_correction.get("rollout_is") is not None or rollout_correction.get("rollout_rs") is not None


def compared_policies(ratio_anchor: str, stale: bool) -> str:
    """The pair verl's ``rollout_is``/``rollout_rs`` compare under ``ratio_anchor`` (``stale``: the batch is trained
    at staleness > 0)."""
    if ratio_anchor == "behaviour" and stale:
        return "π_behaviour/π_rollout"
    return "π_proximal/π_rollout"


def describe(ratio_anchor: str, schedule_is_stale: bool) -> str:
    """One line for ``verl-offpolicy check``: the pair on stale steps and on fresh ones."""
    stale, fresh = compared_policies(ratio_anchor, True), compared_policies(ratio_anchor, False)
    if schedule_is_stale and stale != fresh:
        return f"{stale} on stale steps, {fresh} on fresh ones"
    return fresh


@contextlib.contextmanager
def compared_with_anchor(anchor_log_probs: Tensor) -> Iterator[None]:
    """Within the block, verl's ``compute_rollout_correction_and_add_to_batch`` (as the v1 trainer's
    ``_compute_advantage`` calls it) compares ``anchor_log_probs`` [B, T] with the rollout's log-probs instead
    of ``old_log_probs``; ``old_log_probs`` is put back afterwards, so the advantage and the loss see the
    batch as before."""
    from verl.trainer.ppo.v1 import trainer_base

    verl_correction = trainer_base.compute_rollout_correction_and_add_to_batch

    def against_anchor(batch, rollout_corr_config):
        proximal = batch.batch["old_log_probs"]
        batch.batch["old_log_probs"] = anchor_log_probs.to(proximal.dtype)
        try:
            corrected, metrics = verl_correction(batch, rollout_corr_config)
        finally:
            batch.batch["old_log_probs"] = proximal
        corrected.batch["old_log_probs"] = proximal
        return corrected, metrics

    trainer_base.compute_rollout_correction_and_add_to_batch = against_anchor
    try:
        yield
    finally:
        trainer_base.compute_rollout_correction_and_add_to_batch = verl_correction
