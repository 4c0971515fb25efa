"""verl platform ``cpu``: runs verl's training engines on the CPU (opt-in, ``VERL_PLATFORM=cpu``).

verl 0.9.1 resolves its device through ``verl.plugin.platform.get_platform()``; without an
accelerator it falls back to ``nvidia`` and every ``torch.cuda`` call fails. This module registers a
:class:`CPUPlatform` under the name ``cpu``. It is selected only when ``VERL_PLATFORM=cpu`` is set in
a process before its first ``get_platform()`` call; GPU users never see it.

What the CPU path needs besides the platform (the ``+cpu=demo`` overlay sets all of it, and
:mod:`verl_offpolicy.cpu.guards` checks it at startup):

- ``VERL_ENGINE_DEVICE=cuda``: verl's engine registry has only ``cuda``/``npu`` keys; this selects
  the FSDP engine class, whose device calls then go through this platform.
- A fake Ray ``GPU`` resource (``ray_kwargs.ray_init.num_gpus``): verl's resource pools count only
  the accelerator resource that :meth:`CPUPlatform.ray_resource_name` names; torch still runs on CPU.
- The process-group backend ``gloo`` (:func:`verl_offpolicy.cpu.verl_shims.install_gloo_default`).
- :data:`LOOPBACK_ENV` in the environment that starts ``main_ppo``, so that Ray, TransferQueue and
  the process groups listen on 127.0.0.1 only (``verl-offpolicy demo`` sets it; the guard warns).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import platform as _py_platform
import resource
import types
from contextlib import contextmanager
from typing import Any, Optional

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

logger = logging.getLogger("verl_offpolicy")

PLATFORM_NAME = "cpu"
ENV_PLATFORM = "VERL_PLATFORM"
ENV_ENGINE_DEVICE = "VERL_ENGINE_DEVICE"
# The environment every process of a CPU run needs (driver, TaskRunner, Ray workers).
CPU_ENV = {ENV_PLATFORM: PLATFORM_NAME, ENV_ENGINE_DEVICE: "cuda"}
# The environment of the process that starts Ray (Ray reads it at import). Without it Ray replaces
# ``_node_ip_address=127.0.0.1`` by the machine's external address and its servers, TransferQueue and
# the process-group rendezvous listen on every interface; with it they all bind 127.0.0.1. It only
# disables joining multi-node clusters, which a CPU run does not do.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def _rss_bytes() -> int:
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except Exception:  # noqa: BLE001 - memory metrics are best effort
        return 0


def _peak_rss_bytes() -> int:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _make_device_module() -> types.ModuleType:
    """A ``torch.cuda``-shaped namespace for the CPU: ``torch.cpu`` plus what verl calls on it.

    Memory functions report the process's resident memory (current and peak), which is what
    "device memory" means on a CPU; cache/IPC/allocator calls are no-ops.
    """
    module = types.ModuleType("verl_offpolicy_cpu_device")
    for name in ("Event", "Stream", "StreamContext", "current_stream", "stream", "synchronize", "is_available"):
        setattr(module, name, getattr(torch.cpu, name))
    module.current_device = lambda: "cpu"
    module.device_count = lambda: 1
    module.set_device = lambda *args, **kwargs: None
    module.is_initialized = lambda: True
    module.empty_cache = lambda: None
    module.ipc_collect = lambda: None
    module.set_per_process_memory_fraction = lambda *args, **kwargs: None
    module.reset_peak_memory_stats = lambda *args, **kwargs: None
    module.memory_allocated = lambda *args, **kwargs: _rss_bytes()
    module.memory_reserved = lambda *args, **kwargs: _rss_bytes()
    module.max_memory_allocated = lambda *args, **kwargs: _peak_rss_bytes()
    module.max_memory_reserved = lambda *args, **kwargs: _peak_rss_bytes()

    def mem_get_info(*args, **kwargs) -> tuple[int, int]:
        import psutil

        vm = psutil.virtual_memory()
        return vm.available, vm.total

    module.mem_get_info = mem_get_info
    module.get_device_name = lambda *args, **kwargs: _py_platform.processor() or _py_platform.machine() or "cpu"
    module.get_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    module.set_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
    module.manual_seed = lambda seed: torch.manual_seed(seed)
    module.manual_seed_all = lambda seed: torch.manual_seed(seed)
    return module


@PlatformRegistry.register(platform=PLATFORM_NAME)
class CPUPlatform(PlatformBase):
    """verl platform for CPU-only machines (tests, CI, demos).

    ``ray_resource_name`` is ``GPU``: verl's resource pools and rollout replicas count accelerators
    through it, so a CPU run starts Ray with a fake ``GPU`` resource per training process.
    """

    _device_module: Optional[types.ModuleType] = None

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        if CPUPlatform._device_module is None:
            CPUPlatform._device_module = _make_device_module()
        return CPUPlatform._device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        # Never auto-detected: the CPU platform is opt-in through VERL_PLATFORM=cpu.
        return False

    def current_device(self):
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets CUDA_VISIBLE_DEVICES for actors holding the fake GPU; torch (CPU build) ignores it.
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def is_ipc_supported(self) -> bool:
        return False

    def rollout_env_vars(self) -> dict[str, str]:
        return dict(CPU_ENV)

    def cudart(self) -> Any:
        return None


def cpu_selected() -> bool:
    """True if this process asked for the CPU platform (``VERL_PLATFORM=cpu``)."""
    return os.environ.get(ENV_PLATFORM, "").strip().lower() == PLATFORM_NAME


def is_loopback_host(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8, ``::1`` and IPv4-mapped ``::ffff:127.x.x.x``."""
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback


def is_loopback(address: str) -> bool:
    """True if ``ip:port`` (a suffix such as ``" (raylet)"`` allowed) is a loopback address."""
    return is_loopback_host(address.split(" ")[0].rpartition(":")[0])


class CPUPlatformError(RuntimeError):
    """This process is not set up for verl's CPU path; the message says what to set."""


def require_cpu_platform(where: str) -> None:
    """Raise :class:`CPUPlatformError` unless this process runs verl's CPU platform."""
    from verl.plugin.platform import get_platform

    name = get_platform().device_name
    if name != PLATFORM_NAME or not cpu_selected():
        raise CPUPlatformError(
            f"{where} runs on verl's CPU platform only, but this process has {ENV_PLATFORM}="
            f"{os.environ.get(ENV_PLATFORM)!r} (platform device {name!r}). Set {ENV_PLATFORM}=cpu and "
            f"{ENV_ENGINE_DEVICE}=cuda for every process: on the command line add +cpu=demo, or set "
            "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM=cpu and "
            "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_ENGINE_DEVICE=cuda"
        )
