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

The values themselves are checked at startup with verl's own parsers (:func:`check_rollout_correction_values`),
and a correction whose every IS weight is zeroed stops the run with one line naming the band
(:func:`named_zero_ess`) instead of verl's ``ZeroDivisionError`` in its effective-sample-size metric.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any, Callable, Iterator

from torch import Tensor

from verl_offpolicy.glue.knobs import OffPolicyConfigError
from verl_offpolicy.glue.scheduler.knobs import BEHAVIOUR

logger = logging.getLogger("verl_offpolicy")

ROLLOUT_CORRECTION = "algorithm.rollout_correction"
IS_THRESHOLD_FORMS = (
    "a number > 0 (TIS: weights clamped at it) or a 'lower_upper' string with 0 < lower <= upper "
    "(IcePop: weights outside [lower, upper] zeroed)"
)


def _verl_says(exc: Exception) -> str:
    return f"verl says: {exc}"


def _probe_tensors():
    """A one-token batch for verl's own functions: log-ratio 0, one valid token."""
    import torch

    return torch.zeros(1, 1), torch.ones(1, 1)


def icepop_band(threshold: Any) -> tuple[float, float] | None:
    """(lower, upper) of an IcePop ``rollout_is_threshold`` as verl parses it, or None for a TIS bound."""
    from verl.trainer.ppo.rollout_corr_helper import _parse_rollout_is_threshold

    upper, lower = _parse_rollout_is_threshold(threshold)
    return None if lower is None else (lower, upper)


_warned: set[str] = set()


def warn_once(message: str, *args: Any) -> None:
    """A startup warning, once per process (the startup rules run in the driver's callback and again in verl's
    TaskRunner)."""
    text = message % args
    if text not in _warned:
        _warned.add(text)
        logger.warning(text)


def check_rollout_correction_values(view) -> None:
    """Every ``algorithm.rollout_correction.*`` value is one verl 0.9.1 accepts, checked by verl's own code.

    ``rollout_is`` by verl's ``compute_rollout_correction_weights`` on a one-token batch (its allowed levels
    are in its message), ``rollout_is_threshold`` by verl's parser (a bound > 0, or ``lower_upper`` with
    0 < lower <= upper; NaN is refused too), ``rollout_rs`` against verl's ``SUPPORTED_ROLLOUT_RS_OPTIONS``
    and ``rollout_rs_threshold`` by verl's ``compute_rollout_rejection_mask``; the switches are booleans and
    ``loss_type`` is one of verl's bypass losses. verl reads these only in the trainer's first step. An IcePop
    band that excludes ratio 1 gets a warning: on a batch whose every weight falls outside it, verl's
    effective sample size divides by zero (:func:`named_zero_ess` names the band then)."""
    section = view.select(ROLLOUT_CORRECTION)
    if section is None:
        return
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.rollout_corr_helper import (
        SUPPORTED_ROLLOUT_RS_OPTIONS,
        compute_rollout_correction_weights,
        compute_rollout_rejection_mask,
    )

    log_ratio, mask = _probe_tensors()
    rollout_is = view.select(f"{ROLLOUT_CORRECTION}.rollout_is")
    threshold = view.select(f"{ROLLOUT_CORRECTION}.rollout_is_threshold", RolloutCorrectionConfig.rollout_is_threshold)
    if rollout_is is not None:
        try:
            compute_rollout_correction_weights(
                log_ratio,
                mask,
                rollout_is=rollout_is,
                rollout_is_threshold=RolloutCorrectionConfig.rollout_is_threshold,
            )
        except (ValueError, TypeError) as exc:
            raise OffPolicyConfigError(
                f"{ROLLOUT_CORRECTION}.rollout_is={rollout_is!r} is not an IS level verl accepts ({_verl_says(exc)}); "
                f"set one of those, or {ROLLOUT_CORRECTION}.rollout_is=null (no IS weight)"
            ) from None
    key = f"{ROLLOUT_CORRECTION}.rollout_is_threshold"
    try:
        band = icepop_band(threshold)
    except (ValueError, TypeError) as exc:
        raise OffPolicyConfigError(
            f"{key}={threshold!r} is not valid ({_verl_says(exc)}); allowed: {IS_THRESHOLD_FORMS}"
        ) from None
    if any(math.isnan(v) for v in (band or (float(threshold),))):
        raise OffPolicyConfigError(f"{key}={threshold!r} is not a number; allowed: {IS_THRESHOLD_FORMS}")
    if rollout_is is not None and band is not None and not band[0] <= 1.0 <= band[1]:
        warn_once(
            "verl-offpolicy: %s=%s is an IcePop band that excludes ratio 1: every IS weight of a batch whose "
            "ratios all "
            "fall outside [%g, %g] is zeroed (it trains nothing), and the run stops there; a band around 1 "
            "(e.g. 0.5_5.0) keeps the on-policy tokens",
            key,
            threshold,
            band[0],
            band[1],
        )
    rollout_rs = view.select(f"{ROLLOUT_CORRECTION}.rollout_rs")
    if rollout_rs is not None:
        options = [o.strip() for o in rollout_rs.split(",") if o.strip()] if isinstance(rollout_rs, str) else []
        unknown = [o for o in options if o not in SUPPORTED_ROLLOUT_RS_OPTIONS]
        if not options or unknown:
            raise OffPolicyConfigError(
                f"{ROLLOUT_CORRECTION}.rollout_rs={rollout_rs!r} is not a rejection mode verl accepts; allowed values "
                f"(comma-separated for several): {', '.join(sorted(SUPPORTED_ROLLOUT_RS_OPTIONS))}, or null"
            )
        rs_threshold = view.select(f"{ROLLOUT_CORRECTION}.rollout_rs_threshold")
        try:
            compute_rollout_rejection_mask(log_ratio, mask, rollout_rs=rollout_rs, rollout_rs_threshold=rs_threshold)
        except (ValueError, TypeError) as exc:
            raise OffPolicyConfigError(
                f"{ROLLOUT_CORRECTION}.rollout_rs_threshold={rs_threshold!r} does not fit rollout_rs={rollout_rs} "
                f"({_verl_says(exc)}); allowed: one threshold per option (or one for all): 'lower_upper' ratio bounds "
                "with 0 < lower <= upper (or an upper bound) for the *_k1 options, an upper bound > 0 for the others"
            ) from None
    for switch in ("bypass_mode", "rollout_is_batch_normalize"):
        value = view.select(f"{ROLLOUT_CORRECTION}.{switch}", False)
        if not isinstance(value, bool):
            raise OffPolicyConfigError(f"{ROLLOUT_CORRECTION}.{switch} must be true or false, got {value!r}")
    loss_type = view.select(f"{ROLLOUT_CORRECTION}.loss_type", RolloutCorrectionConfig.loss_type)
    allowed = bypass_loss_types()
    if loss_type not in allowed:
        raise OffPolicyConfigError(
            f"{ROLLOUT_CORRECTION}.loss_type={loss_type!r} is not one of verl's bypass-mode losses; allowed values: "
            f"{', '.join(allowed)}"
        )


