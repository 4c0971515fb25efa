"""Registration of everything verl-offpolicy adds to verl's registries, and its failure state.

verl imports our ``verl.plugins`` entry point (``verl_offpolicy.glue.plugin``) at ``import verl`` in
every process, and swallows a plugin's exception at DEBUG level: a user would only see
"Unsupported loss mode" at the first training step. So registration never raises here: it logs an
ERROR with the cause and remembers it, and every config that selects one of our names calls
:func:`require_registration`, which raises at startup with the original error in the message.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import logging
import sys
import threading
import traceback
from dataclasses import dataclass
from typing import Callable

from verl_offpolicy.glue import algorithms

logger = logging.getLogger("verl_offpolicy")

# Run at ``import verl``: the CPU platform must be registered before verl's first get_platform().
# The presets' OmegaConf resolvers must exist before Hydra composes or verl resolves a config.
EAGER_REGISTRATIONS: tuple[str, ...] = (
    "verl_offpolicy.cpu.registration:register_platform",
    "verl_offpolicy.glue.resolvers:register_resolvers",
)

# verl module -> what registers into it, run right after verl itself imports that module, so that
# ``import verl`` (in every Ray worker of every GPU job) imports nothing more than it already does.
# An entry is a module (registering at import) or "module:function".
DEFERRED_REGISTRATIONS: dict[str, tuple[str, ...]] = {
    # Every family module of the algorithms part (read from its decorators, glue/algorithms/__init__.py),
    # after recording (and clearing) what another package registered earlier under one of our names.
    "verl.trainer.ppo.core_algos": (
        "verl_offpolicy.glue.registration:take_over_our_names",
        *algorithms.family_modules(),
    ),
    # The scheduler's two trainer classes, one registered name each (colocated, overlapped).
    "verl.trainer.ppo.v1.trainer_base": (
        "verl_offpolicy.glue.scheduler.colocated",
        "verl_offpolicy.glue.scheduler.overlapped",
    ),
    "verl.workers.rollout": ("verl_offpolicy.cpu.registration:register_rollout",),
    # data.truncation on the agent loop's too-long prompts (every job); the CPU path's ordered agent loops.
    "verl.experimental.agent_loop": (
        "verl_offpolicy.glue.prompt_length:install_truncation_rule",
        "verl_offpolicy.cpu.agent_loop",
    ),
    # CPU path only (no-op unless VERL_PLATFORM=cpu): the reference model's offload must not pin memory; merged LoRA
    # weights reach the rollout in their own dtype; LoRA adapters start from a fixed seed.
    # m2po's whole-mini-batch pre-pass (runs only for loss_mode=m2po): verl_offpolicy.glue.algorithms.m2po.
    "verl.workers.engine.fsdp.transformer_impl": (
        "verl_offpolicy.cpu.verl_shims:install_unpinned_offload",
        "verl_offpolicy.cpu.verl_shims:install_exact_merged_lora",
        "verl_offpolicy.cpu.verl_shims:install_seeded_lora_init",
        "verl_offpolicy.glue.algorithms.m2po:install_mini_batch_pre_pass",
    ),
    # CPU path only (no-op unless VERL_PLATFORM=cpu): the Megatron engine's CUDA shims, installed when one is built.
    "verl.workers.engine.megatron.transformer_impl": ("verl_offpolicy.cpu.registration:register_megatron_shims",),
    # CPU path only (no-op unless VERL_PLATFORM=cpu): verl 0.9.1's separate_async logs with flush=True.
    "verl.trainer.ppo.v1.trainer_separate_async": ("verl_offpolicy.cpu.verl_shims:install_separate_async_log_fix",),
}

_failure: str | None = None
_done = False
_lock = threading.RLock()


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
    from verl.workers.rollout import base, replica

    return name in replica.RolloutReplicaRegistry._registry and (name, "async") in base._ROLLOUT_REGISTRY


def _in_agent_loop_registry(name: str) -> bool:
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    return name in _agent_loop_registry


def _in_tool_parser_registry(name: str) -> bool:
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry  # noqa: F401 - its hook registers ours
    from verl.experimental.agent_loop.tool_parser import ToolParser

    return name in ToolParser._registry


def _in_trainer_registry(name: str) -> bool:
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    return name in TRAINER_REGISTRY


# Read from the algorithms part's decorators (one source: the adapter that registers the name).
ADV_ESTIMATORS = algorithms.declared_names(algorithms.ESTIMATOR_DECORATOR)
POLICY_LOSSES = algorithms.declared_names(algorithms.LOSS_DECORATOR)
# trainer.v1.trainer_mode of the staleness scheduler, one name per mode (glue/scheduler/colocated.py, overlapped.py),
# each with the actor_rollout_ref.hybrid_engine it serves; the presets pick the name from hybrid_engine
# (the offpolicy.trainer_mode resolver, glue/resolvers.py).
OFFPOLICY_TRAINER = "offpolicy"
OVERLAPPED_TRAINER = "offpolicy_overlapped"
SCHEDULER_MODES = {OFFPOLICY_TRAINER: True, OVERLAPPED_TRAINER: False}  # name -> hybrid_engine
TRAINERS = tuple(SCHEDULER_MODES)


def scheduler_trainer(hybrid_engine: bool) -> str:
    """The scheduler's trainer name for ``actor_rollout_ref.hybrid_engine``: colocated or overlapped."""
    return next(name for name, hybrid in SCHEDULER_MODES.items() if hybrid == bool(hybrid_engine))


