"""Everything the scheduler keeps in TransferQueue, through one small interface: the prompts' tags (the FIFO and
its resume state: each prompt's step, version and anchor) and the trajectories' fields it reads or rewrites.

verl's V1 trainer saves and restores TransferQueue with its checkpoints, so the FIFO in the tags survives a resume
without a file of ours. A verl without TransferQueue (verl's ``neo`` branch) would need this module ported: the
tags into a store that its checkpoints save, the fields into its batches (docs/cluster.md, verl versions).
"""

from __future__ import annotations

from typing import Any, Sequence

import transfer_queue as tq
from transfer_queue import KVBatchMeta

TRAIN = "train"  # verl's partition of the training prompts and their trajectories


def tag(keys: Sequence[str], tags: Sequence[dict[str, Any]], partition: str = TRAIN) -> None:
    """Set (merge) the tags of ``keys``."""
    tq.kv_batch_put(keys=list(keys), partition_id=partition, tags=list(tags))


def tags(partition: str = TRAIN) -> dict[str, dict[str, Any]]:
    """Every key of ``partition`` with its tags."""
    return (tq.kv_list(partition) or {}).get(partition, {})


def read(keys: Sequence[str], fields: Sequence[str], partition: str = TRAIN) -> Any:
    """The ``fields`` of ``keys`` (a TensorDict)."""
    return tq.kv_batch_get(keys=list(keys), partition_id=partition, select_fields=list(fields))


def write(keys: Sequence[str], fields: Any, partition: str = TRAIN) -> None:
    """Write ``fields`` (a TensorDict) for ``keys``."""
    tq.kv_batch_put(keys=list(keys), partition_id=partition, fields=fields)


def clear(keys: Sequence[str], partition: str = TRAIN) -> None:
    tq.kv_clear(keys=list(keys), partition_id=partition)


def batch(keys: Sequence[str], batch_tags: Sequence[dict[str, Any]], partition: str = TRAIN) -> KVBatchMeta:
    """verl's handle of a batch of ``keys`` (what its trainer's steps take)."""
    return KVBatchMeta(partition_id=partition, keys=list(keys), tags=list(batch_tags))


__all__ = ["KVBatchMeta", "TRAIN", "batch", "clear", "read", "tag", "tags", "write"]
