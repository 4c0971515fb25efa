"""Startup validation of a whole verl config that uses verl-offpolicy: the parts' rule groups, in order.

:func:`validate_offpolicy_config` checks that the names the config selects are registered, builds the
typed sections (:class:`~verl_offpolicy.glue.config.ConfigView`: ``algorithm.offpolicy``, the policy
loss) and runs each part's rule group, first error wins. Each rule lives with what it guards:

1. the algorithms part, :func:`verl_offpolicy.glue.algorithms.rules` (each family's rules beside its adapters);
2. verl's rollout correction with our anchors and losses, ``ROLLOUT_CORRECTION_RULES`` of
   :mod:`verl_offpolicy.glue.scheduler.checks`;
3. the presets' mini-batch resolver, ``RULES`` of :mod:`verl_offpolicy.glue.resolvers`;
4. the trainer mode (the scheduler, its overlapped mode, verl's async modes), ``RULES`` of
   :mod:`verl_offpolicy.glue.scheduler.checks`.

It runs once in the driver, as a Hydra callback (:class:`verl_offpolicy.glue.startup.StartupValidation`,
installed by every preset and our primary configs) before ``verl.trainer.main_ppo`` starts Ray or any
worker, and once in verl's ``TaskRunner``, in the scheduler trainer's constructor (a config composed
without our callback reaches only that one).
"""

from __future__ import annotations

from omegaconf import DictConfig

from verl_offpolicy.glue.config import ConfigView, OffPolicyConfigError, select
from verl_offpolicy.glue.registration import ADV_ESTIMATORS, TRAINERS, require_registration

__all__ = ["OffPolicyConfigError", "rule_groups", "validate_offpolicy_config"]


def check_registered(cfg: DictConfig) -> None:
    """The estimator and trainer the config selects, if ours, are registered in this process (else the cause).

    First, because a failed registration explains every later error. (The policy loss is checked where
    its typed section is built: :class:`~verl_offpolicy.glue.config.OffPolicyLossConfig`.)
    """
    adv_estimator = select(cfg, "algorithm.adv_estimator")
    trainer_mode = select(cfg, "trainer.v1.trainer_mode")
    if adv_estimator in ADV_ESTIMATORS:
        require_registration("adv_estimator", adv_estimator)
    if trainer_mode in TRAINERS:
        require_registration("trainer", trainer_mode)


def rule_groups() -> tuple[tuple, ...]:
    """The parts' rule groups in the order they run.

    Imported here, after :func:`check_registered`: the algorithms part's rules sit in the modules of
    its adapters, and a module that fails to import must surface as the registration error that names
    its cause, not as a failure to import this module.
    """
    from verl_offpolicy.glue import algorithms, resolvers
    from verl_offpolicy.glue.scheduler import checks as scheduler

    return (algorithms.rules(), scheduler.ROLLOUT_CORRECTION_RULES, resolvers.RULES, scheduler.RULES)


def validate_offpolicy_config(cfg: DictConfig) -> None:
    """Raise :class:`OffPolicyConfigError` (or the section's ``ValueError``) on the first problem found."""
    check_registered(cfg)
    view = ConfigView.of(cfg)
    for group in rule_groups():
        for rule in group:
            rule(view)
