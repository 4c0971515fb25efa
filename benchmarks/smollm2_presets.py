"""SmolLM2-135M-Instruct on the arithmetic task: does a short run change anything, per preset?

One ``verl-offpolicy demo --model smollm2-135m`` run per preset, one after the other (never two at
once: each peaks at ~12 GB), on ``offpolicy_trainer`` with the demo's settings (4 prompts x 4
samples, 48 response tokens, lr 1e-5, seed 0), validation (greedy, 16 held-out problems) before
training and after the last step. Records the mean train reward of the first and last steps, the
greedy validation accuracy before and after, the mean seconds per step, and the peak memory (sum of
the resident set sizes of ``main_ppo`` and its descendants, Ray's processes included, sampled every
2 s).

    python benchmarks/smollm2_presets.py [--presets grpo opmd] [--steps 6] [--test-freq 3] [--deadline 18:30]

``--deadline HH:MM`` (UTC) bounds the wall clock: each run gets the time left, split over the runs
still to go, and a run killed at its bound is reported with the steps it logged. Writes
benchmarks/results/smollm2_presets.md and the reward curves next to it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import tempfile
import time
from pathlib import Path

import psutil
from _results import Poller  # benchmarks/_results.py (this script's folder is on sys.path)

from verl_offpolicy.demo.errors import DemoError
from verl_offpolicy.demo.output_dir import METRICS_NAME
from verl_offpolicy.demo.results import TRAIN_SCORE, read_metrics, validation_key
from verl_offpolicy.demo.run import run_demo

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "smollm2-135m"


class PeakMemory(Poller):
    """Peak of the summed RSS of every ``main_ppo`` process whose command line holds ``marker``, and its descendants."""

    def __init__(self, marker: str, interval: float = 2.0):
        super().__init__(interval)
        self.marker, self.peak = marker, 0

    def _sample(self) -> int:
        total = 0
        for proc in psutil.process_iter(["cmdline"]):
            try:
                cmd = " ".join(proc.info["cmdline"] or [])
                if "verl.trainer.main_ppo" in cmd and self.marker in cmd:
                    for p in [proc, *proc.children(recursive=True)]:
                        total += p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return total

    def poll(self) -> None:
        self.peak = max(self.peak, self._sample())


def seconds_left(deadline: dt.datetime) -> float:
    return (deadline - dt.datetime.now(dt.timezone.utc)).total_seconds()


def parse_deadline(text: str) -> dt.datetime:
    """``HH:MM`` (UTC) -> the next such time (00:30 given at 23:40 means tomorrow's)."""
    try:
        hh, mm = (int(x) for x in text.split(":"))
        now = dt.datetime.now(dt.timezone.utc)
        deadline = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a deadline is HH:MM (UTC), got {text!r}") from None
    return deadline + dt.timedelta(days=1) if deadline <= now else deadline


def summarise(preset: str, out: Path, steps: int, peak: int, wall: float, note: str) -> dict:
    by_step = read_metrics(out / METRICS_NAME)
    train = [(s, m) for s, m in sorted(by_step.items()) if s >= 1 and TRAIN_SCORE in m]
    rewards = [m[TRAIN_SCORE] for _, m in train]
    val = {s: float(m[k]) for s, m in sorted(by_step.items()) if (k := validation_key(m))}
    step_s = [m["timing_s/step"] for _, m in train if "timing_s/step" in m]
    return {
        "preset": preset,
        "steps": f"{len(train)}/{steps}",
        "rewards": rewards,
        "reward_first": rewards[0] if rewards else None,
        "reward_last": rewards[-1] if rewards else None,
        "val": val,
        "val_before": val.get(0),
        "val_after": val[max(val)] if val and max(val) > 0 else None,
        "val_after_step": max(val) if val and max(val) > 0 else None,
        "step_s": sum(step_s) / len(step_s) if step_s else None,
        "peak_gb": peak / 2**30,
        "wall_s": wall,
        "note": note,
    }


def _f(x, fmt="{:.3f}"):
    return "n/a" if x is None else fmt.format(x)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["grpo", "opmd"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument(
        "--test-freq", type=int, default=None, help="validate every N steps (default: only after the last)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline", default=None, help="HH:MM UTC (the next such time): every run ends before it")
    args = parser.parse_args(argv)

    deadline = parse_deadline(args.deadline) if args.deadline else None
    RESULTS.mkdir(exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="vo-smollm2-bench-") as tmp:
        for index, preset in enumerate(args.presets):
            timeout = 600.0 + 300.0 * args.steps
            if deadline is not None:
                timeout = min(timeout, seconds_left(deadline) / (len(args.presets) - index))
                if timeout < 600:
                    parser.error(
                        f"--deadline {args.deadline} leaves {timeout:.0f} s for {preset}: not enough to start SmolLM2"
                    )
            out = Path(tmp) / f"{index}-{preset}"
            print(f"[smollm2-bench] {preset}: {args.steps} steps, bound {timeout:.0f} s ...", flush=True)
            start, note = time.monotonic(), ""
            with PeakMemory(str(out)) as memory:
                try:
                    result = run_demo(
                        model=MODEL,
                        preset=preset,
                        steps=args.steps,
                        seed=args.seed,
                        output_dir=out,
                        timeout=timeout,
                        overrides=[f"trainer.test_freq={args.test_freq or args.steps}"],
                        config_name="offpolicy_trainer",
                        stream=True,
                    )
                    shutil.copy(result.plot_path, RESULTS / f"smollm2_{preset}.png")
                except DemoError as exc:
                    lines = str(exc).splitlines()
                    cause = next((line for line in reversed(lines) if "Error" in line), lines[0])
                    note = f"stopped: {cause.strip()[:160]}"
            rows.append(summarise(preset, out, args.steps, memory.peak, time.monotonic() - start, note))
            print(f"[smollm2-bench] {rows[-1]}", flush=True)

    lines = [
        "# SmolLM2-135M-Instruct on arithmetic word problems (CPU, 2 cores)",
        "",
        f"`python benchmarks/smollm2_presets.py --presets {' '.join(args.presets)} --steps {args.steps}"
        + (f" --test-freq {args.test_freq}" if args.test_freq else "")
        + (f" --deadline {args.deadline}`" if args.deadline else "`"),
        "",
        "Demo settings (`verl_offpolicy.demo.models`): single-digit sums, 4 prompts x 4 samples per step,"
        " 48 response tokens, lr 1e-5, seed 0; validation: greedy, 16 held-out problems, scored by math-verify.",
        "",
        "| preset | steps | train reward step 1 | last step | greedy val. before | after | s/step | peak RSS "
        "(GB) | run (s) | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['preset']} | {r['steps']} | {_f(r['reward_first'])} | {_f(r['reward_last'])} | "
            f"{_f(r['val_before'])} | "
            f"{_f(r['val_after'])} | {_f(r['step_s'], '{:.1f}')} | {r['peak_gb']:.1f} | {r['wall_s']:.0f} | "
            f"{r['note']} |"
        )
    lines += ["", "Train reward per step:", ""]
    lines += [f"- {r['preset']}: {', '.join(f'{x:.3f}' for x in r['rewards'])}" for r in rows]
    lines += ["", "Greedy validation accuracy by step:", ""]
    lines += [f"- {r['preset']}: {', '.join(f'{s}: {x:.3f}' for s, x in r['val'].items())}" for r in rows]
    (RESULTS / "smollm2_presets.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
