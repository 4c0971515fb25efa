"""The CPU platform and the hf rollout are in verl's registries, cheaply and only where asked for."""

import json
import subprocess
import sys

import pytest

from verl_offpolicy.cpu.platform import CPU_ENV
from verl_offpolicy.glue.registration import expected_names

TIMEOUT = 240


def _python(code: str, cpu: bool) -> dict:
    import os

    env = dict(os.environ)
    for key in CPU_ENV:
        env.pop(key, None)
    if cpu:
        env.update(CPU_ENV)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_private_rollout_registry_has_hf_adapter():
    """verl registers adapters only in the private dict base._ROLLOUT_REGISTRY: fail loudly if it moves."""
    from verl.workers.rollout import base
    from verl.workers.rollout.base import BaseRollout, get_rollout_class

    assert base._ROLLOUT_REGISTRY[("hf", "async")] == "verl_offpolicy.cpu.rollout.HFServerAdapter"
    adapter = get_rollout_class("hf", "async")
    assert issubclass(adapter, BaseRollout)
    assert adapter.__name__ == "HFServerAdapter"
    # The same private dict still holds verl's own backends (the contract we rely on).
    assert ("vllm", "async") in base._ROLLOUT_REGISTRY


def test_public_replica_registry_has_hf_replica():
    from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, get_rollout_replica_class

    replica = get_rollout_replica_class("hf")
    assert issubclass(replica, RolloutReplica)
    assert replica is RolloutReplicaRegistry.get("hf")
    assert replica.__name__ == "HFReplica"


def test_cpu_platform_registered_and_expected_names_resolve():
    from verl.plugin.platform import PlatformBase, PlatformRegistry

    platform_cls = PlatformRegistry.get("cpu")
    assert platform_cls is not None and issubclass(platform_cls, PlatformBase)
    ours = {(e.kind, e.name): e for e in expected_names() if e.kind in ("platform", "rollout")}
    assert set(ours) == {("platform", "cpu"), ("rollout", "hf")}
    assert all(e.lookup(e.name) for e in ours.values())


@pytest.mark.slow  # a fresh process imports verl
def test_gpu_processes_are_untouched():
    """Without VERL_PLATFORM=cpu: no CPU platform, verl's own process-group default, no rollout import,
    verl's checkpoint engines only (our CPU transport is imported only through custom_backend_module) and
    verl's separate_async logger untouched."""
    report = _python(
        """
import json, sys, verl
from verl_offpolicy.glue.patching import is_patched
from verl.plugin.platform import get_platform
import verl.utils.distributed as d
import verl.trainer.ppo.v1.trainer_separate_async as separate_async
from verl.checkpoint_engine import CheckpointEngineRegistry
print(json.dumps({
    "platform": get_platform().device_name,
    "gloo_wrapper": is_patched(d.initialize_global_process_group_ray),
    "hf_rollout_imported": any(
        m in sys.modules for m in ("verl_offpolicy.cpu.rollout", "verl_offpolicy.cpu.hf_server")
    ),
    "cpu_transport": "verl_offpolicy.cpu.checkpoint_engine" in sys.modules
    or "cpu_mailbox" in CheckpointEngineRegistry._registry,
    "separate_async_logger": type(separate_async.logger).__name__,
}))
""",
        cpu=False,
    )
    assert report == {
        "platform": "cuda",
        "gloo_wrapper": False,
        "hf_rollout_imported": False,
        "cpu_transport": False,
        "separate_async_logger": "Logger",
    }


@pytest.mark.slow  # a fresh process imports verl
def test_cpu_process_gets_platform_engine_and_gloo():
    from tests.cpu_harness import isolated

    facts = isolated("tests.scenario_platform:platform_facts", timeout=TIMEOUT)
    assert facts == {
        "device_name": "cpu",
        "ray_resource_name": "GPU",
        "current_device": "cpu",
        "backend": "gloo",
        "engine_class": "FSDPEngineWithLMHead",
        "max_memory_allocated_positive": True,
        "all_reduce": [1.0, 1.0],
        # torch's env:// store would listen on every interface; ours binds MASTER_ADDR=127.0.0.1.
        "store_listens": True,
        "listening_not_loopback": [],
    }


