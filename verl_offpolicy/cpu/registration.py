"""Registers the CPU platform and the ``hf`` rollout backend into verl's registries (cheaply).

Run by :mod:`verl_offpolicy.glue.registration` (see its ``EAGER_REGISTRATIONS`` and
``DEFERRED_REGISTRATIONS``):

- :func:`register_platform` at ``import verl`` in every process: the ``cpu`` platform class (it
  needs only torch and verl's platform module, both already imported by ``import verl``) and, in a
  process with ``VERL_PLATFORM=cpu``, the gloo default of the process-group backend (see
  :func:`verl_shims.install_gloo_default`) and the ``vllm`` distribution alias of :mod:`.vllm_shims`;
- :func:`register_megatron_shims` right after verl imports its Megatron engine module (every process
  does, FSDP runs included): in a ``VERL_PLATFORM=cpu`` process only, the engine installs the CUDA
  shims of :mod:`verl_offpolicy.cpu.megatron` when it is first built; elsewhere nothing is imported;
- :func:`register_rollout` right after verl itself imports ``verl.workers.rollout``, so that GPU
  users' ``import verl`` does not pay for importing the rollout package. The registry entries only
  name our classes; :mod:`verl_offpolicy.cpu.rollout` is imported when verl looks the backend up.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

from verl_offpolicy.cpu.platform import cpu_selected
from verl_offpolicy.cpu.verl_shims import install_gloo_default
from verl_offpolicy.glue.registration import HF_ROLLOUT

ADAPTER_FQN = "verl_offpolicy.cpu.rollout.HFServerAdapter"


def _load_replica():
    from verl_offpolicy.cpu.rollout import HFReplica

    return HFReplica


def register_rollout() -> None:
    """Put ``hf`` into verl's two rollout registries (public replica registry, private adapter dict)."""
    from verl.workers.rollout import base, replica

    replica.RolloutReplicaRegistry.register(HF_ROLLOUT, _load_replica)
    # verl has no public API for adapters: it registers vllm/sglang/trtllm in this private dict too.
    base._ROLLOUT_REGISTRY[(HF_ROLLOUT, "async")] = ADAPTER_FQN


def rollout_registered() -> bool:
    """True if both verl registries know ``hf`` (imports ``verl.workers.rollout``, which registers)."""
    from verl.workers.rollout import base, replica

    return (
        HF_ROLLOUT in replica.RolloutReplicaRegistry._registry
        and base._ROLLOUT_REGISTRY.get((HF_ROLLOUT, "async")) == ADAPTER_FQN
    )


def register_platform() -> None:
    """The ``cpu`` platform class (registered by importing :mod:`.platform`) and, in a process with
    ``VERL_PLATFORM=cpu``, the gloo default of the process-group backend, the answer to verl's look-up
    of the distribution ``vllm`` when vLLM's CPU build is installed (:mod:`.vllm_shims`; imports nothing)
    and the engines an FSDP run skips (:func:`skip_unused_engines`)."""
    from verl_offpolicy.cpu.vllm_shims import install_vllm_distribution_alias

    install_gloo_default()
    install_vllm_distribution_alias()
    skip_unused_engines()


# ``verl.workers.engine`` imports every engine it can, in every process: with megatron-core installed
# (the megatron-cpu extra) that is ~4-6 s of CPU per process, several processes per run. A CPU process
# with this variable (``+cpu=demo`` sets it for the Ray workers, ``verl-offpolicy demo`` for the driver
# of an FSDP run) skips the listed engines; verl then reports them "not available", as it does torchtitan.
SKIP_ENGINES_ENV = "VERL_OFFPOLICY_CPU_SKIP_ENGINES"
SKIPPABLE_ENGINES = {"megatron": "verl.workers.engine.megatron", "mindspeed": "verl.workers.engine.mindspeed"}
FSDP_RUN_SKIPS = "megatron,mindspeed"  # what +cpu=demo's workers and the demo's FSDP driver skip


class _SkippedEngines(importlib.abc.MetaPathFinder):
    def __init__(self, modules: frozenset[str], setting: str):
        self.modules, self.setting = modules, setting

    def find_spec(self, fullname, path, target=None):
        if fullname in self.modules:
            raise ImportError(f"{fullname} is skipped in this CPU process ({SKIP_ENGINES_ENV}={self.setting})")
        return None


def skip_unused_engines() -> bool:
    """In a ``VERL_PLATFORM=cpu`` process, make verl's import of the engines named by
    ``VERL_OFFPOLICY_CPU_SKIP_ENGINES`` (comma-separated: megatron, mindspeed) fail as a missing package
    would. Returns True if installed. An unknown name raises (registration reports it at startup)."""
    setting = os.environ.get(SKIP_ENGINES_ENV, "").strip()
    if not setting or not cpu_selected():
        return False
    names = {name.strip() for name in setting.split(",") if name.strip()}
    if names - set(SKIPPABLE_ENGINES):
        raise ValueError(
            f"{SKIP_ENGINES_ENV}={setting}: unknown engine(s) {sorted(names - set(SKIPPABLE_ENGINES))}; "
            f"allowed: {', '.join(SKIPPABLE_ENGINES)}"
        )
    if any(isinstance(finder, _SkippedEngines) for finder in sys.meta_path):
        return True
    sys.meta_path.insert(0, _SkippedEngines(frozenset(SKIPPABLE_ENGINES[name] for name in names), setting))
    return True


def register_megatron_shims() -> bool:
    """In a CPU process, make verl's Megatron engine install our CUDA shims when built. Returns True if so.

    Outside ``VERL_PLATFORM=cpu`` (every GPU job) this returns at once and imports nothing.
    """
    if not cpu_selected():
        return False
    from verl_offpolicy.cpu.megatron import install_on_engine_build

    install_on_engine_build()
    return True
