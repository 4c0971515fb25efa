"""Partial rollouts vs waiting for the drain, on the long-tailed CPU workloads (CPU end-to-end path).

One real ``main_ppo`` run per mode and setting, all in one invocation, the same inputs (``opmd``, 4 prompts x 4
samples, no validation, seed 0): colocated, overlapped waiting for the drain at each push (``partial_rollout=false``),
and overlapped with partial rollouts. The task (``--task``): ``tool``, the tool task (``--model tiny-tool``) with the
tool's reply taking ``--latency`` seconds (``--spread``: fixed or heavy-tailed); ``long``, the repeat task with
long-tailed response lengths (``--model tiny-long``), each generation step taking ``--latency`` seconds; ``short``,
the demo's repeat task (``--model tiny``), short responses. Steps 2.. are measured (step 1 holds the first version's
generation and the warm-up). Per run: the mean step time (verl's ``timing_s/step``), the trainer's wait for its batch
(``offpolicy/wait_s``) and for the drain before a push (``offpolicy/sync_wait_s``), the fraction of trained responses
spanning versions, the mean and largest response length, the mean train reward; the ratio of step times drain /
partial, and what removing the drain's push waits alone would give (its step time over its step time less its push
waits per step); and the train reward of every step against steps and against the run's training wall-clock (the sum
of its step times), a table and a PNG. ``--rounds N``: each setting's runs N times, the modes' order reversed every
other round (the machine's drift falls on both sides); the table and curves are the first round's, and each round's
step times and ratio follow it. ``--batching``: the ``hf`` server's, in every mode: ``continuous`` as vLLM's (a
request joins the running batch, the agent loop does not order; ``engine_kwargs.hf.continuous_batching``, the long
task's default) or ``priority``, one priority's batch at a time (the tool task's).

    python benchmarks/bench_partial.py [--task tool|long|short] [--steps 8] [--latency S] [--spread fixed|lognormal]
        [--settings 1,1 2,1 4,1] [--batching priority|continuous] [--rounds 1]

Run it on an idle machine; it writes ``benchmarks/results/partial_rollout.md`` (``partial_rollout_lognormal.md`` with
``--spread lognormal``, ``partial_rollout_long.md`` with ``--task long``, ``..._<batching>`` with the other batching,
``..._latency<S>`` with another latency of the long task, ``partial_rollout_short.md`` with ``--task short``) and the
curves beside it (``..._curves.png``), the command and the commit in it.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _results import RESULTS, command_line, measured_commit

from tests.scenario_runs import PRIMARY_CONFIG, SMALL_DEMO, STANDALONE, schedule
from verl_offpolicy.cpu.hf_options import CONTINUOUS_BATCHING_KEY, TOKEN_LATENCY_KEY
from verl_offpolicy.demo.models import LONG_TAIL_TOKEN_LATENCY_S
from verl_offpolicy.demo.repeat_task import LONG_TAIL_CAP, LONG_TAIL_MEDIAN
from verl_offpolicy.demo.tool_task import SPREADS
from verl_offpolicy.glue.registration import HF_ROLLOUT

ROLLOUT_ANCHOR = "algorithm.offpolicy.ratio_anchor=rollout"
MODES = {
    "colocated": [],
    "overlapped, drain": STANDALONE + [ROLLOUT_ANCHOR],
    "overlapped, partial": STANDALONE + [ROLLOUT_ANCHOR, "algorithm.offpolicy.partial_rollout=true"],
}


def _mean(rows, key):
    values = [r[key] for r in rows if key in r]
    return statistics.fmean(values) if values else float("nan")


@dataclass(frozen=True)
class Task:
    """A workload of ``--task``: the demo model that runs it, its default ``--latency`` and ``--batching``."""

    model: str
    title: str
    latency: float | None  # tool: seconds per tool reply; long: per generation step; None: takes none
    batching: str
    suffix: str  # of the results file


TASKS = {
    "tool": Task("tiny-tool", "tool task, slow tool", 1.5, "priority", ""),
    "long": Task(
        "tiny-long", "repeat task, long-tailed response lengths", LONG_TAIL_TOKEN_LATENCY_S, "continuous", "_long"
    ),
    "short": Task("tiny", "the demo's repeat task, short responses", None, "priority", "_short"),
}
BATCHING = {  # --batching -> the hf server's overrides, every mode
    name: [f"actor_rollout_ref.rollout.engine_kwargs.{HF_ROLLOUT}.{CONTINUOUS_BATCHING_KEY}={value}"]
    for name, value in (("priority", "false"), ("continuous", "true"))
}
BATCHING_WORDS = {"priority": "one priority at a time", "continuous": "continuously (vLLM's)"}


def task_overrides(task: str, out: Path, latency: float, spread: str) -> list[str]:
    """The tool task's tool config with its latency; the long-tailed task's time per generation step."""
    if task == "long":
        return [f"actor_rollout_ref.rollout.engine_kwargs.{HF_ROLLOUT}.{TOKEN_LATENCY_KEY}={latency}"]
    if task != "tool":
        return []
    from verl_offpolicy.demo.tool_task import write_tool_config

    tool = write_tool_config(out / "lookup_tool.yaml", latency, spread)
    return [f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool}"]


def workload(task: str, latency: float, spread: str) -> str:
    if task == "tool":
        return f"Tool latency {latency:g} s ({spread})"
    if task == "long":
        return (
            f"Response budgets log-normal per row (median {LONG_TAIL_MEDIAN} tokens, up to {LONG_TAIL_CAP}; "
            f"`--model tiny-long`), {latency:g} s per generation step"
        )
    return "The demo's repeat task (`--model tiny`), 8-token responses"


def run(
    mode: str, s: int, d: int, steps: int, task: str, latency: float, spread: str, batching: str, root: Path
) -> dict:
    from verl_offpolicy.demo.run import run_demo

    out = root / f"{mode.replace(', ', '_').replace(' ', '_')}_s{s}d{d}"
    out.mkdir(parents=True)
    overrides = (
        SMALL_DEMO + schedule(s, d) + MODES[mode] + task_overrides(task, out, latency, spread) + BATCHING[batching]
    )
    print(f"[bench_partial] {mode} at ({s}, {d}) ...", flush=True)
    started = time.perf_counter()
    result = run_demo(
        "opmd", steps, 0, out, overrides=overrides, config_name=PRIMARY_CONFIG, stream=False, plot=False,
        model=TASKS[task].model, timeout=1800,
    )  # fmt: skip
    rows = [m for m in result.metrics if m["step"] >= 2]
    every = sorted(result.metrics, key=lambda m: m["step"])
    return {
        "rewards": [m.get("critic/score/mean", float("nan")) for m in every],
        "clock": list(itertools.accumulate(m.get("timing_s/step", 0.0) for m in every)),
        "length": _mean(rows, "response_length/mean"),
        "length_max": max((m.get("response_length/max", float("nan")) for m in rows), default=float("nan")),
        "step_s": _mean(rows, "timing_s/step"),
        "wait_s": _mean(rows, "offpolicy/wait_s"),
        "sync_wait_s": _mean(rows, "offpolicy/sync_wait_s"),
        "sync_wait_per_step": sum(r.get("offpolicy/sync_wait_s", 0.0) for r in rows) / max(1, len(rows)),
        "spanning": _mean(rows, "offpolicy/token_version/spanning_fraction"),
        "reward": _mean(result.metrics, "critic/score/mean"),
        "wall_s": time.perf_counter() - started,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--task", choices=TASKS, default="tool", help="tool: slow tool; long: long-tailed lengths; short: the demo's"
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument(
        "--latency", type=float, default=None,
        help=f"tool: seconds the tool takes to reply (1.5); long: per generation step ({LONG_TAIL_TOKEN_LATENCY_S})",
    )  # fmt: skip
    parser.add_argument("--spread", choices=SPREADS, default="fixed", help="the tool's latency: fixed or heavy-tailed")
    parser.add_argument("--settings", nargs="+", default=["1,1", "2,1", "4,1"])
    parser.add_argument(
        "--batching", choices=BATCHING, default=None, help="the hf server's batching (tool: priority; long: continuous)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs per mode and setting (modes' order alternating)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds}: must be >= 1")
    task = TASKS[args.task]
    if task.latency is None and args.latency is not None:
        parser.error(f"--latency: the {args.task} task takes none (tool: the tool's reply; long: a generation step)")
    if args.latency is None:
        args.latency = task.latency
    if args.batching is None:  # each demo model's own (tiny-long batches continuously)
        args.batching = task.batching
    root = Path(tempfile.mkdtemp(prefix="bench-partial-"))
    lines = [
        f"# Partial rollouts vs waiting for the drain ({task.title})",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} at commit {measured_commit()}, on this 2-core CPU machine:",
        "",
        f"    {command_line('bench_partial.py', argv)}",
        "",
        f"{workload(args.task, args.latency, args.spread)}; the hf server batching {BATCHING_WORDS[args.batching]}; "
        f"{args.steps} steps, means over steps 2..{args.steps} (response length: mean and largest); "
        "ratio = overlapped drain step time / partial step time (> 1: partial is faster).",
        "",
        "| (s, d) | mode | step s | wait s | push wait s | spanning | length | length max | reward (mean) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ratios, curves, rounds = [], {}, []
    for setting in args.settings:
        s, d = (int(x) for x in setting.split(","))
        each = []
        for i in range(args.rounds):
            order = list(MODES) if i % 2 == 0 else list(reversed(MODES))
            ran = {
                mode: run(mode, s, d, args.steps, args.task, args.latency, args.spread, args.batching, root / f"r{i}")
                for mode in order
            }
            each.append({mode: ran[mode] for mode in MODES})
        results = curves[s, d] = each[0]
        for mode, r in results.items():
            lines.append(
                f"| ({s}, {d}) | {mode} | {r['step_s']:.2f} | {r['wait_s']:.2f} | {r['sync_wait_s']:.2f} | "
                f"{r['spanning']:.2f} | {r['length']:.1f} | {r['length_max']:.0f} | {r['reward']:.3f} |"
            )
        drain = results["overlapped, drain"]
        ratio = drain["step_s"] / results["overlapped, partial"]["step_s"]
        most = drain["step_s"] / (drain["step_s"] - drain["sync_wait_per_step"])
        ratios.append(f"({s}, {d}): {ratio:.2f}x ({most:.2f}x)")
        rounds += round_rows(s, d, each)
    lines += [
        "",
        "Drain / partial step time, and in brackets what removing the drain's push waits alone would give (its step "
        "time over its step time less its push waits per step): " + ", ".join(ratios) + ".",
        "",
    ]
    if args.rounds > 1:
        lines += [
            f"## {args.rounds} rounds",
            "",
            "Mean step time (s, steps 2..) of each round's runs, the modes' order reversed every other round; drain / "
            "partial per round, and of the step times' means over the rounds.",
            "",
            "| (s, d) | round | " + " | ".join(MODES) + " | drain / partial |",
            "|---|---|" + "---|" * len(MODES) + "---|",
            *rounds,
            "",
        ]
    name = (
        "partial_rollout"
        + task.suffix
        + ("" if args.spread == "fixed" or args.task != "tool" else f"_{args.spread}")
        + ("" if args.batching == task.batching else f"_{args.batching}")
        + ("" if args.task == "tool" or args.latency == task.latency else f"_latency{args.latency:g}")
    )
    lines += curve_tables(curves) + ["", f"![reward curves]({name}_curves.png)", ""]
    text = "\n".join(lines)
    (RESULTS / f"{name}.md").write_text(text)
    plot_curves(curves, RESULTS / f"{name}_curves.png")
    print(text)
    return 0


def round_rows(s: int, d: int, each: list[dict]) -> list[str]:
    """One table row per round (its modes' step times, drain / partial), then the means over the rounds."""
    rows = []
    for i, results in enumerate(each, start=1):
        times = [results[mode]["step_s"] for mode in MODES]
        ratio = results["overlapped, drain"]["step_s"] / results["overlapped, partial"]["step_s"]
        rows.append(f"| ({s}, {d}) | {i} | " + " | ".join(f"{t:.2f}" for t in times) + f" | {ratio:.2f}x |")
    means = {mode: statistics.fmean(r[mode]["step_s"] for r in each) for mode in MODES}
    ratio = means["overlapped, drain"] / means["overlapped, partial"]
    rows.append(f"| ({s}, {d}) | mean | " + " | ".join(f"{t:.2f}" for t in means.values()) + f" | {ratio:.2f}x |")
    return rows


def curve_tables(curves: dict) -> list[str]:
    """Per setting, the train reward of every step and the training wall-clock (s) it was reached at, per mode."""
    lines = [
        "## Learning curves",
        "",
        "Train reward (`critic/score/mean`) at each step, and in brackets the run's training wall-clock at the end of "
        "that step (s, the sum of `timing_s/step`, start-up excluded).",
        "",
    ]
    for (s, d), results in curves.items():
        steps = max(len(r["rewards"]) for r in results.values())
        lines += [f"({s}, {d}):", "", "| step | " + " | ".join(results) + " |", "|---" * (len(results) + 1) + "|"]
        for i in range(steps):
            cells = [
                f"{r['rewards'][i]:.3f} ({r['clock'][i]:.0f})" if i < len(r["rewards"]) else ""
                for r in results.values()
            ]
            lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def plot_curves(curves: dict, path: Path) -> None:
    """Reward against steps (top) and against training wall-clock (bottom), one column per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(curves), figsize=(4.5 * len(curves), 7), squeeze=False)
    for column, ((s, d), results) in enumerate(curves.items()):
        by_step, by_clock = axes[0][column], axes[1][column]
        for (mode, r), marker in zip(results.items(), "osx", strict=False):
            by_step.plot(range(1, len(r["rewards"]) + 1), r["rewards"], marker=marker, label=mode)
            by_clock.plot(r["clock"], r["rewards"], marker=marker, label=mode)
        by_step.set_title(f"(s, d) = ({s}, {d})")
        by_step.set_xlabel("training step")
        by_clock.set_xlabel("training wall-clock (s, start-up excluded)")
        for axis in (by_step, by_clock):
            axis.set_ylabel("train reward")
            axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
