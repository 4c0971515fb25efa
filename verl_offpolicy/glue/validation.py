"""Startup validation of a whole verl config that uses verl-offpolicy: the parts' rule groups, in order.

:func:`validate_offpolicy_config` checks that the names the config selects are registered, builds the
typed sections (:class:`~verl_offpolicy.glue.config.ConfigView`: ``algorithm.offpolicy``, the policy
loss) and runs each part's rule group, first error wins. Each rule lives with what it guards:

0. the preset the config names (``algorithm.offpolicy.preset``): the keys that define its algorithm hold its values,
   ``RULES`` of :mod:`verl_offpolicy.glue.preset_overrides`;
1. the algorithms part, :func:`verl_offpolicy.glue.algorithms.rules` (each family's rules beside its adapters);
2. verl's rollout correction with our anchors and losses, ``ROLLOUT_CORRECTION_RULES`` of
   :mod:`verl_offpolicy.glue.scheduler.checks`;
3. the presets' mini-batch resolver, ``RULES`` of :mod:`verl_offpolicy.glue.resolvers`;
4. the trainer mode (the scheduler, its overlapped mode, verl's async modes), ``RULES`` of
   :mod:`verl_offpolicy.glue.scheduler.checks`;
5. the math-verify reward's keyword arguments, ``RULES`` of :mod:`verl_offpolicy.rewards.math_verify_reward`;
6. verl's multi-turn rollout (agent loop, tool-call format, tool config), ``RULES`` of
:mod:`verl_offpolicy.glue.multi_turn`;
7. verl's LoRA values (rank, alpha, ``lora.merge``), ``RULES`` of :mod:`verl_offpolicy.glue.lora`;
8. ``data.truncation``, ``RULES`` of :mod:`verl_offpolicy.glue.prompt_length`;
9. the training and validation files on this machine, ``RULES`` of :mod:`verl_offpolicy.glue.data_files`.

It runs once in the driver, as a Hydra callback (:class:`verl_offpolicy.startup.StartupValidation`,
installed by every preset and our primary configs) before ``verl.trainer.main_ppo`` starts Ray or any
worker, and once in verl's ``TaskRunner``, in the scheduler trainer's constructor (a config composed
without our callback reaches only that one).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl_offpolicy.glue.knobs import OffPolicyConfigError, select
from verl_offpolicy.glue.registration import ADV_ESTIMATORS, POLICY_LOSSES, TRAINERS, require_registration

__all__ = ["OffPolicyConfigError", "rule_groups", "validate_offpolicy_config", "validate_parts"]


def check_registered(cfg: DictConfig) -> None:
    """The estimator, policy loss and trainer the config selects, if ours, are registered in this process
    (else the cause). First, because a failed registration explains every later error."""
    from verl_offpolicy.verl_pin import check_verl_version

    check_verl_version()  # VERL_OFFPOLICY_STRICT_VERL=1: an untested verl stops the run here
    selected = (
        ("adv_estimator", select(cfg, "algorithm.adv_estimator"), ADV_ESTIMATORS),
        ("policy_loss", select(cfg, "actor_rollout_ref.actor.policy_loss.loss_mode"), POLICY_LOSSES),
        ("trainer", select(cfg, "trainer.v1.trainer_mode"), TRAINERS),
    )
    for kind, name, ours in selected:
        if name in ours:
            require_registration(kind, name)


def rule_groups() -> tuple[tuple, ...]:
    """The parts' rule groups in the order they run.

    Imported here, after :func:`check_registered`: the algorithms part's rules sit in the modules of
    its adapters (the typed sections too are assembled from them), and a module that fails to import must
    surface as the registration error that names its cause, not as a failure to import this module.
    """
    from verl_offpolicy.glue import algorithms, data_files, lora, multi_turn, preset_overrides, prompt_length, resolvers
    from verl_offpolicy.glue.scheduler import checks as scheduler
    from verl_offpolicy.rewards import math_verify_reward

    return (
        preset_overrides.RULES,
        algorithms.rules(),
        scheduler.ROLLOUT_CORRECTION_RULES,
        resolvers.RULES,
        scheduler.RULES,
        math_verify_reward.RULES,
        multi_turn.RULES,
        lora.RULES,
        prompt_length.RULES,
        data_files.RULES,
    )


def validate_offpolicy_config(cfg: DictConfig) -> None:
    """Raise :class:`OffPolicyConfigError` (or the section's ``ValueError``) on the first problem found."""
    check_registered(cfg)
    from verl_offpolicy.glue.config import ConfigView  # after check_registered, as rule_groups

    view = ConfigView.of(cfg)
    for group in rule_groups():
        for rule in group:
            rule(view)


def _plain(value: Any) -> Any:
    """A config part (verl dataclass, DictConfig, dict) as plain containers of its plain values."""
    if isinstance(value, DictConfig):
        return OmegaConf.to_container(value, resolve=True)
    if dataclasses.is_dataclass(value):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        plain = {k: _plain(v) for k, v in value.items()}
        return {k: v for k, v in plain.items() if v is not _SKIP}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value if value is None or isinstance(value, bool | int | float | str) else _SKIP


_SKIP = object()


def validate_parts(*, algorithm: Any = None, actor: Any = None, loss_agg_mode: str | None = None) -> None:
    """The algorithms part's startup rules on config parts built in code, as :func:`validate_offpolicy_config`
    runs them on a composed config: ``algorithm`` (verl's algorithm section) and ``actor``
    (``actor_rollout_ref.actor``, its ``policy_loss`` ours or verl's). For callers of the registered functions
    that compose no config (:mod:`verl_offpolicy.tabular`, tests): the functions themselves check nothing
    the startup rules check. ``loss_agg_mode``: the aggregation the caller passes the loss, if not the actor's."""
    from verl_offpolicy.glue import algorithms
    from verl_offpolicy.glue.config import ConfigView, offpolicy_section
    from verl_offpolicy.glue.knobs import OffPolicySection

    loss = getattr(actor, "policy_loss", None) if actor is not None else None
    actor_values = _plain(actor) or {}
    if loss_agg_mode is not None:
        actor_values["loss_agg_mode"] = loss_agg_mode
    rollout = {"n": actor_values["rollout_n"]} if "rollout_n" in actor_values else {}  # verl copies rollout.n there
    raw = OmegaConf.create(
        {"algorithm": _plain(algorithm) or {}, "actor_rollout_ref": {"actor": actor_values, "rollout": rollout}}
    )
    view = ConfigView(raw, offpolicy_section(algorithm), loss if isinstance(loss, OffPolicySection) else None)
    for rule in algorithms.rules():
        rule(view)
