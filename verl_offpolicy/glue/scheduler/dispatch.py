"""Handing batches to verl's agent loop without waiting: the overlapped mode's dispatch.

verl's ``AgentLoopManagerTQ.generate_sequences`` returns once every agent-loop worker has taken its part of the
batch (a ``ray.get`` on the workers' ``generate_sequences``, which build each prompt's arguments and start its
tasks); the samples then arrive through TransferQueue. A worker busy with the batches already in flight takes
a while to do so, and the trainer waited for it at the step that submits a version (~0.3 s per batch on the CPU
path: benchmarks/results/overlap.md, per-step "rest"). :class:`BackgroundDispatch` makes that call on a thread of
its own, one batch after the other in the order submitted; everything else is verl's manager's. A dispatch that
failed is raised in the trainer at its next submission or wait (:meth:`raise_failures`), not lost.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any


class BackgroundDispatch:
    """verl's agent-loop manager whose ``generate_sequences`` returns at once (one thread dispatches, in order)."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="offpolicy-dispatch")
        self._pending: list[Future] = []

    def generate_sequences(self, batch: Any) -> None:
        self.raise_failures()
        self._pending.append(self._pool.submit(self._manager.generate_sequences, batch))

    def raise_failures(self) -> None:
        """Raise the error of a finished dispatch, if one failed; forget the finished ones."""
        pending = []
        for future in self._pending:
            if future.done():
                future.result()
            else:
                pending.append(future)
        self._pending = pending

    def drain(self, timeout_s: float) -> None:
        """Block until every dispatch has been taken by the workers (raising a failure); a hang becomes an error."""
        _, not_done = wait(self._pending, timeout=timeout_s)
        if not_done:
            raise RuntimeError(
                f"offpolicy scheduler: {len(not_done)} batch(es) not taken by verl's agent-loop workers within "
                f"{timeout_s:.0f} s (AgentLoopManagerTQ.generate_sequences); see the agent-loop worker logs"
            )
        self.raise_failures()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)
