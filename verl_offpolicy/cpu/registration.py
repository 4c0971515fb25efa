"""Registers the CPU platform and the ``hf`` rollout backend into verl's registries (cheaply).

Imported by our ``verl.plugins`` entry point at ``import verl`` in every process (listed in
``verl_offpolicy.glue.registration.REGISTRATION_MODULES``), so it must not import heavy modules:

- the ``cpu`` platform class is registered at once (it needs only torch and verl's platform module,
  both already imported by ``import verl``); in a process with ``VERL_PLATFORM=cpu`` the gloo
  default of the process-group backend is installed (see :func:`platform.install_gloo_default`);
- the rollout names are registered when verl itself imports ``verl.workers.rollout`` (a post-import
  hook), so that GPU users' ``import verl`` does not pay for importing the rollout package. The
  registry entries only name our classes; :mod:`verl_offpolicy.cpu.rollout` is imported when verl
  looks the backend up.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from typing import Callable

from verl_offpolicy.cpu.platform import PLATFORM_NAME, install_gloo_default

ROLLOUT_NAME = "hf"
ROLLOUT_PACKAGE = "verl.workers.rollout"
ADAPTER_FQN = "verl_offpolicy.cpu.rollout.HFServerAdapter"


def _load_replica():
    from verl_offpolicy.cpu.rollout import HFReplica

    return HFReplica


def register_rollout() -> None:
    """Put ``hf`` into verl's two rollout registries (public replica registry, private adapter dict)."""
    from verl.workers.rollout import base, replica

    replica.RolloutReplicaRegistry.register(ROLLOUT_NAME, _load_replica)
    # verl has no public API for adapters: it registers vllm/sglang/trtllm in this private dict too.
    base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = ADAPTER_FQN


def rollout_registered() -> bool:
    """True if both verl registries know ``hf`` (imports ``verl.workers.rollout``, which registers)."""
    from verl.workers.rollout import base, replica

    return (
        ROLLOUT_NAME in replica.RolloutReplicaRegistry._registry
        and base._ROLLOUT_REGISTRY.get((ROLLOUT_NAME, "async")) == ADAPTER_FQN
    )


def platform_registered() -> bool:
    from verl.plugin.platform import PlatformRegistry

    return PlatformRegistry.get(PLATFORM_NAME) is not None


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


class _AfterImportHook(importlib.abc.MetaPathFinder):
    """Runs a callback right after a given module finishes importing (once per process)."""

    def __init__(self, module_name: str, callback: Callable[[], None]):
        self.module_name = module_name
        self.callback = callback
        self._lock = threading.Lock()

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module_name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _LoaderWithCallback(spec.loader, self._run)
        return spec

    def _run(self) -> None:
        with self._lock:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
        self.callback()


def _install_rollout_hook() -> None:
    if ROLLOUT_PACKAGE in sys.modules:
        register_rollout()
        return
    if any(isinstance(f, _AfterImportHook) and f.module_name == ROLLOUT_PACKAGE for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _AfterImportHook(ROLLOUT_PACKAGE, register_rollout))


install_gloo_default()
_install_rollout_hook()
