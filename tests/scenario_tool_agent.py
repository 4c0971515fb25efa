"""verl's multi-turn tool agent loop (``seeded_tool_agent``) on the tiny tool task, in one process: the
``hf`` server (in-process, real), the task's tool loaded by verl's loader, the loop instantiated as verl's
agent-loop worker instantiates it. Run through ``tests.cpu_harness.isolated`` (the CPU platform)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.scenario_rollout import in_process_server


class _Client:
    """What verl's agent loop calls (``server_manager.generate``), straight to the in-process server."""

    def __init__(self, server):
        self.server = server

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        return await self.server.generate(prompt_ids, dict(sampling_params), request_id=request_id)


def tool_trajectories(workdir: str, samples: int = 24) -> dict[str, Any]:
    """``samples`` trajectories of the untrained tiny tool model (seeded, temperature 1): their response ids,
    masks, log-probs, turns and the tokens' texts."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
    from verl.tools.tool_registry import load_all_tools
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_offpolicy.demo.models import _tool_task_overrides
    from verl_offpolicy.demo.tiny import TinyModelSpec, build_tiny
    from verl_offpolicy.demo.tool_task import QUESTION, TOOL_CONFIG, TOOL_NAME
    from verl_offpolicy.glue.registration import SEEDED_TOOL_AGENT_LOOP

    paths = build_tiny(Path(workdir) / "tiny_tool", TinyModelSpec(task="tool"))
    overrides = [o for o in _tool_task_overrides() if not o.startswith(("reward.", "trainer."))]
    server, cfg = in_process_server(paths["model_path"], paths["tokenizer_path"], overrides)
    tokenizer = server.model_config.tokenizer

    async def one(loop, index: int):
        params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
        return await loop.run(
            params,
            raw_prompt=[{"role": "user", "content": QUESTION}],
            index=index,
            session_id=0,
            tools_kwargs={TOOL_NAME: {"create_kwargs": {"value": "c"}}},
            extra_info={},
        )

    async def run():
        # verl's agent loop binds the running event loop when it is built: built inside it, as the worker does
        loop = hydra.utils.instantiate(
            config=_agent_loop_registry[SEEDED_TOOL_AGENT_LOOP],
            trainer_config=DictConfigWrap(config=cfg),
            server_manager=_Client(server),
            tokenizer=tokenizer,
            processor=None,
            hf_model_type="llama",
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(cfg.data),
            tools=ToolListWrap(load_all_tools(TOOL_CONFIG, None)),
        )
        return await asyncio.gather(*[one(loop, i) for i in range(samples)])

    outputs = asyncio.run(run())
    return {
        "trajectories": [
            {
                "tokens": tokenizer.convert_ids_to_tokens(o.response_ids),
                "mask": list(o.response_mask),
                "log_probs": list(o.response_logprobs or []),
                "num_turns": o.num_turns,
            }
            for o in outputs
        ]
    }
