"""Reproducible agent loops for the CPU path: ``seeded_single_turn_agent``, ``ordered_single_turn_agent`` and the
multi-turn ``seeded_tool_agent`` (verl's tool agent loop, seeded; ordered on a standalone rollout).

``seeded_single_turn_agent`` (the CPU overlay's default): verl's single-turn agent loop plus a sampling seed
per sample, derived from the dataset row (``index``) and the sample's session id within its group. The
``hf`` rollout seeds each request's sampler from it (and the weights version), so a CPU run is reproducible
at a fixed seed whatever the order in which the agent loop's concurrent requests reach the server, and two
rows with the same prompt still get different samples.

A prompt's ``priority`` (verl's agent-loop argument; the overlapped scheduler sets it to the step the
batch is trained at) reaches the ``hf`` server in ``sampling_params["priority"]``: verl's client forwards
``priority`` to vLLM only, and the hf server generates the lowest priority first.

``ordered_single_turn_agent`` (the standalone overlay's, ``+cpu_rollout=standalone``): the same samples, but a
sample starts only when no sample of a lower priority is in flight in its agent-loop worker, and it stays in
flight until its task ends: verl's ``_run_agent_loop`` runs the agent loop, then the sample's reward and its
TransferQueue write. The overlapped scheduler submits a version's batches at once; ordering the server alone
(above) still leaves the agent loop's own per-sample work (chat template, tokenizing, the reward, TransferQueue
writes) of all of them interleaved, and on a CPU that work is most of a batch's generation time: B_t arrived
with most of its version. One priority at a time, B_t is finished about when it would be alone. Neither loop orders
on an ``hf`` server that batches continuously (``engine_kwargs.hf.continuous_batching``, :func:`hold_turn`).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import Counter, OrderedDict
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

import verl_offpolicy.cpu.tool_parser  # noqa: F401 - registers the word-level tool-call format beside the tool loop
from verl_offpolicy.cpu.hf_options import continuous_batching, hf_engine_kwargs
from verl_offpolicy.cpu.task import ROW_MAX_TOKENS_KEY
from verl_offpolicy.glue.registration import HF_ROLLOUT, ORDERED_AGENT_LOOP, SEEDED_AGENT_LOOP, SEEDED_TOOL_AGENT_LOOP

_ROW_STRIDE = 1_000_003  # > any group size: (row, session) -> distinct seeds
_COPIES_KEPT = 65_536
# id(a row's prompt object) -> (the object, copies of the row seen): verl's legacy agent loop (main_ppo_v0) passes no
# session id; its rollout.n copies of a row are consecutive and share the row's prompt object (numpy's repeat keeps
# references, pickling a chunk keeps them shared). The object is held so that its id is not reused meanwhile.
_copies: OrderedDict[int, tuple[Any, int]] = OrderedDict()


def copy_number(row_object: Any) -> int:
    """The how-manieth copy of its row ``row_object`` belongs to (0 for the first), in the order the agent loop
    starts them: the session id V1's agent loop passes (0..n-1), for verl's legacy agent loop."""
    key = id(row_object)
    seen = _copies.get(key)
    number = seen[1] if seen is not None and seen[0] is row_object else 0
    _copies[key] = (row_object, number + 1)
    _copies.move_to_end(key)
    while len(_copies) > _COPIES_KEPT:
        _copies.popitem(last=False)
    return number


def seeded(sampling_params: dict[str, Any], rollout_name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The sample's sampling parameters with its seed (from the row's ``index`` and the sample's copy number),
    its row's response cap as ``max_tokens`` when the row sets one (``extra_info``'s
    :data:`~verl_offpolicy.cpu.task.ROW_MAX_TOKENS_KEY`) and, on the ``hf`` rollout, verl's ``priority`` argument
    (module docstring)."""
    if "seed" not in sampling_params and kwargs.get("index") is not None:
        session = kwargs.get("session_id")
        if session is None:  # verl's legacy trainer: its agent loop numbers no copies
            session = copy_number(kwargs.get("raw_prompt"))
        sampling_params = {**sampling_params, "seed": int(kwargs["index"]) * _ROW_STRIDE + int(session)}
    cap = (kwargs.get("extra_info") or {}).get(ROW_MAX_TOKENS_KEY)
    if cap is not None and "max_tokens" not in sampling_params:
        sampling_params = {**sampling_params, "max_tokens": int(cap)}
    priority = int(kwargs.get("priority", 0) or 0)
    if priority and rollout_name == HF_ROLLOUT:
        sampling_params = {**sampling_params, "priority": priority}
    return sampling_params


