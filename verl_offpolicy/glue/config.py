"""Typed configs of verl-offpolicy, assembled from what each family declares and validated at startup.

- ``algorithm.offpolicy`` (:class:`OffPolicyConfig`): the estimators' hyperparameters and the scheduler's
  knobs, one place each. Presets interpolate ``algorithm.offpolicy.tau`` into the loss.
- ``algorithm`` (:class:`OffPolicyAlgoConfig`): verl's ``AlgoConfig`` plus that section.
- ``actor_rollout_ref.actor.policy_loss`` (:class:`OffPolicyLossConfig`): verl's ``PolicyLossConfig`` plus
  the parameters of our losses. verl converts it on the driver in ``validate_config`` (``ActorConfig``).

The fields are not written here: each family declares its own (``Family.offpolicy_knobs``, ``loss_knobs``:
:class:`~verl_offpolicy.glue.knobs.Knob`, default, help, allowed values, check) and this module assembles
them, in the order of :func:`knob_families`. Building a section checks each value on its own (type,
range, choice) and names the key; the rules that combine keys live with their owners and run once, at
startup (:mod:`verl_offpolicy.glue.validation`). :class:`ConfigView` is a whole composed config as those
rules read it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, make_dataclass
from typing import Any

from verl.trainer.config import AlgoConfig
from verl.workers.config import PolicyLossConfig

from verl_offpolicy.core.schedule import Schedule
from verl_offpolicy.glue import algorithms
from verl_offpolicy.glue.family import Family
from verl_offpolicy.glue.knobs import (
    ALGO_PREFIX,
    LOSS_PREFIX,
    SECTIONS,
    Knob,
    OffPolicyConfigError,
    OffPolicySection,
    select,
)

# Families that failed to import in this process (their knobs are missing): building a section then raises
# the registration error that names the cause (glue/registration.py records it), not an unexpected keyword.
_UNLOADED: list[str] = []


def knob_families() -> tuple[Family, ...]:
    """The families that declare knobs: the scheduler, the preset's name, then every family of the algorithms part
    (:data:`~verl_offpolicy.glue.algorithms.FAMILY_MODULES` order); one that fails to import is recorded."""
    from verl_offpolicy.glue import preset_name
    from verl_offpolicy.glue.scheduler import knobs as scheduler

    found = [scheduler.FAMILY, preset_name.FAMILY]
    for name in algorithms.family_modules():
        try:
            found.append(importlib.import_module(name).FAMILY)
        except Exception as exc:  # noqa: BLE001 - reported when a section is built (_refuse_if_unloaded)
            _UNLOADED.append(f"importing {name} raised {type(exc).__name__}: {exc}")
    return tuple(found)


def _refuse_if_unloaded(kind: str, name: Any) -> None:
    """Raise the registration error naming the cause if a family failed to import in this process."""
    if not _UNLOADED:
        return
    from verl_offpolicy.glue.registration import RegistrationError, require_registration

    require_registration(kind, name)  # raises with the recorded cause when ``name`` is one of ours
    raise RegistrationError(f"verl-offpolicy could not load its algorithm families: {'; '.join(_UNLOADED)}")


def declared_knobs(section: str, families: tuple[Family, ...]) -> tuple[Knob, ...]:
    """The knobs of ``section`` (``offpolicy`` or ``loss``) that ``families`` declare; a name declared twice is
    an error."""
    prefix = SECTIONS[section]
    found: dict[str, tuple[Knob, str]] = {}
    for family in families:
        for knob in family.knobs(prefix):
            if knob.name in found:
                raise TypeError(f"{prefix}.{knob.name} is declared by families {found[knob.name][1]} and {family.name}")
            found[knob.name] = (knob, family.name)
    return tuple(knob for knob, _ in found.values())


def _docstring(summary: str, prefix: str, knobs: tuple[Knob, ...]) -> str:
    lines = [summary, "", "Args:"] + [f"    {k.name}: {k.help} Default {k.default!r}." for k in knobs]
    return "\n".join(lines) + f"\n\n(Assembled from the families' knobs; keys under ``{prefix}``.)\n"


def _assemble(name: str, base: type, section: str, summary: str, namespace: dict) -> type:
    knobs = declared_knobs(section, _FAMILIES)
    prefix = SECTIONS[section]
    kind, selector, default = {
        "loss": ("policy_loss", "loss_mode", "vanilla"),
        "offpolicy": ("adv_estimator", None, None),
    }[section]

    def __new__(cls, *args, **kwargs):
        _refuse_if_unloaded(kind, kwargs.get(selector, default) if selector else default)
        return object.__new__(cls)

    def __post_init__(self) -> None:
        if hasattr(base, "__post_init__"):  # verl's own checks of its fields first
            base.__post_init__(self)
        for knob in knobs:
            knob.validate(prefix, getattr(self, knob.name))

    cls = make_dataclass(
        name,
        [(k.name, Any, field(default=k.default)) for k in knobs],
        bases=(OffPolicySection,) if base is object else (base, OffPolicySection),
        namespace={"__new__": __new__, "__post_init__": __post_init__, "KNOBS": knobs, "PREFIX": prefix, **namespace},
    )
    cls.__module__ = __name__  # pickled by reference (Ray ships the sections to the workers)
    cls.__doc__ = _docstring(summary, prefix, knobs)
    return cls


def _schedule(self) -> Schedule:
    """The (sync_interval, sync_offset) pair as the one :class:`Schedule` value the trainer holds."""
    return Schedule(self.sync_interval, self.sync_offset)


_FAMILIES = knob_families()  # imported once: both sections are assembled from them
OffPolicyConfig = _assemble(
    "OffPolicyConfig",
    object,
    "offpolicy",
    "``algorithm.offpolicy``: estimator hyperparameters and the staleness scheduler.",
    {"schedule": property(_schedule)},
)
OffPolicyLossConfig = _assemble(
    "OffPolicyLossConfig",
    PolicyLossConfig,
    "loss",
    "verl's ``PolicyLossConfig`` plus the parameters of our losses.",
    {},
)


# ---------------------------------------------------------------------- the generated YAML

KNOBS_YAML = "offpolicy_shared/knobs.yaml"  # under verl_offpolicy/configs, included by offpolicy_shared/common.yaml


def _yaml_value(knob: Knob) -> str:
    if knob.yaml is not None:
        return knob.yaml
    value = knob.default
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value) if isinstance(value, int | float) else str(value)


def _yaml_block(knobs: tuple[Knob, ...], indent: str) -> list[str]:
    import textwrap

    lines = []
    for knob in knobs:
        lines += [f"{indent}# {line}" for line in textwrap.wrap(knob.help, 110 - len(indent), break_on_hyphens=False)]
        lines += [f"{indent}{knob.name}: {_yaml_value(knob)}", ""]
    return lines[:-1]


def knobs_yaml() -> str:
    """The text of ``configs/offpolicy_shared/knobs.yaml``: every knob with its help and default (the presets'
    starting point; ``python -m verl_offpolicy.configs --write-knobs`` writes it, a test checks it)."""
    header = [
        "# @package _global_",
        "# Generated from the families' knobs (Family.offpolicy_knobs, loss_knobs) by",
        "# `python -m verl_offpolicy.configs --write-knobs`; do not edit. Included by offpolicy_shared/common.yaml.",
        "algorithm:",
        "  offpolicy:",
    ]
    loss = ["actor_rollout_ref:", "  actor:", "    policy_loss:"]
    body = (
        header
        + _yaml_block(OffPolicyConfig.KNOBS, "    ")
        + ["", *loss]
        + _yaml_block(OffPolicyLossConfig.KNOBS, "      ")
    )
    return "\n".join(body) + "\n"


def offpolicy_section(algorithm_config: Any) -> OffPolicyConfig:
    """Build and validate ``algorithm.offpolicy`` from verl's algorithm config (DictConfig or dataclass)."""
    section = algorithm_config.get("offpolicy", None) if algorithm_config is not None else None
    if section is None:
        return OffPolicyConfig()
    if isinstance(section, OffPolicyConfig):
        return section
    from omegaconf import DictConfig, OmegaConf

    values = OmegaConf.to_container(section, resolve=True) if isinstance(section, DictConfig) else dict(section)
    known = set(OffPolicyConfig.__dataclass_fields__)
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {ALGO_PREFIX}; allowed keys: {', '.join(sorted(known))}")
    return OffPolicyConfig(**values)


