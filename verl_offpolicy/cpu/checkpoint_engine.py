"""A CPU weight transport for verl's checkpoint-engine API that opens no port: Ray's object store.

verl moves the trainer's weights to a rollout on its own resource pool
(``actor_rollout_ref.hybrid_engine=false``) through a checkpoint engine
(``verl.checkpoint_engine.base.CheckpointEngine``): each sync, ``CheckpointEngineManager.update_weights``
calls ``prepare()`` on every actor and rollout worker, ``build_topology(...)`` once in the driver,
``init_process_group(**kw)`` on every worker, then ``send_weights`` on all actor ranks and
``receive_weights`` on all rollout ranks concurrently, then ``finalize()``. verl's backends (nccl,
nixl, ...) need CUDA; this one is for the CPU path only, selected with::

    actor_rollout_ref.rollout.checkpoint_engine.backend=cpu_mailbox
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=verl_offpolicy.cpu.checkpoint_engine

(verl imports ``custom_backend_module`` in the driver, every actor worker and every rollout
``CheckpointEngineWorker`` before it looks the backend up; GPU runs never import this module.)

Design (a mailbox, no sockets of its own): ``build_topology`` makes a fresh sync id and finds or
creates one long-lived named Ray actor, :class:`WeightMailbox` (one per Ray job, created once: a new
actor per sync would cost ~1.4 s). Every actor rank drains its weight generator (it runs the FSDP
collectives that gather full tensors); rank 0 ``ray.put``s the tensors in buckets of
``update_weights_bucket_megabytes`` and posts the list of object refs under the sync id (nested in a
list, so Ray hands the refs over without resolving them). Each rollout rank waits for that post, then
fetches the buckets from the object store and yields ``(name, tensor)``. The post is removed once every
rollout rank has taken it. Ray's own processes are the only listeners (loopback in the CPU demo).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any, AsyncGenerator

import ray
import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

from verl_offpolicy.glue.registration import CPU_CHECKPOINT_BACKEND
from verl_offpolicy.glue.scheduler import audit

MAILBOX_NAME = "verl_offpolicy_weight_mailbox"
# Seconds a rollout rank waits for the trainer's weights of one sync before failing the run.
RECEIVE_TIMEOUT_S = float(os.environ.get("VERL_OFFPOLICY_WEIGHT_SYNC_TIMEOUT", "600"))


class WeightTransportError(RuntimeError):
    """A weight sync through the mailbox could not complete; the message says why and what to change."""


class WeightMailbox:
    """Ray actor holding, per sync id, the object refs of the weight buckets until every reader took them."""

    def __init__(self):
        self._posts: dict[str, tuple[list, int]] = {}
        self._events: dict[str, asyncio.Event] = {}

    def _event(self, sync_id: str) -> asyncio.Event:
        return self._events.setdefault(sync_id, asyncio.Event())

    async def post(self, sync_id: str, boxed_refs: list, readers: int) -> int:
        """Store ``boxed_refs`` (``[[ref, ...]]``) for ``readers`` rollout ranks; returns the bucket count."""
        self._posts[sync_id] = (boxed_refs[0], readers)
        self._event(sync_id).set()
        return len(boxed_refs[0])

    async def take(self, sync_id: str, timeout_s: float) -> list:
        """Wait for the post of ``sync_id`` and return ``[[ref, ...]]``; the last reader removes it."""
        try:
            await asyncio.wait_for(self._event(sync_id).wait(), timeout=timeout_s)
        except asyncio.TimeoutError:
            raise WeightTransportError(
                f"no weights were posted for sync {sync_id} within {timeout_s:.0f}s: the trainer's rank 0 did not "
                "send (see the actor worker log), or the machine is too busy; raise VERL_OFFPOLICY_WEIGHT_SYNC_TIMEOUT"
            ) from None
        refs, readers = self._posts[sync_id]
        if readers <= 1:
            del self._posts[sync_id]
            del self._events[sync_id]
        else:
            self._posts[sync_id] = (refs, readers - 1)
        return [refs]

    async def pending(self) -> int:
        """Posts not yet taken by all their readers (0 between syncs)."""
        return len(self._posts)


_mailbox = None  # this process's handle: Ray ends a non-detached actor once no handle to it is left


def get_mailbox():
    """The job's mailbox actor (created on first use, reused by every later sync); the handle is kept."""
    global _mailbox
    if _mailbox is None:
        _mailbox = (
            ray.remote(WeightMailbox)
            .options(name=MAILBOX_NAME, get_if_exists=True, num_cpus=0, max_concurrency=64)
            .remote()
        )
    return _mailbox