@register(SEEDED_AGENT_LOOP)
class SeededSingleTurnAgentLoop(SingleTurnAgentLoop):
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        return await super().run(seeded(sampling_params, self.rollout_config.name, kwargs), **kwargs)


class PriorityGate:
    """Admits a sample once no sample of a lower priority is in flight (higher ones never hold a lower one back).

    A sample is in flight from :meth:`hold` until the task that called it ends, except while it is
    :meth:`away` (a tool call: it needs neither the server nor the worker's event loop, and higher priorities
    start meanwhile; it comes back on its turn). Waiting samples are woken only when a priority has nothing left
    in flight, the only change that can admit one.
    """

    def __init__(self) -> None:
        self.in_flight: Counter[int] = Counter()
        self._held: dict[asyncio.Task, int] = {}  # task -> the priority it holds (not while away)
        self._waiting: list[asyncio.Future] = []

    async def hold(self, priority: int) -> None:
        """Wait for the turn of ``priority``, then hold it until the current task ends (however it ends)."""
        await self._admit(priority)
        task = asyncio.current_task()
        self._held[task] = priority
        task.add_done_callback(self._task_done)

    @contextlib.asynccontextmanager
    async def away(self):
        """The body runs without the current task's turn (nothing if it holds none); the turn is taken back, on
        the same rule as :meth:`hold`, before the body's caller goes on."""
        task = asyncio.current_task()
        priority = self._held.pop(task, None)
        if priority is None:
            yield
            return
        self._release(priority)
        try:
            yield
        finally:
            await self._admit(priority)
            self._held[task] = priority

    async def _admit(self, priority: int) -> None:
        while any(p < priority for p in self.in_flight):
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            await waiter
        self.in_flight[priority] += 1

    def _task_done(self, task: asyncio.Task) -> None:
        priority = self._held.pop(task, None)
        if priority is not None:  # None: it ended away (cancelled while waiting for its turn back)
            self._release(priority)

    def _release(self, priority: int) -> None:
        self.in_flight[priority] -= 1
        if self.in_flight[priority]:
            return
        del self.in_flight[priority]
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            if not waiter.done():
                waiter.set_result(None)


_gates: weakref.WeakKeyDictionary = (
    weakref.WeakKeyDictionary()
)  # event loop -> its gate (an agent-loop worker runs one loop)


def _gate() -> PriorityGate:
    """The running agent-loop worker's gate."""
    return _gates.setdefault(asyncio.get_running_loop(), PriorityGate())


async def hold_turn(kwargs: dict[str, Any], rollout_config) -> None:
    """Wait until this worker's :class:`PriorityGate` admits the sample's ``priority``; it is held until verl's
    ``_run_agent_loop`` task (this sample: run, reward, TransferQueue write) ends. Not on an ``hf`` server that
    batches continuously (``engine_kwargs.hf.continuous_batching``): it admits by priority itself, as vLLM does, and
    a gate would hold the next batch's samples back from joining the running one."""
    if rollout_config.name == HF_ROLLOUT and continuous_batching(hf_engine_kwargs(rollout_config)):
        return
    await _gate().hold(int(kwargs.get("priority", 0) or 0))


@register(ORDERED_AGENT_LOOP)
class OrderedSingleTurnAgentLoop(SeededSingleTurnAgentLoop):
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        await hold_turn(kwargs, self.rollout_config)
        return await super().run(sampling_params, **kwargs)


@register(SEEDED_TOOL_AGENT_LOOP)
class SeededToolAgentLoop(ToolAgentLoop):
    """verl's multi-turn ``tool_agent`` loop with the seeds above: every turn of a sample is generated with the
    sample's seed (the ``hf`` server draws the turn's sampler from it, the version and the turn's prompt). On a
    rollout with its own pool (``actor_rollout_ref.hybrid_engine=false``, the overlapped mode) it also admits
    samples one priority at a time, as ``ordered_single_turn_agent`` does: a sample holds its priority through
    all its turns, but not while its tools run (and their replies are tokenised): then the next priority's
    samples start, so a slow tool is waited for by several batches at once, not by one batch after another."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        if not self.config.actor_rollout_ref.hybrid_engine:
            await hold_turn(kwargs, self.rollout_config)
        return await super().run(seeded(sampling_params, self.rollout_config.name, kwargs), **kwargs)

    async def _handle_processing_tools_state(self, agent_data):
        async with _gate().away():
            return await super()._handle_processing_tools_state(agent_data)