def bypass_loss_types() -> tuple[str, ...]:
    """The ``loss_type`` values verl's bypass-mode loss (``compute_policy_loss_bypass_mode``) dispatches on, read
    from its source (verl keeps no list of them)."""
    import inspect
    import re

    from verl.trainer.ppo.core_algos import compute_policy_loss_bypass_mode

    return tuple(
        dict.fromkeys(re.findall(r"loss_type == \"(\w+)\"", inspect.getsource(compute_policy_loss_bypass_mode)))
    )


class ZeroEffectiveSampleSize(RuntimeError):
    """Every IS weight of a batch was zeroed by the IcePop band (verl's ESS would divide by zero)."""


def named_zero_ess(verl_correction: Callable) -> Callable:
    """verl's ``compute_rollout_correction_and_add_to_batch`` with its ``ZeroDivisionError`` (the effective sample
    size of a batch whose every IS weight the IcePop band zeroed) raised as one line naming the band."""

    def correction(batch, rollout_corr_config):
        try:
            return verl_correction(batch, rollout_corr_config)
        except ZeroDivisionError:
            threshold = rollout_corr_config.get("rollout_is_threshold")
            raise ZeroEffectiveSampleSize(
                f"{ROLLOUT_CORRECTION}.rollout_is_threshold={threshold} zeroed every IS weight of this batch (no ratio "
                f"π/π_rollout fell inside the band; rollout_is={rollout_corr_config.get('rollout_is')}), so "
                "nothing would train: widen the band around 1 (e.g. 0.5_5.0) or use a TIS bound (one number)"
            ) from None

    return correction


def decoupled_correction(rollout_correction) -> bool:
    """verl's v1 trainer computes a correction from ``algorithm.rollout_correction`` (a mapping or None): decoupled
    mode (``bypass_mode`` false) with ``rollout_is`` or ``rollout_rs`` set."""
    if not rollout_correction or rollout_correction.get("bypass_mode", False):
        return False
    return rollout_correction.get("rollout_is") is not None or rollout_correction.get("rollout_rs") is not None


def compared_policies(ratio_anchor: str, stale: bool) -> str:
    """The pair verl's ``rollout_is``/``rollout_rs`` compare under ``ratio_anchor`` (``stale``: the batch is trained
    at staleness > 0)."""
    if ratio_anchor == BEHAVIOUR and stale:
        return "π_behaviour/π_rollout"
    return "π_proximal/π_rollout"


def describe(ratio_anchor: str, schedule_is_stale: bool) -> str:
    """One line for ``verl-offpolicy check``: the pair on stale steps and on fresh ones."""
    stale, fresh = compared_policies(ratio_anchor, True), compared_policies(ratio_anchor, False)
    if schedule_is_stale and stale != fresh:
        return f"{stale} on stale steps, {fresh} on fresh ones"
    return fresh


@contextlib.contextmanager
def verl_correction_named() -> Iterator[None]:
    """Within the block, verl's ``compute_rollout_correction_and_add_to_batch`` (as the v1 trainer's
    ``_compute_advantage`` calls it) raises :class:`ZeroEffectiveSampleSize` naming the band instead of a
    ``ZeroDivisionError`` (:func:`named_zero_ess`)."""
    from verl.trainer.ppo.v1 import trainer_base

    verl_correction = trainer_base.compute_rollout_correction_and_add_to_batch
    trainer_base.compute_rollout_correction_and_add_to_batch = named_zero_ess(verl_correction)
    try:
        yield
    finally:
        trainer_base.compute_rollout_correction_and_add_to_batch = verl_correction


@contextlib.contextmanager
def compared_with_anchor(anchor_log_probs: Tensor) -> Iterator[None]:
    """Within the block, verl's ``compute_rollout_correction_and_add_to_batch`` (as the v1 trainer's
    ``_compute_advantage`` calls it) compares ``anchor_log_probs`` [B, T] with the rollout's log-probs instead
    of ``old_log_probs``; ``old_log_probs`` is put back afterwards, so the advantage and the loss see the
    batch as before. A batch whose every IS weight is zeroed raises :class:`ZeroEffectiveSampleSize`."""
    from verl.trainer.ppo.v1 import trainer_base

    verl_correction = named_zero_ess(trainer_base.compute_rollout_correction_and_add_to_batch)
    original = trainer_base.compute_rollout_correction_and_add_to_batch

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
        trainer_base.compute_rollout_correction_and_add_to_batch = original