# verl's own asynchronous trainers (threshold-bounded staleness, partial rollouts): scheduler/checks.py's
# check_verl_async_modes says what a preset keeps under them.
VERL_ASYNC_TRAINERS = ("colocate_async", "separate_async")
PLATFORMS = ("cpu",)
HF_ROLLOUT = "hf"  # the CPU backend's rollout (verl_offpolicy.cpu): its one name, imported there
ROLLOUTS = (HF_ROLLOUT,)
VLLM_ROLLOUT = "vllm"  # verl's own vLLM rollout (not ours): the other rollout of the CPU path (cpu/vllm_shims.py)
# The CPU path's weight transport for a rollout on its own pool (verl_offpolicy.cpu.checkpoint_engine,
# registered in verl's CheckpointEngineRegistry when verl imports checkpoint_engine.custom_backend_module).
CPU_CHECKPOINT_BACKEND = "cpu_mailbox"
CPU_CHECKPOINT_MODULE = "verl_offpolicy.cpu.checkpoint_engine"
SEEDED_AGENT_LOOP = "seeded_single_turn_agent"  # the CPU overlay's agent loop (verl_offpolicy.cpu.agent_loop)
ORDERED_AGENT_LOOP = "ordered_single_turn_agent"  # the same, one priority at a time: the standalone overlay's
SEEDED_TOOL_AGENT_LOOP = (
    "seeded_tool_agent"  # verl's multi-turn tool agent loop, seeded (and ordered on a standalone rollout)
)
AGENT_LOOPS = (SEEDED_AGENT_LOOP, ORDERED_AGENT_LOOP, SEEDED_TOOL_AGENT_LOOP)
WORD_TOOL_PARSER = "words"  # the tool-call format of a word-level tokenizer (verl_offpolicy.cpu.tool_parser)
TOOL_PARSERS = (WORD_TOOL_PARSER,)


# ---------------------------------------------------------------------- name collisions
#
# verl's register_policy_loss overwrites a name silently (register_adv_est raises on a second function),
# and verl or another plugin may define one of our names (open upstream PRs add `topr` and `m2po`). The
# rule: verl-offpolicy's function serves its names. One registered before ours is replaced, with a
# WARNING, and reported by `doctor`/`check`; one registered after ours (the last import wins in verl)
# stops a run that selects the name at startup, naming both functions.

