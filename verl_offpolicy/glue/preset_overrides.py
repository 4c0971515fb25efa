"""What the command line changes of the preset it selects: a replaced key that defines the preset's
algorithm stops the run; every other replaced preset key is named, with what it changes.

A user's own verl script sets verl's usual keys (verl's examples all set ``algorithm.adv_estimator=grpo``
and a ``ppo_mini_batch_size``), and Hydra applies a command-line key after the preset's defaults: adding
``+algorithm=red_weight`` to such a script would train GRPO. :func:`replaced_keys` compares the
composed config with the selected preset (``hydra.runtime.choices.algorithm``) and the command line
(``hydra.overrides.task``), both in the config the startup callback and ``verl-offpolicy check`` see.

A preset's keys are what its file and the shared parts it includes set (:func:`preset_values`; the
generated knob defaults of ``offpolicy_shared/knobs.yaml`` are defaults, not a preset's choice). The keys that
define its algorithm come from the families themselves (:func:`defining_keys`): the estimator, the loss mode,
and every family knob that selects a variant (``Knob.selects_variant``: by default a closed list of values or a
switch), not a magnitude.

Hydra gives the startup callback a copy of the config and deletes ``hydra`` from the one the task gets, so
verl's TaskRunner never sees the preset's choice or the command line. Each preset therefore writes its own name,
``algorithm.offpolicy.preset`` (:mod:`verl_offpolicy.glue.preset_name`), and :func:`check_preset_name` compares
the keys that define
its algorithm with the preset's own values wherever the config came from: a config composed without our callback
(verl's yaml plus a copy of a preset, a script of its own) stops in the TaskRunner too.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cache
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from verl_offpolicy.configs import PRESET_GROUP, preset_names, preset_selector, preset_text
from verl_offpolicy.glue.knobs import ALGO_PREFIX, LOSS_PREFIX, OffPolicyConfigError
from verl_offpolicy.glue.preset_name import PRESET_KEY

ESTIMATOR_KEY = "algorithm.adv_estimator"
LOSS_MODE_KEY = f"{LOSS_PREFIX}.loss_mode"
SHARED_PREFIX = "/offpolicy_shared/"
# Included by every preset, but holding no preset's choice: generated knob defaults, the startup callback.
NOT_PRESET_CHOICES = ("knobs", "validation")
ACTOR = "actor_rollout_ref.actor"


# ------------------------------------------------------------------------------------- the preset's keys


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{dotted key: leaf value}`` of a plain nested dict (interpolations kept as written)."""
    if not isinstance(node, dict):
        return {prefix: node}
    flat: dict[str, Any] = {}
    for key, value in node.items():
        flat.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _shared_text(name: str) -> str:
    from importlib import resources

    from verl_offpolicy.configs import PRESET_PACKAGE

    return (resources.files(PRESET_PACKAGE) / "offpolicy_shared" / f"{name}.yaml").read_text()


def _file_values(text: str) -> dict[str, Any]:
    """The leaf values a preset-style file sets, after those of the shared parts and presets it includes (its
    defaults list in order, ``_self_`` last as ours all are)."""
    node = OmegaConf.to_container(OmegaConf.create(text), resolve=False)
    values: dict[str, Any] = {}
    for entry in node.pop("defaults", []):
        if not isinstance(entry, str) or entry == "_self_":
            continue
        if entry.startswith(SHARED_PREFIX):
            name = entry[len(SHARED_PREFIX) :]
            if name not in NOT_PRESET_CHOICES:
                values.update(_file_values(_shared_text(name)))
        elif entry in preset_names():  # another preset of the group (grpo_proximal includes grpo)
            values.update(_file_values(preset_text(entry)))
        else:
            raise ValueError(f"a preset includes {entry!r}, which is neither a preset nor {SHARED_PREFIX}<part>")
    node.pop("hydra", None)
    values.update({k: v for k, v in _flat(node).items() if not k.endswith("._target_")})
    return values


@cache
def preset_values(preset: str) -> dict[str, Any]:
    """Every key preset ``preset`` sets (its file and the shared parts it includes), as written there."""
    return _file_values(preset_text(preset))


@cache
def defining_keys() -> frozenset[str]:
    """The keys that define an algorithm: the estimator, the loss mode, and every knob of a family that selects a
    variant (its allowed values are a closed list, or it is a switch), read from the family modules."""
    from verl_offpolicy.glue import algorithms

    keys = {ESTIMATOR_KEY, LOSS_MODE_KEY}
    for family in algorithms.families():
        for prefix in (ALGO_PREFIX, LOSS_PREFIX):
            keys.update(f"{prefix}.{knob.name}" for knob in family.knobs(prefix) if knob.selects_variant)
    return frozenset(keys)


# ---------------------------------------------------------------------------------- the command line


@dataclass(frozen=True)
class Replaced:
    """A key the preset sets that the command line gives another value: ``preset`` (the preset's value, resolved
    in this run's config), ``value`` (the run's), ``override`` (as written on the command line)."""

    key: str
    preset: Any
    value: Any
    override: str


