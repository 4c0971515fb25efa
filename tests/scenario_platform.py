"""Facts of the CPU platform, gathered in a fresh process (``isolated("tests.scenario_platform:<function>")``,
with or without ``VERL_PLATFORM=cpu``); their results are JSON."""

from __future__ import annotations

from typing import Any


def platform_facts() -> dict[str, Any]:
    """What a VERL_PLATFORM=cpu process sees: platform, engine class, process group and where it listens."""
    import psutil
    import torch
    import torch.distributed as dist
    from verl.plugin.platform import get_platform
    from verl.utils import distributed
    from verl.workers.engine import EngineRegistry

    from tests.actor_harness import init_single_process_env
    from verl_offpolicy.cpu.platform import is_loopback

    init_single_process_env()  # MASTER_ADDR=127.0.0.1
    distributed.initialize_global_process_group_ray(timeout_second=60)
    backend = dist.get_backend()
    tensor = torch.ones(2)
    dist.all_reduce(tensor)
    listening = [
        f"{c.laddr.ip}:{c.laddr.port}"
        for c in psutil.Process().net_connections("tcp")
        if c.status == psutil.CONN_LISTEN
    ]
    dist.destroy_process_group()
    platform = get_platform()
    module = platform.device_module
    return {
        "device_name": platform.device_name,
        "ray_resource_name": platform.ray_resource_name(),
        "current_device": str(platform.current_device()),
        "backend": str(backend),
        "engine_class": EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__,
        "max_memory_allocated_positive": module.max_memory_allocated() > 0,
        "all_reduce": tensor.tolist(),
        "store_listens": bool(listening),
        "listening_not_loopback": [a for a in listening if not is_loopback(a)],
    }


def adapter_outside_cpu_platform() -> str:
    """The hf adapter's error in a process without VERL_PLATFORM=cpu (run with it removed)."""
    from verl_offpolicy.cpu.platform import require_cpu_platform

    try:
        require_cpu_platform("rollout name=hf")
    except RuntimeError as exc:
        return str(exc)
    return "no error"
