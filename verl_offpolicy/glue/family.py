"""What a family declares, as one typed value: its knobs, its startup rules in order, its metrics and examples.

Each family module of the algorithms part (``glue/algorithms/<family>.py``) ends with ``FAMILY = Family(...)``;
the scheduler (``glue/scheduler/knobs.py``) and the preset's name (``glue/preset_overrides.py``) declare their
knobs the same way. What reads a family reads these attributes: the typed config sections
(:mod:`verl_offpolicy.glue.config`), the startup rules (:func:`verl_offpolicy.glue.algorithms.rules`), the keys
that define a preset's algorithm (:mod:`verl_offpolicy.glue.preset_overrides`), the generated docs and the tests'
conformance suite (``tests/algorithms/test_conformance.py``, driven by each registered name's examples).

This module imports nothing of verl: the scheduler's and the startup's modules declare families too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from verl_offpolicy.glue.knobs import ALGO_PREFIX, LOSS_PREFIX, Knob

Rule = Callable[[Any], None]  # rule(view: ConfigView) -> None, raising OffPolicyConfigError naming the keys
LOSS_FRACTION_PREFIX = "actor/offpolicy/"


@dataclass(frozen=True)
class LossExample:
    """A valid setting of a registered loss: its ``policy_loss`` knobs and the actor keys it needs (clip ratios,
    ``loss_agg_mode``), as a user sets them. ``label`` tells two examples of one loss apart."""

    policy_loss: Mapping[str, Any] = field(default_factory=dict)
    actor: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""


@dataclass(frozen=True)
class EstimatorExample:
    """A valid setting of a registered estimator (its ``algorithm.offpolicy`` knobs), with two of its values derived
    by hand in the family: ``singleton``, the advantage of a response alone in its group (``"reward"``: A = r;
    ``"zero"``), and ``equal_group``, the advantage of every member of a group whose rewards all equal r (a
    number, or ``"reward"``: A = r)."""

    offpolicy: Mapping[str, Any] = field(default_factory=dict)
    singleton: str = "reward"
    equal_group: float | str = 0.0


@dataclass(frozen=True)
class Family:
    """One family: ``name``; its knobs under ``algorithm.offpolicy`` (``offpolicy_knobs``) and under the actor's
    ``policy_loss`` (``loss_knobs``); its startup rules by stage (``first_rules``: checks every loss of ours
    needs, e.g. the actor's clip ratios; ``loss_rules``, ``estimator_rules``: each tests its own name; stages run
    in this order over all families); ``loss_fractions``: loss_mode -> what the loss does to a token
    (``clipped``, ``masked``, ``truncated``), logged as ``actor/offpolicy/<loss_mode>/<action>_frac``; and for each
    name it registers with verl (``@register_adv_est`` / ``@register_policy_loss``) its valid examples
    (``estimators``, ``losses``)."""

    name: str
    offpolicy_knobs: tuple[Knob, ...] = ()
    loss_knobs: tuple[Knob, ...] = ()
    first_rules: tuple[Rule, ...] = ()
    loss_rules: tuple[Rule, ...] = ()
    estimator_rules: tuple[Rule, ...] = ()
    loss_fractions: Mapping[str, str] = field(default_factory=dict)
    estimators: Mapping[str, tuple[EstimatorExample, ...]] = field(default_factory=dict)
    losses: Mapping[str, tuple[LossExample, ...]] = field(default_factory=dict)

    def knobs(self, prefix: str) -> tuple[Knob, ...]:
        """The knobs under ``prefix`` (``algorithm.offpolicy`` or the actor's ``policy_loss``)."""
        return {ALGO_PREFIX: self.offpolicy_knobs, LOSS_PREFIX: self.loss_knobs}[prefix]

    def loss_fraction_metric(self, loss_mode: str) -> str:
        """``actor/offpolicy/<loss_mode>/<action>_frac``, e.g. ``actor/offpolicy/rec/clipped_frac``."""
        return f"{LOSS_FRACTION_PREFIX}{loss_mode}/{self.loss_fractions[loss_mode]}_frac"