def command_line_keys(overrides: list[str]) -> dict[str, str]:
    """``{key: the override as written}`` for every key the command line sets (not config-group choices)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    keys = {}
    for text, parsed in zip(overrides, OverridesParser.create().parse_overrides(list(overrides))):
        if not parsed.is_delete():
            keys[parsed.key_or_group] = text
    return keys


def selected_preset(config: DictConfig) -> str | None:
    """The preset ``algorithm=`` / ``+algorithm=`` selects (Hydra's record of the group's choice), if one of ours."""
    choice = OmegaConf.select(config, f"hydra.runtime.choices.{PRESET_GROUP}", default=None)
    return choice if choice in preset_names() else None


def _resolved_preset_values(config: DictConfig, keys: dict[str, Any]) -> dict[str, Any]:
    """The preset's ``keys`` resolved in this run's config (an interpolation such as ``${data.train_batch_size}``
    reads the run's values), on a copy."""
    interpolated = {k: v for k, v in keys.items() if isinstance(v, str) and "${" in v}
    resolved = {k: v for k, v in keys.items() if k not in interpolated}
    if interpolated:
        trial = copy.deepcopy(config)
        with read_write(trial), open_dict(trial):
            for key, raw in interpolated.items():
                OmegaConf.update(trial, key, raw, force_add=True)
        for key in interpolated:
            resolved[key] = OmegaConf.select(trial, key, throw_on_resolution_failure=False)
    return resolved


def replaced_keys(config: DictConfig) -> list[Replaced]:
    """The selected preset's keys that the command line gives another value (none without a preset)."""
    preset = selected_preset(config)
    if preset is None:
        return []
    written = command_line_keys(list(OmegaConf.select(config, "hydra.overrides.task", default=None) or []))
    keys = {k: v for k, v in preset_values(preset).items() if k in written}
    replaced = []
    for key, preset_value in _resolved_preset_values(config, keys).items():
        value = OmegaConf.select(config, key, default=None)
        if value != preset_value:
            replaced.append(Replaced(key, preset_value, value, written[key]))
    return replaced


# --------------------------------------------------------------------------------------------- the stop


class PresetOverrideError(ValueError):
    """The command line replaces what defines the selected preset's algorithm."""


def presets_matching(values: dict[str, Any]) -> list[str]:
    """The presets whose every defining key agrees with ``values`` (the run's), e.g. the one a script's own
    ``algorithm.adv_estimator=grpo`` amounts to."""
    matching = []
    for name in preset_names():
        own = {k: v for k, v in preset_values(name).items() if k in defining_keys()}
        if own and all(values.get(k) == v for k, v in own.items()):
            matching.append(name)
    return matching


def _stop(
    preset: str, replaced: list[Replaced], config: DictConfig, config_name: str, where: str
) -> PresetOverrideError:
    """The stop for ``replaced`` defining keys of ``preset``: the keys, both values, and the fix (delete them from
    ``where``, or the preset of the run's setting)."""
    run = {k: OmegaConf.select(config, k, default=None) for k in defining_keys()}
    alternatives = [name for name in presets_matching(run) if name != preset]
    pairs = "; ".join(f"{r.key}={r.value} (the preset sets {r.preset})" for r in replaced)
    deletes = " ".join(f"`{r.override}`" for r in replaced)
    choose = (
        "or choose the preset of that setting "
        f"({', '.join(f'`{preset_selector(n, config_name)}`' for n in alternatives)})"
        if alternatives
        else "or drop the preset to train verl's own setting, or write a preset of your own for this "
        "combination (docs/extending.md)"
    )
    return PresetOverrideError(
        f"the {where} replaces what defines preset {preset}: {pairs}; the run would not train {preset}. "
        f"Delete {deletes} from your {where} (verl's example scripts set such keys), {choose}"
    )


def check_defining_keys(config: DictConfig, replaced: list[Replaced]) -> None:
    """Raise :class:`PresetOverrideError` when the command line replaces a key that defines the selected preset's
    algorithm: the keys, the script's and the preset's values, and the fix."""
    replaced = [r for r in replaced if r.key in defining_keys()]
    if not replaced:
        return
    config_name = OmegaConf.select(config, "hydra.job.config_name", default="ppo_trainer") or "ppo_trainer"
    raise _stop(selected_preset(config), replaced, config, config_name, "command line")


def check_preset_name(view) -> None:
    """The keys that define the algorithm of the preset ``algorithm.offpolicy.preset`` names hold that preset's
    values (a startup rule: in the TaskRunner it is the only comparison, the command line is gone there). A name
    that is not one of ours (a user's own preset) is not compared."""
    preset = view.offpolicy.preset
    if preset is None or preset not in preset_names():
        return
    own = {k: v for k, v in preset_values(preset).items() if k in defining_keys()}
    replaced = []
    for key, preset_value in _resolved_preset_values(view.cfg, own).items():
        value = view.select(key)
        if value != preset_value:
            replaced.append(Replaced(key, preset_value, value, f"{key}={value}"))
    if replaced:
        stop = _stop(preset, replaced, view.cfg, "ppo_trainer", "config")
        raise OffPolicyConfigError(
            f"{stop} (or, if this config is meant to differ from {preset}, set {PRESET_KEY}=null or your own "
            "preset's name)"
        )


RULES = (check_preset_name,)  # first of the startup rules (glue/validation.py): a replaced estimator explains the rest


def caused_by_command_line(error: Exception, config: DictConfig, replaced: list[Replaced]) -> str:
    """A startup error's message followed by the preset keys the command line replaced whose preset value the
    error asks for (``set algorithm.use_kl_in_reward=true`` where the script set false: the user's own key, not
    the preset, is then the cause), else unchanged."""
    message = str(error)
    if isinstance(error, PresetOverrideError):
        return message
    named = [r for r in replaced if f"{r.key}={r.preset}".lower() in message.lower()]
    if not named:
        return message
    causes = "; ".join(f"`{r.override}` (the preset {selected_preset(config)} sets {r.key}={r.preset})" for r in named)
    return f"{message}. Your command line set {causes}: delete it to keep the preset's value"


# --------------------------------------------------------------------------------------------- the notes


def _updates(config: DictConfig, mini_batch_size: Any, epochs: Any) -> int | None:
    batch = OmegaConf.select(config, "data.train_batch_size", default=None)
    if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (batch, mini_batch_size, epochs)):
        return None
    return (batch // mini_batch_size) * epochs


def _updates_effect(
    config: DictConfig, replaced: Replaced, mini_batch_size: tuple[Any, Any], epochs: tuple[Any, Any]
) -> str:
    before, after = _updates(config, mini_batch_size[0], epochs[0]), _updates(config, mini_batch_size[1], epochs[1])
    if before is None or after is None:
        return ""
    plural = "" if after == 1 else "s"
    text = f"{after} optimizer update{plural} per batch instead of {before}"
    off = OmegaConf.select(config, ALGO_PREFIX, default=None) or {}
    on_policy = off.get("sync_interval", 1) == 1 and off.get("sync_offset", 0) == 0
    if after == 1 and OmegaConf.select(config, LOSS_MODE_KEY) == "m2po" and on_policy:
        text += " (M2PO with one update per batch at sync_interval=1, sync_offset=0 is plain PPO: every ratio is 1)"
    return text


def effect(config: DictConfig, replaced: Replaced, knob_help: dict[str, str]) -> str:
    """What replacing a preset key changes, in words (empty when the key's name says it all)."""
    key, after = replaced.key, replaced.value
    if key == f"{ACTOR}.ppo_mini_batch_size":
        epochs = OmegaConf.select(config, f"{ACTOR}.ppo_epochs", default=1)
        return _updates_effect(config, replaced, (replaced.preset, after), (epochs, epochs))
    if key == f"{ACTOR}.ppo_epochs":
        mini = OmegaConf.select(config, f"{ACTOR}.ppo_mini_batch_size", default=None)
        return _updates_effect(config, replaced, (mini, mini), (replaced.preset, after))
    if key == f"{ACTOR}.use_kl_loss":
        if after:
            coef = OmegaConf.select(config, f"{ACTOR}.kl_loss_coef", default=None)
            kind = OmegaConf.select(config, f"{ACTOR}.kl_loss_type", default=None)
            return f"adds verl's KL-to-reference loss to the preset's loss (kl_loss_coef={coef}, kl_loss_type={kind})"
        return "removes the preset's KL-to-reference loss"
    if key == "algorithm.use_kl_in_reward":
        return "adds verl's KL penalty to the reward" if after else "removes the KL penalty from the reward"
    if key == "algorithm.norm_adv_by_std_in_grpo":
        return (
            "advantages divided by the group's reward std"
            if after
            else "advantages not divided by the group's reward std"
        )
    return knob_help.get(key, "")


def _knob_help() -> dict[str, str]:
    from verl_offpolicy.glue import algorithms, preset_name
    from verl_offpolicy.glue.scheduler import knobs as scheduler

    families = (scheduler.FAMILY, preset_name.FAMILY, *algorithms.families())
    return {
        f"{prefix}.{k.name}": k.help for f in families for prefix in (ALGO_PREFIX, LOSS_PREFIX) for k in f.knobs(prefix)
    }


def override_notes(config: DictConfig, replaced: list[Replaced]) -> list[str]:
    """One line per preset key the command line replaces without redefining the algorithm: the key, the preset's
    value -> the run's, and what that changes."""
    notes = []
    helps = _knob_help()
    for one in replaced:
        if one.key in defining_keys():
            continue
        what = effect(config, one, helps)
        notes.append(
            f"{one.key} {one.preset} -> {one.value} (your command line replaces preset "
            f"{selected_preset(config)}'s value){f': {what}' if what else ''}"
        )
    return notes
