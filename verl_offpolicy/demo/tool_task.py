"""The tiny tool task (``verl-offpolicy demo --model tiny-tool``): a question only a tool call answers.

Each row asks ``ask``; its answer is a symbol drawn per row (seeded) and known only to the row's
``lookup`` tool (verl's ``tools_kwargs``: ``create_kwargs.value``), so it cannot be answered without calling the tool. A
trajectory that earns the reward has two model turns, run by verl's tool agent loop
(``seeded_tool_agent``, :mod:`verl_offpolicy.cpu.agent_loop`)::

    <|user|> ask <|assistant|> <|call|> <|tool|> c c c <|assistant|> c c c c </s>
                               \\_ turn 1 _/ \\_ tool, mask 0 ____/ \\_ turn 2 _/

Turn 1 ends at the call token (the ``words`` tool-call format, :mod:`verl_offpolicy.cpu.tool_parser`); the
tool's reply and the next generation prompt are context (``response_mask`` 0); turn 2 must copy the reply,
:data:`ANSWER_SLOTS` times. :func:`compute_score` is the fraction of those slots holding the row's symbol
(0 without a call: a guess scores nothing); it reads the decoded
trajectory as verl's reward loop passes it (special tokens dropped): the first ``<|call|>`` ends turn 1 by
construction (a stop token), and the template puts the reply right after it.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
from pathlib import Path
from typing import Any, Optional

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse

from verl_offpolicy.cpu.tool_parser import CALL_TOKEN
from verl_offpolicy.demo.repeat_task import write_splits
from verl_offpolicy.demo.tiny import SYMBOLS, TOOL_ROLE

DATA_SOURCE = "verl_offpolicy/lookup"
QUESTION = "ask"
TOOL_NAME = "lookup"
VALUES = SYMBOLS[:8]  # the answers rows draw from (the repeat task's default 8 symbols)
ANSWER_SLOTS = 4  # the answer repeats the value: a dense reward, as the repeat task's
# The tool states its value this many times: a 77k-parameter model learns "repeat the last symbol" within the
# demo's steps, but with a one-word reply it settles on repeating a symbol of its own first turn (measured:
# train reward 0.006 -> 0.13 in 40 steps at one word).
REPLY_WORDS = 3
# The tool's config for verl (actor_rollout_ref.rollout.multi_turn.tool_config_path), shipped with the package.
TOOL_CONFIG = str(Path(__file__).with_name("lookup_tool.yaml"))
# The tool's latency (its config's keys): each call takes LATENCY_KEY seconds ("fixed") or a log-normal draw with
# that median and σ = 1 ("lognormal": heavy-tailed, the mean is e^0.5 ≈ 1.65 times the median, one call in 20
# takes over 5.2 times it), so that waiting for a batch's slowest trajectory costs time on the CPU path too.
LATENCY_KEY = "latency_s"
SPREAD_KEY = "latency_spread"
SPREADS = ("fixed", "lognormal")


def call_latency(median_s: float, spread: str, rng: random.Random) -> float:
    """One call's seconds: ``median_s`` ("fixed"), or ``median_s · exp(z)``, z ~ N(0, 1) ("lognormal")."""
    return median_s if spread == "fixed" else median_s * math.exp(rng.gauss(0.0, 1.0))


def latency_setting(config: dict) -> tuple[float, str]:
    """The tool config's ``(latency_s, latency_spread)``, or ``ValueError`` naming the key and what it takes."""
    latency, spread = config.get(LATENCY_KEY, 0.0), config.get(SPREAD_KEY, "fixed")
    if isinstance(latency, bool) or not isinstance(latency, int | float) or not (0 <= latency < math.inf):
        raise ValueError(f"the {TOOL_NAME} tool's {LATENCY_KEY}={latency!r}: must be a number of seconds >= 0")
    if spread not in SPREADS:
        raise ValueError(f"the {TOOL_NAME} tool's {SPREAD_KEY}={spread!r}: allowed: {', '.join(SPREADS)}")
    return float(latency), spread


def write_tool_config(path: str | os.PathLike, latency_s: float, spread: str = "fixed") -> str:
    """The shipped tool config with the tool's latency set, written to ``path`` (for
    ``actor_rollout_ref.rollout.multi_turn.tool_config_path``); checked as the tool will check it."""
    import yaml

    latency_setting({LATENCY_KEY: latency_s, SPREAD_KEY: spread})
    config = yaml.safe_load(Path(TOOL_CONFIG).read_text())
    config["tools"][0]["config"].update({LATENCY_KEY: latency_s, SPREAD_KEY: spread})
    Path(path).write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path)


class LookupTool(BaseTool):
    """Answers a trajectory's ``lookup`` call with its row's symbol (``tools_kwargs.lookup.create_kwargs.value``)."""

    def __init__(self, config: dict, tool_schema):
        super().__init__(config, tool_schema)
        self.values: dict[str, str] = {}
        self.latency_s, self.spread = latency_setting(config)
        self.rng = random.Random(0)  # the latency draws (they change when a reply arrives, not what it says)

    async def create(self, instance_id: Optional[str] = None, **kwargs) -> tuple[str, ToolResponse]:
        instance_id, response = await super().create(instance_id)
        value = (kwargs.get("create_kwargs") or {}).get("value")
        if value is None:
            raise ValueError(
                f"the {TOOL_NAME} tool needs its row's value: extra_info.tools_kwargs.{TOOL_NAME}.create_kwargs.value"
            )
        self.values[instance_id] = str(value)
        return instance_id, response

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        if self.latency_s > 0:
            await asyncio.sleep(call_latency(self.latency_s, self.spread, self.rng))
        return ToolResponse(text=" ".join([self.values[instance_id]] * REPLY_WORDS)), 0.0, {}

    async def release(self, instance_id: str, **kwargs) -> None:
        self.values.pop(instance_id, None)


def make_row(value: str, index: int, split: str) -> dict[str, Any]:
    """One parquet row whose ``lookup`` tool answers ``value``."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": QUESTION}],
        "ability": "tool",
        "reward_model": {"style": "rule", "ground_truth": value},
        "extra_info": {
            "split": split,
            "index": index,
            "tools_kwargs": {TOOL_NAME: {"create_kwargs": {"value": value}}},
        },
    }


def build_dataset(
    out_dir: str | os.PathLike, *, train_size: int = 256, val_size: int = 16, seed: int = 0
) -> dict[str, str]:
    """Write ``train.parquet`` and ``val.parquet`` (each training row's value drawn from :data:`VALUES`, seeded)."""
    rng = random.Random(seed)
    train = [make_row(rng.choice(VALUES), i, "train") for i in range(train_size)]
    val = [make_row(VALUES[i % len(VALUES)], i, "test") for i in range(val_size)]
    return write_splits(out_dir, train, val)


def answer(solution_str: str) -> list[str]:
    """The words of the model's turn after its first tool call, from the decoded trajectory ([] without a call)."""
    words = solution_str.split()
    if CALL_TOKEN not in words:
        return []
    after = words[words.index(CALL_TOKEN) + 1 :]  # [<|tool|>, the reply's REPLY_WORDS words, answer...]
    return after[1 + REPLY_WORDS :] if after[:1] == [TOOL_ROLE] else []


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Optional[dict] = None, **kwargs
) -> float:
    """verl custom reward function of the tool task: the fraction of the answer's :data:`ANSWER_SLOTS` first
    words that are the row's value (the value only the tool gave). 0 without a tool call."""
    return sum(word == str(ground_truth) for word in answer(solution_str)[:ANSWER_SLOTS]) / ANSWER_SLOTS
