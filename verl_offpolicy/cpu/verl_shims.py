"""What the CPU path changes in verl's own modules, each change one function, each installed once per process.

verl 0.9.1 assumes an accelerator in a few places; in a CPU process (``VERL_PLATFORM=cpu``, never on a GPU
run) these functions rebind one name of verl's each, through :func:`verl_offpolicy.glue.patching.patch_once`
(so a second call, from another hook, leaves the first in place). Each names verl's file:line it works around,
and the patch against verl that would make it unnecessary, in ``upstream/``. They run from our registration
hooks (``verl_offpolicy.glue.registration``: ``DEFERRED_REGISTRATIONS``, right after verl imports the module
they change) or from :func:`activate_cpu_platform` (tests, the harness, the Hydra driver):

- :func:`install_gloo_default`: verl's process-group backend string on the CPU;
- :func:`install_unpinned_offload`: the reference model's CPU offload without pinned memory;
- :func:`install_exact_merged_lora`: merged LoRA weights sent to the rollout in their own dtype;
- :func:`install_seeded_lora_init`: LoRA adapters initialised from a fixed seed;
- :func:`install_separate_async_log_fix`: ``separate_async``'s ``logger.info(..., flush=True)``;
- :func:`activate_cpu_platform`: verl's platform singleton switched to the CPU platform.

The Megatron engine's shims are :mod:`verl_offpolicy.cpu.megatron`, vLLM's :mod:`verl_offpolicy.cpu.vllm_shims`.
"""

from __future__ import annotations

import datetime
import errno
import functools
import logging
import os
import socket

from verl_offpolicy.cpu.platform import (
    CPU_ENV,
    ENV_ENGINE_DEVICE,
    ENV_PLATFORM,
    PLATFORM_NAME,
    CPUPlatform,
    CPUPlatformError,
    cpu_selected,
    is_loopback_host,
)
from verl_offpolicy.glue.patching import patch_once

logger = logging.getLogger("verl_offpolicy")


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
    if not patch_once(dist_utils, "initialize_global_process_group_ray", _gloo_default):
        return True
    # Modules that imported the function by name before we ran (normally none).
    import sys

    for module_name in ("verl.workers.engine_workers", "verl.checkpoint_engine.base"):
        module = sys.modules.get(module_name)
        if module is not None and getattr(module, "initialize_global_process_group_ray", None) is original:
            module.initialize_global_process_group_ray = dist_utils.initialize_global_process_group_ray
    return True


def _gloo_default(original):
    """verl's ``initialize_global_process_group_ray`` with ``gloo`` as the default backend, on a loopback store."""

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
        torch.distributed.init_process_group(
            backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout
        )

    return initialize_global_process_group_ray


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

    def unpinned(policy):
        class UnpinnedCPUOffloadPolicy(policy):
            def __init__(self, pin_memory: bool = False):
                super().__init__(pin_memory=False)

        return UnpinnedCPUOffloadPolicy

    patch_once(fsdp_engine, "CPUOffloadPolicy", unpinned)
    return True


def install_exact_merged_lora() -> bool:
    """On the CPU, send merged LoRA weights (``actor_rollout_ref.model.lora.merge=true``) in their own dtype.

    verl 0.9.1's ``FSDPEngine._merged_lora_per_tensor_param`` casts every merged (sharded) weight to bf16 on its
    way to the rollout (``transformer_impl.py:1082``), so an fp32 rollout generates with bf16-rounded weights:
    measured on the tiny model, the rollout/trainer probability gap at the first step is 3.4e-3 against 3.6e-7
    for full-parameter training. Only when ``VERL_PLATFORM=cpu``, this replaces the method by one that sends the
    same merged tensors (the adapters merged while they are read, the base restored afterwards: verl's
    ``merged_lora_context``) without the cast. Run right after verl imports that module
    (``verl_offpolicy.glue.registration.DEFERRED_REGISTRATIONS``). Returns True if installed. The fix in verl:
    ``upstream/merged-lora-dtype.diff``.
    """
    if not cpu_selected():
        return False
    import verl.workers.engine.fsdp.transformer_impl as fsdp_engine

    def merged_in_own_dtype(self):
        try:
            with fsdp_engine.merged_lora_context(self.module, backup_adapters=True):
                model = getattr(self.module, "_fsdp_wrapped_module", self.module)
                params = fsdp_engine.convert_weight_keys(
                    fsdp_engine.normalize_peft_param_name(self.module.state_dict()), model
                )
                for name, param in params.items():  # copies, made while the adapters are merged
                    yield (
                        name,
                        param.full_tensor() if isinstance(param, fsdp_engine.DTensor) else param.detach().clone(),
                    )
        finally:
            if self._is_offload_param:
                fsdp_engine.offload_fsdp_model_to_cpu(self.module)

    patch_once(fsdp_engine.FSDPEngine, "_merged_lora_per_tensor_param", lambda _bf16_cast: merged_in_own_dtype)
    return True


LORA_INIT_SEED = 0


def install_seeded_lora_init() -> bool:
    """On the CPU, LoRA's adapter initialisation (PEFT draws A from the global torch RNG in ``get_peft_model``,
    called by verl's FSDP engine) from a fixed seed, :data:`LORA_INIT_SEED`, leaving the process's RNG as it was:
    otherwise the adapters depend on what the worker process drew before (the colocated and the overlapped mode's
    workers draw differently), and two runs of one configuration differ from their first gradient. Run right
    after verl imports its FSDP engine. Returns True if installed. The fix in verl: ``upstream/lora-init-seed.diff``."""
    if not cpu_selected():
        return False
    import torch
    import verl.workers.engine.fsdp.transformer_impl as fsdp_engine

    def seeded(build):
        @functools.wraps(build)
        def seeded_get_peft_model(*args, **kwargs):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(LORA_INIT_SEED)
                return build(*args, **kwargs)

        return seeded_get_peft_model

    patch_once(fsdp_engine, "get_peft_model", seeded)
    return True


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

    patch_once(separate_async, "logger", lambda original: _FlushTolerantLogger(original, {}))
    return True


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
