"""Rollout backend ``hf`` (trainer side): the replica that launches the server, and the in-worker adapter.

verl's rollouts are async servers reached through three pieces (as ``verl.workers.rollout.vllm_rollout``):

- :class:`~verl_offpolicy.cpu.hf_server.HFRolloutServer` (a Ray actor, :mod:`.hf_server`): generation.
- :class:`HFReplica` (``RolloutReplicaRegistry`` name ``hf``): launches the server, next to the hybrid
  actor worker (``hybrid_engine=true``) or next to the replica's own ``CheckpointEngineWorker`` on a
  resource pool of its own (``hybrid_engine=false``: verl's standalone mode).
- :class:`HFServerAdapter` (``_ROLLOUT_REGISTRY[("hf", "async")]``): receives the trainer's weights and
  forwards them to the server, inside each hybrid actor worker (colocated ``update_weights`` flow) or
  inside the standalone ``CheckpointEngineWorker`` (fed by a checkpoint engine, e.g.
  :mod:`verl_offpolicy.cpu.checkpoint_engine`).

Registration (cheap, no import of this module) is in :mod:`verl_offpolicy.cpu.registration`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Optional

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutMode, RolloutReplica
from verl.workers.rollout.utils import ensure_async_iterator

from verl_offpolicy.cpu.hf_options import HFRolloutError
from verl_offpolicy.cpu.hf_server import HFRolloutServer, check_rollout_parallelism, server_actor_name
from verl_offpolicy.cpu.platform import require_cpu_platform
from verl_offpolicy.glue.registration import HF_ROLLOUT

logger = logging.getLogger("verl_offpolicy.cpu.rollout")
logger.setLevel(os.getenv("VERL_OFFPOLICY_LOGGING_LEVEL", "INFO"))

# Seconds a replica waits for its server actor to be scheduled and to load the model.
LAUNCH_TIMEOUT_S = float(os.environ.get("VERL_OFFPOLICY_HF_LAUNCH_TIMEOUT", "300"))


# ----------------------------------------------------------------------------------------------
# Replica (trainer side)
# ----------------------------------------------------------------------------------------------


class HFReplica(RolloutReplica):
    """Rollout replica of the hf backend: one :class:`HFRolloutServer` next to its one worker.

    The worker is the hybrid actor worker (``RolloutMode.HYBRID``, ``hybrid_engine=true``) or, in
    verl's standalone mode (``RolloutMode.STANDALONE``, ``hybrid_engine=false``, the rollout on a
    resource pool of its own), the replica's ``CheckpointEngineWorker``, whose adapter receives the
    weights from a checkpoint engine.
    """

    SUPPORTED_MODES = (RolloutMode.HYBRID, RolloutMode.STANDALONE)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        check_rollout_parallelism(self.config)

    async def launch_servers(self):
        require_cpu_platform(f"rollout name={HF_ROLLOUT}")
        if self.rollout_mode not in self.SUPPORTED_MODES or self.is_reward_model or self.is_teacher_model:
            raise HFRolloutError(
                f"rollout name={HF_ROLLOUT} serves the policy only, colocated (actor_rollout_ref.hybrid_engine=true) "
                f"or on its own resource pool (hybrid_engine=false); got mode={self.rollout_mode}, "
                f"reward_model={self.is_reward_model}, teacher={self.is_teacher_model}"
            )
        if len(self.workers) != 1:
            raise HFRolloutError(f"hf replica {self.replica_rank} expects 1 worker, got {len(self.workers)}")
        from verl.plugin.platform import get_platform

        node_id = await self.workers[0].__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
        name = server_actor_name(self.replica_rank, 0, self.name_suffix)
        server = (
            ray.remote(HFRolloutServer)
            .options(
                scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                    node_id=node_id, soft=False
                ),
                runtime_env={"env_vars": get_platform().rollout_env_vars()},
                name=name,
                num_cpus=0,
                max_concurrency=self.max_concurrency,
            )
            .remote(
                config=self.config,
                model_config=self.model_config,
                rollout_mode=self.rollout_mode,
                replica_rank=self.replica_rank,
                node_rank=0,
            )
        )
        start = time.monotonic()
        try:
            info = await asyncio.wait_for(server.ready.remote(), timeout=LAUNCH_TIMEOUT_S)
        except asyncio.TimeoutError:
            ray.kill(server, no_restart=True)
            raise HFRolloutError(
                f"hf rollout server {name} was not ready after {LAUNCH_TIMEOUT_S:.0f}s (not scheduled or the "
                "model did not load); check Ray's free CPUs (ray_kwargs.ray_init.num_cpus) and the worker logs, "
                "or raise VERL_OFFPOLICY_HF_LAUNCH_TIMEOUT"
            ) from None
        logger.info("hf rollout server %s up in %.1fs: %s", name, time.monotonic() - start, info)
        self.servers = [server]
        self._server_handle = server
        # No HTTP endpoint: the address only identifies the server in verl's load balancer.
        self._server_address = f"{HF_ROLLOUT}-rollout-replica-{self.replica_rank}{self.name_suffix}"


# ----------------------------------------------------------------------------------------------
# Adapter (in each hybrid actor worker)
# ----------------------------------------------------------------------------------------------


class HFServerAdapter(BaseRollout):
    """Client of the replica's server inside its worker (hybrid actor worker or standalone
    ``CheckpointEngineWorker``): sleep/wake and weight updates."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1, **kwargs):
        super().__init__(config, model_config, device_mesh)
        require_cpu_platform(f"rollout name={HF_ROLLOUT}")
        check_rollout_parallelism(self.config)
        rank = int(os.environ.get("RANK", "0"))
        self.replica_rank = rank if replica_rank == -1 else replica_rank
        self.rollout_rank = 0
        self.is_leader_rank = True
        self._has_server = True
        self.server_handle = None
        self.bucket_bytes = max(1, int(self.config.checkpoint_engine.update_weights_bucket_megabytes)) << 20

    def _server(self):
        if self.server_handle is None:
            self.server_handle = ray.get_actor(server_actor_name(self.replica_rank))
        return self.server_handle

    async def resume(self, tags: list[str]):
        if self.config.free_cache_engine:
            await self._server().wake_up.remote(tags=tags)

    async def release(self):
        if self.config.free_cache_engine:
            await self._server().sleep.remote()

    @torch.no_grad()
    async def update_weights(
        self,
        weights,
        global_steps: Optional[int] = None,
        wire_format: str = "named_tensors",
        peft_config=None,
        **kwargs,
    ):
        """Send the trainer's (HF name, full tensor) stream to the server in buckets.

        The generator is drained completely (its ``full_tensor()`` calls are collectives).
        """
        if wire_format != "named_tensors":
            raise HFRolloutError(
                f"rollout name={HF_ROLLOUT} receives full tensors only (wire_format='named_tensors'), got "
                f"{wire_format!r}; use actor_rollout_ref.rollout.checkpoint_engine.backend=naive"
            )
        if peft_config is not None:
            raise HFRolloutError(
                f"rollout name={HF_ROLLOUT} cannot load LoRA adapters; set actor_rollout_ref.model.lora.merge=true "
                "or train without LoRA"
            )
        start = time.monotonic()
        server = self._server()
        bucket: list[tuple[str, torch.Tensor]] = []
        size = count = 0
        async for name, tensor in ensure_async_iterator(weights):
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
            tensor = tensor.detach().to("cpu").contiguous().clone()
            bucket.append((name, tensor))
            size += tensor.nbytes
            count += 1
            if size >= self.bucket_bytes:
                await server.update_weights_chunk.remote(bucket)
                bucket, size = [], 0
        if bucket:
            await server.update_weights_chunk.remote(bucket)
        await server.finish_weight_update.remote(global_steps)
        logger.info(
            "hf rollout: synced %d tensors to replica %d (global_steps=%s) in %.2fs",
            count,
            self.replica_rank,
            global_steps,
            time.monotonic() - start,
        )

    def generate_sequences(self, prompts):
        raise NotImplementedError(f"rollout name={HF_ROLLOUT} serves the async agent loop only")
