"""What a family declares of its hyperparameters, and the key-naming checks every rule uses.

A family (``FAMILY`` of ``glue/algorithms/<family>.py``, of the scheduler's ``glue/scheduler/knobs.py``:
:class:`~verl_offpolicy.glue.family.Family`) declares its knobs once, as ``offpolicy_knobs`` (keys under
``algorithm.offpolicy``) and ``loss_knobs`` (keys under ``actor_rollout_ref.actor.policy_loss``): a :class:`Knob`
each, with its default, its one-line help and its allowed values. :mod:`verl_offpolicy.glue.config` assembles
the typed sections from them, and
``configs/offpolicy_shared/knobs.yaml`` is generated from them (``python -m verl_offpolicy.configs
--write-knobs``; a test fails on drift).

This module imports nothing of the package: the family modules, the config and the startup rules import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

ALGO_PREFIX = "algorithm.offpolicy"
LOSS_PREFIX = "actor_rollout_ref.actor.policy_loss"
SECTIONS = {"offpolicy": ALGO_PREFIX, "loss": LOSS_PREFIX}


class OffPolicyConfigError(ValueError):
    """An inconsistent verl-offpolicy configuration; the message says what to change."""


def check_choice(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is not valid; allowed values: {', '.join(allowed)}")


def check_number(key: str, value: Any, *, positive: bool = False, non_negative: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{key} must be > 0, got {value!r}")
    if non_negative and value < 0:
        raise ValueError(f"{key} must be >= 0, got {value!r}")


def finite(key: str, value: Any) -> None:
    check_number(key, value)


def positive(key: str, value: Any) -> None:
    check_number(key, value, positive=True)


def non_negative(key: str, value: Any) -> None:
    check_number(key, value, non_negative=True)


def optional_finite(key: str, value: Any) -> None:
    if value is not None:
        check_number(key, value)


def integer(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer, got {value!r}")


def boolean(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")


def select(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg``'s value at the dotted ``key`` (``default`` if absent)."""
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key, default=default)


@dataclass(frozen=True)
class Knob:
    """One hyperparameter: ``name`` under its section, its ``default``, a one-line ``help`` (the typed section's
    docstring and the generated YAML's comment), its ``choices`` (if a closed list) and its ``check``
    (``check(key, value)`` raising ``ValueError`` naming the key). ``yaml`` replaces the default in the
    generated YAML (e.g. the loss's τ interpolated from ``algorithm.offpolicy.tau``). ``variant``: whether the
    value picks a variant of the family's algorithm, a key a preset's user may not replace
    (:mod:`verl_offpolicy.glue.preset_overrides`); None: a closed list or a switch does, a magnitude does not."""

    name: str
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    check: Callable[[str, Any], None] | None = None
    yaml: str | None = None
    variant: bool | None = None

    @property
    def selects_variant(self) -> bool:
        if self.variant is not None:
            return self.variant
        return bool(self.choices) or self.check is boolean

    def validate(self, prefix: str, value: Any) -> None:
        key = f"{prefix}.{self.name}"
        if self.choices:
            check_choice(key, value, self.choices)
        if self.check is not None:
            self.check(key, value)


class OffPolicySection:
    """Base of the typed sections :mod:`verl_offpolicy.glue.config` assembles: a loss adapter tells its
    section (:class:`~verl_offpolicy.glue.config.OffPolicyLossConfig`) from verl's own by it."""


def read(section: Any, knobs: tuple[Knob, ...]) -> dict[str, Any]:
    """The values of ``knobs`` in ``section`` (a typed section, a DictConfig or a dict; None: all defaults),
    each knob's default where absent. Startup validated them; this only reads."""
    if section is None:
        return {k.name: k.default for k in knobs}
    if isinstance(section, OffPolicySection):
        return {k.name: getattr(section, k.name) for k in knobs}
    return {k.name: section.get(k.name, k.default) for k in knobs}
