"""Staleness scheduler on the CPU end-to-end path: throughput and rollout calls vs sync_interval.

For s in {1, 2, 4, 8} (sync_offset 0), one real ``main_ppo`` run each (``rec_oneside_nois``, the
demo's 8 prompts x 16 samples, no validation), measured in one invocation:

- training steps per second (from verl's ``timing_s/step``, start-up excluded), as a ratio to s = 1;
- rollout calls (= weight syncs) per step, from ``offpolicy/rollout_calls``, as a ratio to s = 1;
- peak resident memory of TransferQueue's storage process (where the FIFO lives), sampled every
  0.2 s, and its increase over s = 1.

    python benchmarks/bench_scheduler.py [--steps 16] [--intervals 1 2 4 8]

Writes benchmarks/results/scheduler.md (table and command).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from _results import command_line, write_table  # benchmarks/_results.py (this script's folder is on sys.path)

from verl_offpolicy.demo.run import run_demo

STORAGE_PROCESS = "SimpleStorageUnit"


class PeakRSS:
    """Peak RSS of processes whose command line mentions ``STORAGE_PROCESS`` and started after us."""

    def __init__(self):
        self.peak = 0
        self.started = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for proc in psutil.process_iter(["cmdline", "create_time", "memory_info"]):
                try:
                    cmdline = " ".join(proc.info["cmdline"] or [])
                    if STORAGE_PROCESS in cmdline and proc.info["create_time"] >= self.started - 1:
                        self.peak = max(self.peak, proc.info["memory_info"].rss)
                except (psutil.NoSuchProcess, psutil.AccessDenied, TypeError):
                    continue
            self._stop.wait(0.2)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def measure(sync_interval: int, steps: int, workdir: Path) -> dict:
    with PeakRSS() as rss:
        result = run_demo(
            preset="rec_oneside_nois",
            steps=steps,
            seed=0,
            output_dir=workdir / f"s{sync_interval}",
            timeout=1800,
            config_name="offpolicy_trainer",
            overrides=[
                f"algorithm.offpolicy.sync_interval={sync_interval}",
                "trainer.val_before_train=false",
                "trainer.test_freq=-1",
            ],
            stream=False,
            plot=False,
        )
    step_times = [m["timing_s/step"] for m in result.metrics]
    calls = sum(m["offpolicy/rollout_calls"] for m in result.metrics)
    return {
        "s": sync_interval,
        "steps_per_s": len(step_times) / sum(step_times),
        "rollout_calls_per_step": calls / len(result.metrics),
        "peak_queue_rss_mb": rss.peak / 2**20,
        "max_queue_len": max(m["offpolicy/queue_len"] for m in result.metrics),
        "final_reward": sum(m["critic/score/mean"] for m in result.metrics[-3:]) / 3,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--intervals", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args(argv)
    if args.intervals[0] != 1:
        parser.error("the first interval must be 1 (the baseline of the ratios)")

    rows = []
    with tempfile.TemporaryDirectory(prefix="vo-bench-sched-") as tmp:
        for s in args.intervals:
            print(f"[bench] sync_interval={s}: {args.steps} steps ...", flush=True)
            rows.append(measure(s, args.steps, Path(tmp)))
            print(f"[bench] {rows[-1]}", flush=True)
    base = rows[0]
    write_table(
        "scheduler.md",
        "Scheduler on the CPU end-to-end path",
        command_line("bench_scheduler.py", argv),
        f"rec_oneside_nois, 8 prompts x 16 samples, 8-token responses, {args.steps} steps, no validation; "
        "one run per s, measured in one invocation on a 2-core machine (start-up excluded).",
        [
            "sync_interval s",
            "steps/s",
            "ratio to s=1",
            "rollout calls/step",
            "ratio to s=1",
            "max queue",
            "peak queue RSS (MB)",
            "vs s=1 (MB)",
        ],
        [
            [
                str(r["s"]),
                f"{r['steps_per_s']:.3f}",
                f"{r['steps_per_s'] / base['steps_per_s']:.2f}x",
                f"{r['rollout_calls_per_step']:.3f}",
                f"{r['rollout_calls_per_step'] / base['rollout_calls_per_step']:.2f}x",
                str(int(r["max_queue_len"])),
                f"{r['peak_queue_rss_mb']:.0f}",
                f"{r['peak_queue_rss_mb'] - base['peak_queue_rss_mb']:+.0f}",
            ]
            for r in rows
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
