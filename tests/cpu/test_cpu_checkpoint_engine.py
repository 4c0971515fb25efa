"""The CPU weight transport (``cpu_mailbox``) through verl's own checkpoint-engine API, with a real Ray.

Two trainer ranks and two rollout ranks (engines created by verl's ``CheckpointEngineRegistry.new``,
driven the way ``CheckpointEngineManager.update_weights`` drives them: prepare, build_topology,
init_process_group, concurrent send/receive, finalize) in one fresh process with a loopback Ray.
"""

from __future__ import annotations

import pytest

from tests.actor_harness import run_isolated
from tests.cpu_harness import REPO_ROOT

TIMEOUT = 300


def transport_roundtrip() -> dict:
    """Run in a fresh process: two syncs of a small state dict through the mailbox."""
    import asyncio
    import shutil
    import tempfile

    import ray
    import torch
    import verl  # noqa: F401  (plugins first, as in a worker)
    from verl.checkpoint_engine.base import CheckpointEngineRegistry
    from verl.utils.import_utils import import_external_libs

    from verl_offpolicy.glue.registration import CPU_CHECKPOINT_BACKEND, CPU_CHECKPOINT_MODULE

    registered_before_import = CPU_CHECKPOINT_BACKEND in CheckpointEngineRegistry._registry
    import_external_libs(CPU_CHECKPOINT_MODULE)  # what verl does with checkpoint_engine.custom_backend_module
    from verl_offpolicy.cpu import checkpoint_engine as ce

    temp_dir = tempfile.mkdtemp(prefix="vo-ray-", dir="/tmp")
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp_dir, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        torch.manual_seed(0)
        state = {f"layer{i}.weight": torch.randn(64, 33) for i in range(5)}  # 8.4 kB each
        state["bias"] = torch.randn(7, dtype=torch.float64)

        def weights(scale):
            for name, tensor in state.items():
                yield name, tensor * scale

        results = {"registered_before_import": registered_before_import}

        async def one_sync(scale: float, bucket_bytes: int):
            actors = [
                CheckpointEngineRegistry.new(CPU_CHECKPOINT_BACKEND, bucket_size=bucket_bytes, is_master=r == 0)
                for r in range(2)
            ]
            rollouts = [
                CheckpointEngineRegistry.new(CPU_CHECKPOINT_BACKEND, bucket_size=bucket_bytes) for _ in range(2)
            ]
            metadata = [e.prepare() for e in actors + rollouts]
            actor_kw, rollout_kw = type(actors[0]).build_topology(2, 2, metadata)
            for i, e in enumerate(actors):
                e.init_process_group(**{k: v[i] for k, v in actor_kw.items()})
            for i, e in enumerate(rollouts):
                e.init_process_group(**{k: v[i] for k, v in rollout_kw.items()})

            async def receive(engine):
                return [(n, t) async for n, t in engine.receive_weights(global_steps=3)]

            # Receivers first: they must wait for the post rather than find nothing.
            received = asyncio.gather(*[receive(e) for e in rollouts])
            await asyncio.sleep(0.2)
            sent = await asyncio.gather(*[e.send_weights(weights(scale), global_steps=3) for e in actors])
            got = await received
            for e in actors + rollouts:
                e.finalize()
            return sent, got

        sent, got = asyncio.run(one_sync(1.0, 10_000))  # one tensor per bucket
        results["sync1_names"] = [[n for n, _ in g] for g in got]
        results["sync1_exact"] = all(torch.equal(t, state[n]) and t.dtype == state[n].dtype for g in got for n, t in g)
        results["sender_metrics"] = sent[0]
        results["non_master_metrics"] = sent[1]
        sent, got = asyncio.run(one_sync(2.0, 1 << 20))  # one bucket; a second sync reuses the mailbox
        results["sync2_exact"] = all(torch.equal(t, state[n] * 2.0) for g in got for n, t in g)
        results["sync2_counts"] = [len(g) for g in got]
        mailbox = ray.get_actor(ce.MAILBOX_NAME)
        results["pending_after"] = ray.get(mailbox.pending.remote(), timeout=60)
        results["expected_names"] = list(state)
        # A receiver without a sender fails with a message, never hangs.
        lonely = CheckpointEngineRegistry.new(CPU_CHECKPOINT_BACKEND, bucket_size=1)
        lonely.init_process_group(sync_id="never-posted", readers=1)
        ce.RECEIVE_TIMEOUT_S = 1.0

        async def wait_alone():
            return [x async for x in lonely.receive_weights()]

        try:
            asyncio.run(wait_alone())
            results["timeout_error"] = None
        except Exception as exc:  # noqa: BLE001 - the message is the claim
            results["timeout_error"] = str(exc)
        return results
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.e2e
def test_mailbox_transport_moves_every_tensor_exactly_and_fails_loudly_without_sender():
    import os

    cwd = os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        r = run_isolated("tests.cpu.test_cpu_checkpoint_engine:transport_roundtrip", timeout=TIMEOUT)
    finally:
        os.chdir(cwd)
    # Only importing custom_backend_module registers the backend (GPU runs never import it).
    assert r["registered_before_import"] is False
    assert r["sync1_names"] == [r["expected_names"]] * 2  # both rollout ranks, every tensor, in order
    assert r["sync1_exact"] and r["sync2_exact"]
    assert r["sync2_counts"] == [6, 6]
    assert r["sender_metrics"]["offpolicy/weight_sync/tensors"] == 6.0
    assert r["non_master_metrics"] == {}  # only rank 0 posts
    assert r["pending_after"] == 0  # the last reader removed each post
    assert "no weights were posted for sync never-posted" in r["timeout_error"]