@dataclass
class OffPolicyAlgoConfig(AlgoConfig):
    """verl's ``AlgoConfig`` with the ``offpolicy`` section (select with ``algorithm._target_``)."""

    offpolicy: OffPolicyConfig = field(default_factory=OffPolicyConfig)

    def __post_init__(self):
        if not isinstance(self.offpolicy, OffPolicyConfig):  # hydra.instantiate passes the section as a dict
            object.__setattr__(self, "offpolicy", offpolicy_section({"offpolicy": self.offpolicy}))


# ---------------------------------------------------------------------- the view the startup rules read


def loss_section(cfg: Any) -> OffPolicyLossConfig | None:
    """The actor's policy-loss section as our typed config, or None if it is not ours."""
    from omegaconf import OmegaConf

    node = select(cfg, "actor_rollout_ref.actor.policy_loss")
    if node is None:
        return None
    values = OmegaConf.to_container(node, resolve=True)
    target = values.pop("_target_", "")
    if not target.endswith("OffPolicyLossConfig"):
        if values.get("loss_mode") in algorithms.declared_names(algorithms.LOSS_DECORATOR):
            raise OffPolicyConfigError(
                f"{LOSS_PREFIX}.loss_mode={values['loss_mode']} is a verl-offpolicy loss but {LOSS_PREFIX}._target_ "
                f"is {target!r}: set {LOSS_PREFIX}._target_=verl_offpolicy.glue.config.OffPolicyLossConfig "
                "or use a preset (+algorithm=<preset>)"
            )
        return None
    values.pop("rollout_correction", None)  # verl's own nested dataclass, validated by verl
    return OffPolicyLossConfig(**values)


