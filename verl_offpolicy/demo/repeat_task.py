"""The data of the synthetic "repeat the symbol" task, and the parquet writer of the demo's tasks.

Prompt: ``repeat <s>`` for a symbol ``s`` of :data:`verl_offpolicy.demo.tiny.SYMBOLS`; the reward
(:mod:`verl_offpolicy.cpu.task`, loaded by verl's reward loop) scores the fraction of the response
budget filled with ``s``. The data are written in verl's RLHF parquet format (``data_source``,
``prompt`` as chat messages, ``ability``, ``reward_model.ground_truth``, ``extra_info``; the budget
is ``extra_info.max_response_length``).

The long-tailed variant (``demo --model tiny-long``, ``build_dataset(long_tail=True)``): each row's budget is a
log-normal draw, and the row caps its responses there (``extra_info.max_tokens``, which the seeded agent loops pass
to the rollout), so as the model learns to fill its budget the response lengths follow the draw: most short, a few
many times longer, and a batch's generation waits for its longest response.
"""

from __future__ import annotations

import math
import os
import random
from pathlib import Path
from typing import Any

from verl_offpolicy.cpu.task import BUDGET_KEY, ROW_MAX_TOKENS_KEY
from verl_offpolicy.demo.tiny import SYMBOLS

DATA_SOURCE = "verl_offpolicy/repeat"
ABILITY = "copy"


def make_row(symbol: str, index: int, split: str, max_response_length: int, capped: bool = False) -> dict[str, Any]:
    """One parquet row asking to repeat ``symbol``; ``capped``: its responses stop at its budget."""
    extra = {ROW_MAX_TOKENS_KEY: max_response_length} if capped else {}
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"repeat {symbol}"}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": symbol},
        "extra_info": {"split": split, "index": index, BUDGET_KEY: max_response_length, **extra},
    }


# The long-tailed budgets: a log-normal draw with this median and σ = 1 (as the tool task's heavy-tailed latency:
# one row in 20 over 5.2 times the median), rounded, within [1, LONG_TAIL_CAP] (the task's data.max_response_length).
LONG_TAIL_MEDIAN = 6
LONG_TAIL_CAP = 48


def long_tail_budget(rng: random.Random, median: int = LONG_TAIL_MEDIAN, cap: int = LONG_TAIL_CAP) -> int:
    """One row's budget: ``round(median · exp(z))``, z ~ N(0, 1), clipped to [1, cap]."""
    return min(cap, max(1, round(median * math.exp(rng.gauss(0.0, 1.0)))))


def build_dataset(
    out_dir: str | os.PathLike,
    *,
    num_symbols: int = 8,
    train_size: int = 256,
    max_response_length: int = 8,
    long_tail: bool = False,
    seed: int = 0,
) -> dict[str, str]:
    """Write ``train.parquet`` and ``val.parquet`` to ``out_dir``; return their paths.

    Train rows cycle through the first ``num_symbols`` symbols in a seeded random order; the
    validation set holds each symbol once. Each row's budget is ``max_response_length``, or with ``long_tail`` a
    draw of :func:`long_tail_budget` that also caps the row's responses.
    """
    if not 1 <= num_symbols <= len(SYMBOLS):
        raise ValueError(f"num_symbols must be in [1, {len(SYMBOLS)}], got {num_symbols}")
    symbols = list(SYMBOLS[:num_symbols])
    rng = random.Random(seed)
    train_symbols = [symbols[i % num_symbols] for i in range(train_size)]
    rng.shuffle(train_symbols)
    budgets = random.Random(seed + 1)

    def row(symbol: str, index: int, split: str) -> dict[str, Any]:
        if not long_tail:
            return make_row(symbol, index, split, max_response_length)
        return make_row(symbol, index, split, long_tail_budget(budgets), capped=True)

    train = [row(s, i, "train") for i, s in enumerate(train_symbols)]
    val = [row(s, i, "test") for i, s in enumerate(symbols)]
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
