"""The data of the synthetic "repeat the symbol" task, and the parquet writer of the demo's tasks.

Prompt: ``repeat <s>`` for a symbol ``s`` of :data:`verl_offpolicy.demo.tiny.SYMBOLS`; the reward
(:mod:`verl_offpolicy.cpu.task`, loaded by verl's reward loop) scores the fraction of the response
budget filled with ``s``. The data are written in verl's RLHF parquet format (``data_source``,
``prompt`` as chat messages, ``ability``, ``reward_model.ground_truth``, ``extra_info``; the budget
is ``extra_info.max_response_length``).
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from verl_offpolicy.demo.tiny import SYMBOLS

DATA_SOURCE = "verl_offpolicy/repeat"
ABILITY = "copy"


def make_row(symbol: str, index: int, split: str, max_response_length: int) -> dict[str, Any]:
    """One parquet row asking to repeat ``symbol``."""
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
