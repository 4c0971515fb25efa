"""A reproducible single-turn agent loop for the CPU path: ``seeded_single_turn_agent``.

verl's single-turn agent loop plus a sampling seed per sample, derived from the dataset row
(``index``) and the sample's session id within its group. The ``hf`` rollout seeds each request's
sampler from it (and the weights version), so a CPU run is reproducible at a fixed seed whatever the
order in which the agent loop's concurrent requests reach the server, and two rows with the same
prompt still get different samples. The CPU overlay selects it as the default agent loop.

A prompt's ``priority`` (verl's agent-loop argument; the overlapped scheduler sets it to the step the
batch is trained at) reaches the ``hf`` server in ``sampling_params["priority"]``: verl's client forwards
``priority`` to vLLM only, and the hf server generates the lowest priority first.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from verl_offpolicy.glue.registration import HF_ROLLOUT

AGENT_LOOP_NAME = "seeded_single_turn_agent"
_ROW_STRIDE = 1_000_003  # > any group size: (row, session) -> distinct seeds


@register(AGENT_LOOP_NAME)
class SeededSingleTurnAgentLoop(SingleTurnAgentLoop):
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        if "seed" not in sampling_params and kwargs.get("index") is not None:
            seed = int(kwargs["index"]) * _ROW_STRIDE + int(kwargs.get("session_id", 0))
            sampling_params = {**sampling_params, "seed": seed}
        priority = int(kwargs.get("priority", 0) or 0)
        if priority and self.rollout_config.name == HF_ROLLOUT:
            sampling_params = {**sampling_params, "priority": priority}
        return await super().run(sampling_params, **kwargs)