@dataclass(frozen=True)
class ConfigView:
    """A whole composed config as the startup rules read it: the raw config and its typed sections.

    Every rule group (``RULES`` of :mod:`verl_offpolicy.glue.algorithms`, ...) is a tuple of functions
    ``rule(view) -> None`` that raise :class:`OffPolicyConfigError` (or the section's ``ValueError``).
    """

    cfg: Any
    offpolicy: OffPolicyConfig
    loss: OffPolicyLossConfig | None  # None: the policy loss is verl's own

    @classmethod
    def of(cls, cfg: Any) -> "ConfigView":
        """Build and validate the typed sections (``algorithm.offpolicy`` first, then the policy loss)."""
        return cls(cfg, offpolicy_section(select(cfg, "algorithm")), loss_section(cfg))

    def select(self, key: str, default: Any = None) -> Any:
        return select(self.cfg, key, default)

    @property
    def adv_estimator(self) -> str | None:
        return self.select("algorithm.adv_estimator")

    @property
    def trainer_mode(self) -> str | None:
        return self.select("trainer.v1.trainer_mode")

    @property
    def loss_mode(self) -> str | None:
        """The selected policy loss, ours or verl's."""
        return self.loss.loss_mode if self.loss is not None else self.select(f"{LOSS_PREFIX}.loss_mode")

    @property
    def bypass(self) -> bool:
        """verl's ``algorithm.rollout_correction.bypass_mode`` (the rollout log-probs in old_log_prob)."""
        return bool(self.select("algorithm.rollout_correction.bypass_mode", False))
