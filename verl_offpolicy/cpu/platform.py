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
- The process-group backend ``gloo`` (see :func:`install_gloo_default`).
- :data:`LOOPBACK_ENV` in the environment that starts ``main_ppo``, so that Ray, TransferQueue and
  the process groups listen on 127.0.0.1 only (``verl-offpolicy demo`` sets it; the guard warns).
"""

from __future__ import annotations

import datetime
import errno
import functools
import ipaddress
import logging
import os
import platform as _py_platform
import resource
import socket
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


def loopback_rendezvous_store(rank: int, world_size: int, timeout: datetime.timedelta):
    """The process group's ``TCPStore``, listening on ``MASTER_ADDR`` only, if that is a loopback address.

    torch's ``env://`` rendezvous makes rank 0's store listen on every interface whatever
    ``MASTER_ADDR`` says. On a loopback run (:data:`LOOPBACK_ENV`) rank 0 binds the socket to
    ``MASTER_ADDR:MASTER_PORT`` itself and hands it to the store (verl's ``create_tcp_store``).
    None (use torch's rendezvous) if the address is not loopback or ``DIST_INIT_METHOD`` is set.

    A group of one process (verl's checkpoint-engine worker of a standalone rollout) needs no agreed port: when
    ``MASTER_PORT`` was taken between verl choosing it and this bind (another run starting beside this one;
    seen once as "Address already in use"), its store listens on a free port instead.
    """
    host = os.environ.get("MASTER_ADDR", "")
    if not is_loopback_host(host) or os.environ.get("DIST_INIT_METHOD"):
        return None
    from verl.utils.distributed import create_tcp_store

    port = int(os.environ["MASTER_PORT"])
    listen_socket = None
    if rank == 0:
        listen_socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listen_socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listen_socket.bind((host, port))
        except OSError as exc:
            if world_size != 1 or exc.errno != errno.EADDRINUSE:
                raise
            listen_socket.bind((host, 0))
            port = listen_socket.getsockname()[1]
        listen_socket.listen(128)
    return create_tcp_store(
        host,
        port,
        listen_socket=listen_socket,
        world_size=world_size,
        is_master=rank == 0,
        timeout=timeout,
        wait_for_workers=False,
    )


def install_gloo_default() -> bool:
    """Make verl's default process-group backend ``gloo`` in a CPU process. Returns True if installed.

    ``verl.utils.distributed.initialize_global_process_group_ray`` builds the backend string
    ``cpu:gloo,{device}:{backend}``, i.e. ``cpu:gloo,cpu:gloo`` on this platform, which
    ``torch.distributed`` rejects ("Duplicate device type cpu"). This wraps that one function so
    that a call without an explicit backend uses ``gloo``; an explicit backend is passed through.
    On a loopback run the rendezvous store listens on loopback only (:func:`loopback_rendezvous_store`).

    Only done when ``VERL_PLATFORM=cpu`` (GPU processes are untouched). It runs from our
    ``verl.plugins`` entry point, i.e. before ``verl.workers.engine_workers`` imports the function.
    """
    if not cpu_selected():
        return False
    import verl.utils.distributed as dist_utils

    original = dist_utils.initialize_global_process_group_ray
    if getattr(original, "_verl_offpolicy_gloo", False):
        return True

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        import torch.distributed
        from torch.distributed.constants import default_pg_timeout

        backend = backend or "gloo"
        if torch.distributed.is_initialized():
            return original(timeout_second=timeout_second, backend=backend)
        # verl's defaults for a process outside a worker group
        rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        timeout = datetime.timedelta(seconds=timeout_second) if timeout_second is not None else default_pg_timeout
        store = loopback_rendezvous_store(rank, world_size, timeout)
        if store is None:
            return original(timeout_second=timeout_second, backend=backend)
        torch.distributed.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout)

    initialize_global_process_group_ray._verl_offpolicy_gloo = True  # type: ignore[attr-defined]
    dist_utils.initialize_global_process_group_ray = initialize_global_process_group_ray
    # Modules that imported the function by name before we ran (normally none).
    import sys

    for module_name in ("verl.workers.engine_workers", "verl.checkpoint_engine.base"):
        module = sys.modules.get(module_name)
        if module is not None and getattr(module, "initialize_global_process_group_ray", None) is original:
            module.initialize_global_process_group_ray = initialize_global_process_group_ray
    return True


def install_unpinned_offload() -> bool:
    """On the CPU, make the FSDP2 engine's ``CPUOffloadPolicy`` not pin memory. Returns True if installed.

    verl's FSDP engine gives forward-only models (the reference policy) ``CPUOffloadPolicy(pin_memory=True)``;
    pinning needs an accelerator, so on the CPU the ref model fails to build ("Cannot access
    accelerator device when none is available"). Only when ``VERL_PLATFORM=cpu``, this rebinds the
    name in ``verl.workers.engine.fsdp.transformer_impl`` to a subclass that keeps the policy (and
    every ``isinstance`` check on it) but with ``pin_memory=False``. Run right after verl imports
    that module (``verl_offpolicy.glue.registration.DEFERRED_REGISTRATIONS``).
    """
    if not cpu_selected():
        return False
    import verl.workers.engine.fsdp.transformer_impl as fsdp_engine

    policy = fsdp_engine.CPUOffloadPolicy
    if getattr(policy, "_verl_offpolicy_unpinned", False):
        return True

    class UnpinnedCPUOffloadPolicy(policy):
        _verl_offpolicy_unpinned = True

        def __init__(self, pin_memory: bool = False):
            super().__init__(pin_memory=False)

    fsdp_engine.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy
    return True


def install_exact_merged_lora() -> bool:
    """On the CPU, send merged LoRA weights (``actor_rollout_ref.model.lora.merge=true``) in their own dtype.

    verl 0.9.1's ``FSDPEngine._merged_lora_per_tensor_param`` casts every merged (sharded) weight to bf16 on its
    way to the rollout (``transformer_impl.py:1082``), so an fp32 rollout generates with bf16-rounded weights:
    measured on the tiny model, the rollout/trainer probability gap at the first step is 3.4e-3 against 3.6e-7
    for full-parameter training. Only when ``VERL_PLATFORM=cpu``, this replaces the method by one that sends the
    same merged tensors (the adapters merged while they are read, the base restored afterwards: verl's
    ``merged_lora_context``) without the cast, and initialises LoRA adapters from a fixed seed
    (:func:`_seed_lora_init`). Run right after verl imports that module
    (``verl_offpolicy.glue.registration.DEFERRED_REGISTRATIONS``). Returns True if installed. The fixes in verl:
    ``upstream/merged-lora-dtype.diff`` and ``upstream/lora-init-seed.diff``.
    """
    if not cpu_selected():
        return False
    import verl.workers.engine.fsdp.transformer_impl as fsdp_engine

    engine = fsdp_engine.FSDPEngine
    if getattr(engine._merged_lora_per_tensor_param, "_verl_offpolicy_exact", False):
        return True

    def merged_in_own_dtype(self):
        try:
            with fsdp_engine.merged_lora_context(self.module, backup_adapters=True):
                model = getattr(self.module, "_fsdp_wrapped_module", self.module)
                params = fsdp_engine.convert_weight_keys(fsdp_engine.normalize_peft_param_name(self.module.state_dict()), model)
                for name, param in params.items():  # copies, made while the adapters are merged
                    yield name, param.full_tensor() if isinstance(param, fsdp_engine.DTensor) else param.detach().clone()
        finally:
            if self._is_offload_param:
                fsdp_engine.offload_fsdp_model_to_cpu(self.module)

    merged_in_own_dtype._verl_offpolicy_exact = True
    engine._merged_lora_per_tensor_param = merged_in_own_dtype
    _seed_lora_init(fsdp_engine)
    return True


LORA_INIT_SEED = 0


def _seed_lora_init(fsdp_engine) -> None:
    """LoRA's adapter initialisation (PEFT draws A from the global torch RNG in ``get_peft_model``) from a fixed
    seed, :data:`LORA_INIT_SEED`, leaving the process's RNG as it was: otherwise the adapters depend on what the
    worker process drew before (the colocated and the overlapped mode's workers draw differently), and two runs
    of one configuration differ from their first gradient."""
    import torch

    build = fsdp_engine.get_peft_model
    if getattr(build, "_verl_offpolicy_seeded", False):
        return

    def seeded_get_peft_model(*args, **kwargs):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(LORA_INIT_SEED)
            return build(*args, **kwargs)

    seeded_get_peft_model._verl_offpolicy_seeded = True
    fsdp_engine.get_peft_model = seeded_get_peft_model


class CPUPlatformError(RuntimeError):
    """This process is not set up for verl's CPU path; the message says what to set."""


def activate_cpu_platform(check_stale: bool = True) -> CPUPlatform:
    """Switch the current process to the CPU platform (tests, the harness, the Hydra driver).

    Sets ``VERL_PLATFORM=cpu`` and ``VERL_ENGINE_DEVICE=cuda``, replaces verl's platform singleton
    if it was already resolved to another platform, and installs the gloo default. With
    ``check_stale`` (for processes that will run an engine), raises :class:`CPUPlatformError` if a
    verl engine module already cached another device name at import time (then the process must
    be started with ``VERL_PLATFORM=cpu`` in its environment). The Hydra driver, which runs no
    engine, passes ``check_stale=False``.
    """
    import sys

    from verl.plugin.platform import platform_manager

    os.environ.update(CPU_ENV)
    current = platform_manager._current_platform
    if current is None or current.device_name != PLATFORM_NAME:
        if current is not None:
            logger.info("verl-offpolicy: switching verl platform %s -> cpu", current.device_name)
        platform_manager._current_platform = CPUPlatform()
    install_gloo_default()
    if not check_stale:
        return platform_manager._current_platform
    stale = [
        name
        for name in (
            "verl.workers.engine.fsdp.transformer_impl",
            "verl.workers.engine.torchtitan.transformer_impl",
            "verl.experimental.separation.engine_workers",
        )
        if name in sys.modules and getattr(sys.modules[name], "device_name", "cpu") != PLATFORM_NAME
    ]
    if stale:
        raise CPUPlatformError(
            f"verl modules {stale} were imported before the CPU platform was selected and cached another "
            f"device name; start the process with {ENV_PLATFORM}=cpu {ENV_ENGINE_DEVICE}=cuda in its environment"
        )
    return platform_manager._current_platform


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


class _FlushTolerantLogger(logging.LoggerAdapter):
    """A module logger that drops the ``print``-style ``flush=`` keyword ``logging`` does not accept."""

    def process(self, msg, kwargs):
        kwargs.pop("flush", None)
        return msg, kwargs


def install_separate_async_log_fix() -> bool:
    """On the CPU, let verl 0.9.1's ``separate_async`` trainer start with ``hybrid_engine=false``.

    verl 0.9.1, ``verl/trainer/ppo/v1/trainer_separate_async.py:181`` (``_setup``, branch
    ``hybrid_engine=false``) calls ``logger.info(..., flush=True)``; ``logging.Logger`` rejects the
    keyword (``TypeError: Logger._log() got an unexpected keyword argument 'flush'``) and the trainer dies
    at start-up. Only when ``VERL_PLATFORM=cpu``, this wraps that module's ``logger`` in an adapter that
    drops the keyword (same logger, same level and handlers). Run right after verl imports the module
    (``verl_offpolicy.glue.registration.DEFERRED_REGISTRATIONS``). Returns True if installed.
    """
    if not cpu_selected():
        return False
    import verl.trainer.ppo.v1.trainer_separate_async as separate_async

    if not isinstance(separate_async.logger, _FlushTolerantLogger):
        separate_async.logger = _FlushTolerantLogger(separate_async.logger, {})
    return True
