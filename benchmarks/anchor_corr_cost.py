"""What the off-policy health statistics cost: ``offpolicy/anchor_corr/*`` next to the policy loss.

The statistics need no forward pass: on a stale batch the trainer already holds the proximal and the anchor
log-probs (it swaps the anchor into ``old_log_prob``). What they add is arithmetic on the driver: padding the
nested log-probs (``TensorDict.to_padded_tensor``, as the trainer does) and
:func:`verl_offpolicy.glue.scheduler.metrics.anchor_corr_metrics` (verl's ``compute_offpolicy_metrics`` and
``compute_rollout_correction_weights``). Measured here per call, on one CPU thread, next to one call of the
registered ``rec`` loss (``one-side``, forward and backward through log π) on the same batch, for the CPU demo's
batch and for a GSM8K-sized one (the REC paper's 96 prompts × 8 responses, up to 1024 tokens). Random
log-probs, ragged response lengths; the median of the repeats.

    python benchmarks/anchor_corr_cost.py       # about a minute on one CPU core

Writes ``benchmarks/results/anchor_corr_cost.md`` (the table and this command).
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import verl  # noqa: F401  (loads the verl.plugins entry point: registers our names)
from tensordict import TensorDict
from verl.trainer.ppo.core_algos import get_policy_loss_fn

from verl_offpolicy.glue.scheduler.metrics import ANCHOR_CORR_STATS, anchor_corr_metrics
from verl_offpolicy.tabular import actor

RESULTS = Path(__file__).parent / "results" / "anchor_corr_cost.md"
COMMAND = "python benchmarks/anchor_corr_cost.py"
SEED = 0
# name -> (responses, longest response); lengths are uniform in [longest/4, longest]
BATCHES = {
    "CPU demo (8 prompts × 16, ≤ 64 tokens)": (128, 64),
    "GSM8K-sized (96 prompts × 8, ≤ 1024 tokens)": (768, 1024),
}
REPEATS = {128: 50, 768: 7}


def nested_batch(responses: int, longest: int, g: torch.Generator) -> TensorDict:
    """The trainer's view of a stale batch: nested proximal and anchor log-probs and the response mask."""
    lengths = torch.randint(longest // 4, longest + 1, (responses,), generator=g).tolist()
    anchor = [-torch.rand(n, generator=g) * 3 for n in lengths]
    proximal = [a + 0.1 * torch.randn(n, generator=g) for a, n in zip(anchor, lengths, strict=True)]
    mask = [torch.ones(n, dtype=torch.long) for n in lengths]
    nested = lambda rows: torch.nested.as_nested_tensor(rows, layout=torch.jagged)  # noqa: E731
    return TensorDict(
        {"old_log_probs": nested(proximal), "behaviour_log_probs": nested(anchor), "response_mask": nested(mask)},
        batch_size=responses,
    )


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> int:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(SEED)
    loss_fn, config = get_policy_loss_fn("rec"), actor("rec", clip_mode="one-side")
    rows = []
    for name, (responses, longest) in BATCHES.items():
        data = nested_batch(responses, longest, g)

        def stats(data=data):
            padded = data.to_padded_tensor()
            return anchor_corr_metrics(padded["old_log_probs"], padded["behaviour_log_probs"], padded["response_mask"])

        padded = data.to_padded_tensor()
        mask = padded["response_mask"].bool()
        old = padded["behaviour_log_probs"]
        advantages = torch.randn(responses, 1, generator=g).expand_as(old) * mask

        def loss(padded=padded, old=old, advantages=advantages, mask=mask):
            log_prob = padded["old_log_probs"].clone().requires_grad_(True)
            value, _ = loss_fn(old, log_prob, advantages, mask, "token-mean", config)
            value.backward()

        assert len(stats()) == len(ANCHOR_CORR_STATS)
        stats_ms, loss_ms = median_ms(stats, REPEATS[responses]), median_ms(loss, REPEATS[responses])
        rows.append((name, int(mask.sum()), stats_ms, loss_ms))
        print(f"{name}: statistics {stats_ms:.2f} ms, rec loss {loss_ms:.2f} ms, ratio {stats_ms / loss_ms:.2f}")

    lines = [
        "# Cost of the off-policy health statistics (`offpolicy/anchor_corr/*`)",
        "",
        f"`{COMMAND}` (median per call, one CPU thread; {platform.processor() or platform.machine()}, "
        f"Python {sys.version.split()[0]}, torch {torch.__version__}; load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} cores when it finished: absolute times on a shared machine are inflated, compare the "
        "ratio). No forward pass: the statistics use the "
        "log-probs the anchor swap already holds. Compared with one call of the registered `rec` loss (one-side, "
        "forward and backward through log π) on the same batch; a training step also runs the model's forward "
        "and backward passes, which this loss call does not include.",
        "",
        "| batch | response tokens | statistics (pad + `anchor_corr_metrics`) | `rec` loss call | ratio |",
        "|---|---|---|---|---|",
        *(f"| {n} | {t} | {s:.2f} ms | {c:.2f} ms | {s / c:.2f} |" for n, t, s, c in rows),
        "",
    ]
    RESULTS.write_text("\n".join(lines))
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