@pytest.mark.slow  # a fresh process imports verl
def test_rollout_registration_waits_for_verl_rollout_import():
    """`import verl` does not import verl's rollout package for us; importing it registers hf."""
    report = _python(
        """
import json, sys, verl
from verl_offpolicy.glue.patching import is_patched
from verl_offpolicy.cpu import registration
from verl_offpolicy.glue.registration import AfterImportHook
def pending():
    return any(isinstance(f, AfterImportHook) and f.module_name == "verl.workers.rollout" for f in sys.meta_path)
hook_pending = pending()
before = "verl.workers.rollout" in sys.modules
import verl.workers.rollout.base as base
print(json.dumps({"before": before, "hook_pending": hook_pending,
                  "registered": registration.rollout_registered(), "hook_left": pending()}))
""",
        cpu=False,
    )
    # `import verl` left verl's rollout package alone and our hook waiting for it ...
    assert report["before"] is False
    assert report["hook_pending"] is True
    # ... which registered hf when the package was imported, and removed itself.
    assert report["registered"] is True
    assert report["hook_left"] is False


def test_the_rollout_name_is_written_once_in_the_package():
    """``"hf"`` is HF_ROLLOUT of glue/registration.py; every other module imports it."""
    import ast
    from pathlib import Path

    import verl_offpolicy
    from verl_offpolicy.glue.registration import HF_ROLLOUT, ROLLOUTS

    root = Path(verl_offpolicy.__file__).parent
    written = [
        path.relative_to(root).as_posix()
        for path in sorted(root.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value == HF_ROLLOUT
    ]
    assert written == ["glue/registration.py"]
    assert ROLLOUTS == (HF_ROLLOUT,)


@pytest.mark.slow
def test_cpu_process_can_start_verls_separate_async():
    """verl 0.9.1's separate_async logs with ``flush=True`` (a TypeError in ``logging``) when
    hybrid_engine=false; in a CPU process the module's logger accepts and drops the keyword."""
    report = _python(
        """
import json, logging, verl
import verl.trainer.ppo.v1.trainer_separate_async as separate_async
plain_logger = logging.getLogger("plain")
plain_logger.setLevel(logging.INFO)  # as verl's module loggers are (VERL_LOGGING_LEVEL defaults to INFO)
separate_async.logger.setLevel(logging.INFO)
try:
    plain_logger.info("x", flush=True)
    plain = "accepted"
except TypeError:
    plain = "TypeError"
separate_async.logger.info("[V1SepAsync] hybrid replicas disabled", flush=True)
print(json.dumps({"plain_logger": plain, "separate_async_logger": type(separate_async.logger).__name__}))
""",
        cpu=True,
    )
    assert report == {"plain_logger": "TypeError", "separate_async_logger": "_FlushTolerantLogger"}


def test_a_one_process_group_listens_on_a_free_port_when_its_port_was_taken(monkeypatch):
    """verl picks MASTER_PORT, then the group's rank 0 binds it: another run starting beside this one can take it
    in between ("Address already in use", once). A group of one process needs no agreed port: its store takes a
    free one. A group of two needs the agreed port: the error stands."""
    import datetime
    import socket

    from verl_offpolicy.cpu.verl_shims import loopback_rendezvous_store

    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.delenv("DIST_INIT_METHOD", raising=False)
    try:
        store = loopback_rendezvous_store(0, 1, datetime.timedelta(seconds=30))
        store.set("key", "value")
        assert store.get("key") == b"value" and store.port != port
        with pytest.raises(OSError, match="Address already in use"):
            loopback_rendezvous_store(0, 2, datetime.timedelta(seconds=30))
    finally:
        taken.close()
