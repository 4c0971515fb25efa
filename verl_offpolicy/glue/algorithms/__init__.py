"""The algorithms part: one module per family, each holding its verl adapters and the rules that guard them.

A family module (``opmd.py``, ``agro.py``, ``rec.py``, ...) registers its estimators and losses with verl's
own decorators (``@register_adv_est("name")``, ``@register_policy_loss("name")``) around a one-line call of
the formula in :mod:`verl_offpolicy.core`, and defines its startup rules next to them:
``FIRST_RULES`` (for every loss of ours), ``LOSS_RULES`` (each tests its own ``loss_mode``) and
``ESTIMATOR_RULES`` (each tests its own ``adv_estimator``), functions ``rule(view: ConfigView) -> None``. Shared pieces: :mod:`.adapters`
(prepare/broadcast/aggregate) and :mod:`.kl_reward` (the rules of estimators on verl's KL-in-reward).

Nothing else lists the names: :func:`declared_names` reads them from the family modules' decorators
(their source, without importing them), and ``glue/registration.py`` derives its name lists and the
modules it imports after ``verl.trainer.ppo.core_algos`` from it. This ``__init__`` imports only the
standard library: ``glue/registration.py`` runs at ``import verl`` in every process.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

PACKAGE = __name__
ESTIMATOR_DECORATOR = "register_adv_est"
LOSS_DECORATOR = "register_policy_loss"


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
def _declarations() -> dict[str, list[tuple[str, str]]]:
    """Family module name -> its (decorator, name) pairs, for every module of this package that registers one."""
    declared = {}
    for path in sorted(Path(__file__).parent.glob("*.py")):
        pairs = _registered(path)
        if pairs:
            declared[f"{PACKAGE}.{path.stem}"] = pairs
    return declared


def declared_names(decorator: str) -> tuple[str, ...]:
    """The names the family modules register with ``decorator`` (file-name order, then source order)."""
    return tuple(name for pairs in _declarations().values() for kind, name in pairs if kind == decorator)


def family_modules() -> tuple[str, ...]:
    """The modules that register an estimator or a loss (imported when verl imports ``core_algos``)."""
    return tuple(_declarations())


def rules() -> tuple:
    """This part's rule group, in order: each family's ``FIRST_RULES`` (rules every loss of ours must pass,
    e.g. the actor's clip ratios), then each family's ``LOSS_RULES``, then each family's
    ``ESTIMATOR_RULES`` (families in file-name order; the family modules are imported here, by name)."""
    import importlib

    families = [importlib.import_module(name) for name in family_modules()]
    return tuple(
        rule for stage in ("FIRST_RULES", "LOSS_RULES", "ESTIMATOR_RULES") for family in families for rule in getattr(family, stage, ())
    )
