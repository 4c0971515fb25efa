"""Reproducible single-turn agent loops for the CPU path: ``seeded_single_turn_agent`` and ``ordered_single_turn_agent``.

``seeded_single_turn_agent`` (the CPU overlay's default): verl's single-turn agent loop plus a sampling seed
per sample, derived from the dataset row (``index``) and the sample's session id within its group. The
``hf`` rollout seeds each request's sampler from it (and the weights version), so a CPU run is reproducible
at a fixed seed whatever the order in which the agent loop's concurrent requests reach the server, and two
rows with the same prompt still get different samples.

A prompt's ``priority`` (verl's agent-loop argument; the overlapped scheduler sets it to the step the
batch is trained at) reaches the ``hf`` server in ``sampling_params["priority"]``: verl's client forwards
``priority`` to vLLM only, and the hf server generates the lowest priority first.

``ordered_single_turn_agent`` (the standalone overlay's, ``+cpu_rollout=standalone``): the same samples, but a
sample starts only when no sample of a lower priority is running in its agent-loop worker. The overlapped
scheduler submits a version's batches at once; ordering the server alone (above) still leaves the agent
loop's own per-sample work (chat template, tokenizing, the reward, TransferQueue writes) of all of them
interleaved, and on a CPU that work is most of a batch's generation time: B_t arrived with most of its
version. One priority at a time, B_t is ready about when its own samples are (a sample's reward and
TransferQueue write follow its ``run`` and overlap the next priority's start).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import Counter
from typing import Any, AsyncIterator

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from verl_offpolicy.glue.registration import HF_ROLLOUT, ORDERED_AGENT_LOOP, SEEDED_AGENT_LOOP

_ROW_STRIDE = 1_000_003  # > any group size: (row, session) -> distinct seeds


@register(SEEDED_AGENT_LOOP)
class SeededSingleTurnAgentLoop(SingleTurnAgentLoop):
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        if "seed" not in sampling_params and kwargs.get("index") is not None:
            seed = int(kwargs["index"]) * _ROW_STRIDE + int(kwargs.get("session_id", 0))
            sampling_params = {**sampling_params, "seed": seed}
        priority = int(kwargs.get("priority", 0) or 0)
        if priority and self.rollout_config.name == HF_ROLLOUT:
            sampling_params = {**sampling_params, "priority": priority}
        return await super().run(sampling_params, **kwargs)


class PriorityGate:
    """Admits a sample once no sample of a lower priority is running (higher ones never hold a lower one back)."""

    def __init__(self) -> None:
        self.running: Counter[int] = Counter()
        self.changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def turn(self, priority: int) -> AsyncIterator[None]:
        async with self.changed:
            await self.changed.wait_for(lambda: not any(p < priority for p, n in self.running.items() if n))
            self.running[priority] += 1
        try:
            yield
        finally:
            async with self.changed:
                self.running[priority] -= 1
                self.changed.notify_all()


_gates: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # event loop -> its gate (an agent-loop worker runs one loop)


@register(ORDERED_AGENT_LOOP)
class OrderedSingleTurnAgentLoop(SeededSingleTurnAgentLoop):
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        gate = _gates.setdefault(asyncio.get_running_loop(), PriorityGate())
        async with gate.turn(int(kwargs.get("priority", 0) or 0)):
            return await super().run(sampling_params, **kwargs)