OWN_PACKAGE = "verl_offpolicy"
# Where a config selects an estimator / a loss (the kinds a name collision concerns).
CONFIG_KEYS = {
    "adv_estimator": "algorithm.adv_estimator",
    "policy_loss": "actor_rollout_ref.actor.policy_loss.loss_mode",
}
# (kind, name) -> origin of the function that another package had registered before ours replaced it
_replaced: dict[tuple[str, str], str] = {}
# Names another package defines with different maths: said in every collision message on them.
OTHER_MEANINGS = {
    ("policy_loss", "topr"): "verl's own topr (verl#6986) truncates the length-normalised sequence ratio, "
    "verl-offpolicy's the unnormalised one (docs/algo/topr.md): the two train differently",
}


def _algorithm_registries() -> dict[str, tuple[dict, tuple[str, ...]]]:
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY

    return {
        "adv_estimator": (ADV_ESTIMATOR_REGISTRY, ADV_ESTIMATORS),
        "policy_loss": (POLICY_LOSS_REGISTRY, POLICY_LOSSES),
    }


def origin(fn: Callable) -> str:
    """Where a registered function comes from: ``module.qualname``."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def is_ours(fn: Callable) -> bool:
    module = getattr(fn, "__module__", "") or ""
    return module == OWN_PACKAGE or module.startswith(OWN_PACKAGE + ".")


def take_over_our_names() -> None:
    """Before our family modules register: remember and remove what another package put under our names
    (verl's register_adv_est would refuse ours otherwise; register_policy_loss would replace it silently)."""
    for kind, (registry, names) in _algorithm_registries().items():
        for name in names:
            fn = registry.get(name)
            if fn is not None and not is_ours(fn):
                _replaced[(kind, name)] = origin(fn)
                del registry[name]
                logger.warning(
                    "verl-offpolicy replaces the %s '%s' registered earlier by %s with its own (see "
                    "`verl-offpolicy doctor`)",
                    kind,
                    name,
                    origin(fn),
                )


def collision(kind: str, name: str) -> str | None:
    """Why ``name`` of ``kind`` in verl's registry is not (only) verl-offpolicy's, or None."""
    if kind not in CONFIG_KEYS:
        return None
    registry, _ = _algorithm_registries()[kind]
    key = CONFIG_KEYS[kind]
    fn = registry.get(name)
    meaning = f"; {OTHER_MEANINGS[(kind, name)]}" if (kind, name) in OTHER_MEANINGS else ""
    if fn is not None and not is_ours(fn):
        return (
            f"{kind} '{name}' in verl's registry is {origin(fn)}, registered after verl-offpolicy's (verl keeps the "
            f"last one), so {key}={name} would not run verl-offpolicy's; remove or disable the package of "
            f"{getattr(fn, '__module__', '?')} (VERL_USE_EXTERNAL_PLUGINS lists the plugins verl loads), or "
            f"rename its {kind}" + meaning
        )
    if (kind, name) in _replaced:
        return (
            f"{kind} '{name}' was registered first by {_replaced[(kind, name)]}; verl-offpolicy's replaced it, so "
            f"{key}={name} runs verl-offpolicy's (docs/extending.md#name-collisions); to use the other, uninstall "
            "verl-offpolicy or register it under another name" + meaning
        )
    return None


def collisions() -> list[dict]:
    """Every collision on our estimator and loss names in this process: ``{"kind", "name", "message",
    "fatal"}``; fatal when the registry holds the other function (a run selecting the name stops)."""
    register_all()
    found = []
    for kind, (registry, names) in _algorithm_registries().items():
        for name in names:
            message = collision(kind, name)
            if message:
                found.append(
                    {
                        "kind": kind,
                        "name": name,
                        "config_key": CONFIG_KEYS[kind],
                        "message": message,
                        "fatal": not is_ours(registry.get(name)),
                    }
                )
    return found


def expected_names() -> list[RegisteredName]:
    """Every name this package registers, with the config key that selects it."""
    names = [RegisteredName("adv_estimator", n, CONFIG_KEYS["adv_estimator"], _in_adv_registry) for n in ADV_ESTIMATORS]
    names += [RegisteredName("policy_loss", n, CONFIG_KEYS["policy_loss"], _in_loss_registry) for n in POLICY_LOSSES]
    names += [RegisteredName("trainer", n, "trainer.v1.trainer_mode", _in_trainer_registry) for n in TRAINERS]
    names += [RegisteredName("platform", n, "VERL_PLATFORM (environment)", _in_platform_registry) for n in PLATFORMS]
    names += [RegisteredName("rollout", n, "actor_rollout_ref.rollout.name", _in_rollout_registry) for n in ROLLOUTS]
    names += [
        RegisteredName("agent_loop", n, "actor_rollout_ref.rollout.agent.default_agent_loop", _in_agent_loop_registry)
        for n in AGENT_LOOPS
    ]
    names += [
        RegisteredName("tool_parser", n, "actor_rollout_ref.rollout.multi_turn.format", _in_tool_parser_registry)
        for n in TOOL_PARSERS
    ]
    return names


def _run(target: str) -> None:
    """Import ``module`` or call ``module:function``; record and log a failure, never raise."""
    global _failure
    module, _, function = target.partition(":")
    try:
        loaded = importlib.import_module(module)
        if function:
            getattr(loaded, function)()
    except Exception as exc:  # noqa: BLE001 - reported loudly here, re-raised by require_registration
        with _lock:
            if _failure is None:
                _failure = f"importing {target} raised {type(exc).__name__}: {exc}"
        logger.error(
            "verl-offpolicy failed to register its algorithms in this process: importing %s raised %s: %s\n%s",
            target,
            type(exc).__name__,
            exc,
            traceback.format_exc(),
        )


class _LoaderWithCallback(importlib.abc.Loader):
    def __init__(self, loader, callback: Callable[[], None]):
        self._loader = loader
        self._callback = callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._callback()

    def __getattr__(self, name):  # get_resource_reader, is_package, get_source, ...
        return getattr(self._loader, name)


class AfterImportHook(importlib.abc.MetaPathFinder):
    """Runs the registrations of one verl module right after that module finishes importing (once)."""

    def __init__(self, module_name: str, targets: tuple[str, ...]):
        self.module_name = module_name
        self.targets = targets

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module_name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _LoaderWithCallback(spec.loader, self.fire)
        return spec

    def fire(self) -> None:
        with _lock:
            if self not in sys.meta_path:
                return
            sys.meta_path.remove(self)
        for target in self.targets:
            _run(target)


def register_all() -> str | None:
    """Register once per process (eager part now, the rest when verl imports each registry module).

    Returns the failure text so far, or None. Never raises: a failure is logged at ERROR level
    (verl would hide it at DEBUG) and kept for :func:`require_registration`.
    """
    global _done
    with _lock:
        if _done:
            return _failure
        _done = True
    for target in EAGER_REGISTRATIONS:
        _run(target)
    for module_name, targets in DEFERRED_REGISTRATIONS.items():
        hook = AfterImportHook(module_name, targets)
        if module_name in sys.modules:
            for target in targets:
                _run(target)
        else:
            sys.meta_path.insert(0, hook)
    return _failure


def registration_failure() -> str | None:
    """The recorded failure text of this process (registering first if nobody did yet)."""
    register_all()
    return _failure


def require_registration(kind: str, name: str) -> None:
    """Raise at startup if ``name`` of ``kind`` is not usable in this process, with the original cause."""
    register_all()
    entry = next((e for e in expected_names() if e.kind == kind and e.name == name), None)
    # The lookup imports verl's registry module, which runs our deferred registration into it.
    present = entry.lookup(name) if entry is not None else True
    if _failure is not None:
        where = f" ({entry.config_key}={name})" if entry else ""
        raise RegistrationError(
            f"verl-offpolicy could not register its {kind} '{name}'{where}: {_failure}. "
            "Fix the cause above (run `verl-offpolicy doctor` for a full report)."
        )
    if not present:
        raise RegistrationError(
            f"verl-offpolicy's {kind} '{name}' is missing from verl's registry although registration "
            "reported no error; run `verl-offpolicy doctor`."
        )
    if kind in CONFIG_KEYS and not is_ours(_algorithm_registries()[kind][0][name]):
        raise RegistrationError(f"verl-offpolicy: {collision(kind, name)}.")  # (one ours replaced only warns)
