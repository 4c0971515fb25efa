"""Registration of everything verl-offpolicy adds to verl's registries, and its failure state.

verl imports our ``verl.plugins`` entry point (``verl_offpolicy.glue.plugin``) at ``import verl`` in
every process, and swallows a plugin's exception at DEBUG level: a user would only see
"Unsupported loss mode" at the first training step. So registration never raises here: it logs an
ERROR with the cause and remembers it, and every config that selects one of our names calls
:func:`require_registration`, which raises at startup with the original error in the message.
"""

from __future__ import annotations

import importlib
import logging
import traceback
from dataclasses import dataclass
from typing import Callable

logger = logging.getLogger("verl_offpolicy")

# Modules whose import registers names into verl's registries (decorators at module level).
REGISTRATION_MODULES: tuple[str, ...] = (
    "verl_offpolicy.cpu.registration",  # opt-in CPU platform + hf rollout (cheap; heavy parts lazy)
    "verl_offpolicy.glue.estimators",
    "verl_offpolicy.glue.losses",
    "verl_offpolicy.glue.trainer",
)

_failure: str | None = None
_done = False


class RegistrationError(RuntimeError):
    """verl-offpolicy could not register its names in this process."""


@dataclass(frozen=True)
class RegisteredName:
    kind: str  # "adv_estimator", "policy_loss", "trainer", ...
    name: str
    config_key: str  # where a user selects it
    lookup: Callable[[str], bool]


def _in_adv_registry(name: str) -> bool:
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY

    return name in ADV_ESTIMATOR_REGISTRY


def _in_loss_registry(name: str) -> bool:
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    return name in POLICY_LOSS_REGISTRY


def _in_platform_registry(name: str) -> bool:
    from verl.plugin.platform import PlatformRegistry

    return PlatformRegistry.get(name) is not None


def _in_rollout_registry(name: str) -> bool:
    # Importing verl's rollout package runs our post-import registration (verl_offpolicy.cpu.registration).
    from verl.workers.rollout import base, replica

    return name in replica.RolloutReplicaRegistry._registry and (name, "async") in base._ROLLOUT_REGISTRY


def _in_trainer_registry(name: str) -> bool:
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    return name in TRAINER_REGISTRY


ADV_ESTIMATORS = ("opmd", "pmd_partition", "asymre", "red_drop", "red_weight", "agro")
POLICY_LOSSES = ("opmd", "pmd", "rec")
TRAINERS = ("offpolicy",)
PLATFORMS = ("cpu",)
ROLLOUTS = ("hf",)


def expected_names() -> list[RegisteredName]:
    """Every name this package registers, with the config key that selects it."""
    names = [RegisteredName("adv_estimator", n, "algorithm.adv_estimator", _in_adv_registry) for n in ADV_ESTIMATORS]
    names += [
        RegisteredName("policy_loss", n, "actor_rollout_ref.actor.policy_loss.loss_mode", _in_loss_registry)
        for n in POLICY_LOSSES
    ]
    names += [RegisteredName("trainer", n, "trainer.v1.trainer_mode", _in_trainer_registry) for n in TRAINERS]
    names += [RegisteredName("platform", n, "VERL_PLATFORM (environment)", _in_platform_registry) for n in PLATFORMS]
    names += [RegisteredName("rollout", n, "actor_rollout_ref.rollout.name", _in_rollout_registry) for n in ROLLOUTS]
    return names


def register_all(force: bool = False) -> str | None:
    """Import every registration module once per process. Returns the failure text, or None.

    Never raises: a failure is logged at ERROR level (verl would hide it at DEBUG) and kept for
    :func:`require_registration`.
    """
    global _failure, _done
    if _done and not force:
        return _failure
    _done, _failure = True, None
    for module in REGISTRATION_MODULES:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - reported loudly below, re-raised at startup
            _failure = f"importing {module} raised {type(exc).__name__}: {exc}"
            logger.error(
                "verl-offpolicy failed to register its algorithms in this process: %s\n%s",
                _failure,
                traceback.format_exc(),
            )
            break
    return _failure


def registration_failure() -> str | None:
    """The recorded failure text of this process (registering first if nobody did yet)."""
    return register_all()


def require_registration(kind: str, name: str) -> None:
    """Raise at startup if ``name`` of ``kind`` is not usable in this process, with the original cause."""
    failure = registration_failure()
    entry = next((e for e in expected_names() if e.kind == kind and e.name == name), None)
    if failure is not None:
        where = f" ({entry.config_key}={name})" if entry else ""
        raise RegistrationError(
            f"verl-offpolicy could not register its {kind} '{name}'{where}: {failure}. "
            "Fix the cause above (run `verl-offpolicy doctor` for a full report)."
        )
    if entry is not None and not entry.lookup(name):
        raise RegistrationError(
            f"verl-offpolicy's {kind} '{name}' is missing from verl's registry although registration "
            "reported no error; run `verl-offpolicy doctor`."
        )
