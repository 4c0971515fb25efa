"""A synthetic "repeat the symbol" task that a tiny random model learns in a few GRPO steps.

Prompt: ``repeat <s>`` for a symbol ``s`` of :data:`verl_offpolicy.cpu.tiny.SYMBOLS`. Reward: the
fraction of the response budget filled with ``s``,

    r = #{response words equal to s} / max_response_length  in [0, 1],

so it is dense (a random model already scores ~1/|vocab| per token, so GRPO groups have non-zero
advantages) and cannot be gamed by stopping early. The data are written in verl's RLHF parquet
format (``data_source``, ``prompt`` as chat messages, ``ability``, ``reward_model.ground_truth``,
``extra_info``) and the reward is plugged in with verl's custom reward function mechanism:

    reward.custom_reward_function.path=pkg://verl_offpolicy.cpu.task
    reward.custom_reward_function.name=compute_score
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, Optional

from verl_offpolicy.cpu.tiny import SYMBOLS

DATA_SOURCE = "verl_offpolicy/repeat"
ABILITY = "copy"
REWARD_FUNCTION_PATH = "pkg://verl_offpolicy.cpu.task"
REWARD_FUNCTION_NAME = "compute_score"


def make_row(symbol: str, index: int, split: str, max_response_length: int) -> dict[str, Any]:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"repeat {symbol}"}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": symbol},
        "extra_info": {"split": split, "index": index, "max_response_length": max_response_length},
    }


def build_dataset(
    out_dir: str | os.PathLike,
    *,
    num_symbols: int = 8,
    train_size: int = 256,
    max_response_length: int = 8,
    seed: int = 0,
) -> dict[str, str]:
    """Write ``train.parquet`` and ``val.parquet`` to ``out_dir``; return their paths.

    Train rows cycle through the first ``num_symbols`` symbols in a seeded random order; the
    validation set holds each symbol once.
    """
    if not 1 <= num_symbols <= len(SYMBOLS):
        raise ValueError(f"num_symbols must be in [1, {len(SYMBOLS)}], got {num_symbols}")
    symbols = list(SYMBOLS[:num_symbols])
    rng = random.Random(seed)
    train_symbols = [symbols[i % num_symbols] for i in range(train_size)]
    rng.shuffle(train_symbols)
    train = [make_row(s, i, "train", max_response_length) for i, s in enumerate(train_symbols)]
    val = [make_row(s, i, "test", max_response_length) for i, s in enumerate(symbols)]
    return write_splits(out_dir, train, val)


def write_splits(out_dir: str | os.PathLike, train: list[dict[str, Any]], val: list[dict[str, Any]]) -> dict[str, str]:
    """Write the rows as ``out_dir/train.parquet`` and ``out_dir/val.parquet``; return verl's ``data.*_files`` paths."""
    import pandas as pd

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"train_files": str(out_dir / "train.parquet"), "val_files": str(out_dir / "val.parquet")}
    pd.DataFrame(train).to_parquet(paths["train_files"])
    pd.DataFrame(val).to_parquet(paths["val_files"])
    return paths


def score(response_words: list[str], target: str, budget: int) -> float:
    """Fraction of ``budget`` filled with ``target`` (words beyond the budget do not count)."""
    if budget <= 0:
        return 0.0
    return sum(word == target for word in response_words[:budget]) / budget


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: Optional[dict[str, Any]] = None,
    **kwargs: Any,
) -> float:
    """verl custom reward function (``reward.custom_reward_function``) of the repeat task."""
    words = solution_str.split()
    budget = None
    if isinstance(extra_info, dict):
        budget = extra_info.get("max_response_length")
    if not budget:
        budget = max(len(words), 1)
    return score(words, str(ground_truth), int(budget))
