"""The algorithms part: one module per family, each holding its verl adapters and the rules that guard them.

A family module (``opmd.py``, ``agro.py``, ``rec.py``, ...) registers its estimators and losses with verl's
own decorators (``@register_adv_est("name")``, ``@register_policy_loss("name")``) around a one-line call of
the formula in :mod:`verl_offpolicy.core`, defines its startup rules next to them (functions
``rule(view: ConfigView) -> None``) and ends with ``FAMILY = Family(...)``
(:class:`~verl_offpolicy.glue.family.Family`: its knobs, its rules by stage, its metrics, an example of each
name it registers). Shared pieces: :mod:`.adapters` (prepare/broadcast/aggregate) and :mod:`.kl_reward` (the
rules of estimators on verl's KL-in-reward).

:data:`FAMILY_MODULES` lists the families; :func:`families` imports them. verl needs our names before a family
module may be imported (the modules import verl's ``core_algos``, and ``glue/registration.py`` runs at ``import
verl`` in every process), so :func:`declared_names` reads them from the listed modules' decorators (their source,
without importing them); a test checks that they agree with the ``FAMILY`` objects. This ``__init__`` imports
only the standard library.
"""

from __future__ import annotations

import ast
import importlib
from functools import cache
from pathlib import Path

PACKAGE = __name__
ESTIMATOR_DECORATOR = "register_adv_est"
LOSS_DECORATOR = "register_policy_loss"
# Every family of the algorithms part, in the order their rules run (each module ends with FAMILY = Family(...)).
FAMILY_MODULES = ("agro", "asymre", "m2po", "oapl", "opmd", "rec", "red", "topr")


def family_modules() -> tuple[str, ...]:
    """The families' module names (imported when verl imports ``core_algos``)."""
    return tuple(f"{PACKAGE}.{name}" for name in FAMILY_MODULES)


def families() -> tuple:
    """Every family's :class:`~verl_offpolicy.glue.family.Family`, in :data:`FAMILY_MODULES` order (importing them)."""
    return tuple(importlib.import_module(module).FAMILY for module in family_modules())


def _registered(path: Path) -> list[tuple[str, str]]:
    """(decorator, name) of every ``@register_adv_est("name")`` / ``@register_policy_loss("name")`` in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            if (
                isinstance(decorator, ast.Call)
                and isinstance(decorator.func, ast.Name)
                and decorator.func.id in (ESTIMATOR_DECORATOR, LOSS_DECORATOR)
                and decorator.args
                and isinstance(decorator.args[0], ast.Constant)
            ):
                found.append((decorator.func.id, decorator.args[0].value))
    return found


@cache
def _declarations() -> tuple[tuple[str, str], ...]:
    """The (decorator, name) pairs of the family modules, in :data:`FAMILY_MODULES` order, then source order."""
    folder = Path(__file__).parent
    return tuple(pair for name in FAMILY_MODULES for pair in _registered(folder / f"{name}.py"))


def declared_names(decorator: str) -> tuple[str, ...]:
    """The names the family modules register with ``decorator``."""
    return tuple(name for kind, name in _declarations() if kind == decorator)


def rules() -> tuple:
    """This part's rule group, in order: each family's ``first_rules`` (rules every loss of ours must pass,
    e.g. the actor's clip ratios), then each family's ``loss_rules``, then each family's ``estimator_rules``."""
    found = families()
    return (
        *(rule for family in found for rule in family.first_rules),
        *(rule for family in found for rule in family.loss_rules),
        *(rule for family in found for rule in family.estimator_rules),
    )