def to_full_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor on the CPU (``full_tensor()`` of a DTensor is a collective: every rank calls it)."""
    if hasattr(tensor, "full_tensor"):
        tensor = tensor.full_tensor()
    return tensor.detach().to("cpu").contiguous()


@CheckpointEngineRegistry.register(CPU_CHECKPOINT_BACKEND)
class MailboxCheckpointEngine(CheckpointEngine):
    """Checkpoint engine of the CPU path: weights go through Ray's object store and a mailbox actor.

    Args:
        bucket_size: bytes per ``ray.put`` bucket (``update_weights_bucket_megabytes`` << 20).
        is_master: set by verl on actor ranks: rank 0 of the trainer is the only sender.
    """

    def __init__(self, bucket_size: int, is_master: bool = False, **kwargs: Any) -> None:
        if kwargs:
            raise WeightTransportError(
                f"checkpoint_engine.backend={CPU_CHECKPOINT_BACKEND} takes no engine_kwargs, got {sorted(kwargs)}; "
                f"remove actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.{CPU_CHECKPOINT_BACKEND}"
            )
        self.bucket_size = max(1, int(bucket_size))
        self.is_master = is_master
        self.sync_id: str | None = None
        self.readers = 0
        self.last_send: dict[str, float] = {}

    def prepare(self) -> dict[str, Any]:
        return {"pid": os.getpid()}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
        """One fresh sync id for every worker; rank 0 of the trainer posts for ``rollout_world_size`` readers."""
        get_mailbox()  # created here, in the driver, once: workers only look it up
        sync_id = uuid.uuid4().hex
        actor = {
            "sync_id": [sync_id] * actor_wg_world_size,
            "readers": [rollout_world_size] * actor_wg_world_size,
        }
        rollout = {"sync_id": [sync_id] * rollout_world_size, "readers": [rollout_world_size] * rollout_world_size}
        return actor, rollout

    def init_process_group(self, sync_id: str, readers: int) -> None:
        self.sync_id = sync_id
        self.readers = readers

    def finalize(self) -> None:
        self.sync_id = None

    def _require_sync(self) -> str:
        if self.sync_id is None:
            raise WeightTransportError(
                f"checkpoint_engine.backend={CPU_CHECKPOINT_BACKEND}: send/receive before init_process_group "
                "(verl's CheckpointEngineManager calls build_topology and init_process_group first)"
            )
        return self.sync_id

    async def send_weights(self, weights, global_steps: int | None = None) -> dict[str, float]:
        """Drain ``weights`` on every rank; rank 0 puts the buckets into the object store and posts them."""
        sync_id = self._require_sync()
        start = time.perf_counter()
        refs, bucket, size, count, nbytes = [], [], 0, 0, 0
        async for name, tensor in ensure_async_iterator(weights):
            tensor = to_full_cpu(tensor)
            if not self.is_master:
                continue
            bucket.append((name, tensor.clone()))
            size += tensor.nbytes
            count += 1
            nbytes += tensor.nbytes
            if size >= self.bucket_size:
                refs.append(ray.put(bucket))
                bucket, size = [], 0
        if not self.is_master:
            return {}
        if bucket:
            refs.append(ray.put(bucket))
        folder = audit.audit_dir()
        if folder is not None and global_steps is not None:  # the audit hook (off unless its variable is set)
            sent = {name: t for ref in refs for name, t in ray.get(ref)}
            audit.save(audit.weights_path(folder, global_steps), sent)
        await get_mailbox().post.remote(sync_id, [refs], self.readers)
        self.last_send = {
            "offpolicy/weight_sync/tensors": float(count),
            "offpolicy/weight_sync/megabytes": nbytes / 2**20,
            "offpolicy/weight_sync/send_s": time.perf_counter() - start,
        }
        return dict(self.last_send)

    async def receive_weights(self, global_steps: int | None = None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        """Wait for rank 0's post of this sync and yield its ``(name, tensor)`` pairs in order."""
        sync_id = self._require_sync()
        boxed = await get_mailbox().take.remote(sync_id, RECEIVE_TIMEOUT_S)
        for ref in boxed[0]:
            for name, tensor in await ref:
                yield name, tensor
