"""Partial rollouts vs waiting for the drain, on the tool task with a slow tool (CPU end-to-end path).

One real ``main_ppo`` run per mode and setting, all in one invocation, the same inputs (``opmd``, ``--model
tiny-tool``, 4 prompts x 4 samples, no validation, seed 0, the tool's reply taking ``--latency`` seconds): colocated,
overlapped waiting for the drain at each push (``partial_rollout=false``), and overlapped with partial rollouts.
Steps 2.. are measured (step 1 holds the first version's generation and the warm-up). Per run: the mean step time
(verl's ``timing_s/step``), the trainer's wait for its batch (``offpolicy/wait_s``) and for the drain before a push
(``offpolicy/sync_wait_s``), the fraction of trained responses spanning versions, the mean train reward; and the
ratio of step times drain / partial.

    python benchmarks/bench_partial.py [--steps 8] [--latency 1.5] [--spread fixed|lognormal] [--settings 1,1 2,1 4,1]

Run it on an idle machine; it writes ``benchmarks/results/partial_rollout.md`` (``partial_rollout_lognormal.md`` with
``--spread lognormal``), the command and the commit in it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _results import RESULTS, command_line, measured_commit

from tests.scenario_runs import PRIMARY_CONFIG, SMALL_DEMO, STANDALONE, schedule
from verl_offpolicy.demo.tool_task import SPREADS

ROLLOUT_ANCHOR = "algorithm.offpolicy.ratio_anchor=rollout"
MODES = {
    "colocated": [],
    "overlapped, drain": STANDALONE + [ROLLOUT_ANCHOR],
    "overlapped, partial": STANDALONE + [ROLLOUT_ANCHOR, "algorithm.offpolicy.partial_rollout=true"],
}


def _mean(rows, key):
    values = [r[key] for r in rows if key in r]
    return statistics.fmean(values) if values else float("nan")


def run(mode: str, s: int, d: int, steps: int, latency: float, spread: str, root: Path) -> dict:
    from verl_offpolicy.demo.run import run_demo
    from verl_offpolicy.demo.tool_task import write_tool_config

    out = root / f"{mode.replace(', ', '_').replace(' ', '_')}_s{s}d{d}"
    out.mkdir(parents=True)
    tool = write_tool_config(out / "lookup_tool.yaml", latency, spread)
    tool_override = f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool}"
    overrides = SMALL_DEMO + schedule(s, d) + MODES[mode] + [tool_override]
    print(f"[bench_partial] {mode} at ({s}, {d}) ...", flush=True)
    started = time.perf_counter()
    result = run_demo(
        "opmd", steps, 0, out, overrides=overrides, config_name=PRIMARY_CONFIG, stream=False, plot=False,
        model="tiny-tool", timeout=1800,
    )  # fmt: skip
    rows = [m for m in result.metrics if m["step"] >= 2]
    return {
        "step_s": _mean(rows, "timing_s/step"),
        "wait_s": _mean(rows, "offpolicy/wait_s"),
        "sync_wait_s": _mean(rows, "offpolicy/sync_wait_s"),
        "spanning": _mean(rows, "offpolicy/token_version/spanning_fraction"),
        "reward": _mean(result.metrics, "critic/score/mean"),
        "wall_s": time.perf_counter() - started,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--latency", type=float, default=1.5, help="seconds the tool takes to reply")
    parser.add_argument("--spread", choices=SPREADS, default="fixed", help="the tool's latency: fixed or heavy-tailed")
    parser.add_argument("--settings", nargs="+", default=["1,1", "2,1", "4,1"])
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-partial-"))
    lines = [
        "# Partial rollouts vs waiting for the drain (tool task, slow tool)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} at commit {measured_commit()}, on this 2-core CPU machine:",
        "",
        f"    {command_line('bench_partial.py', argv)}",
        "",
        f"Tool latency {args.latency:g} s ({args.spread}), {args.steps} steps, means over steps 2..{args.steps}; "
        "ratio = overlapped drain step time / partial step time (> 1: partial is faster).",
        "",
        "| (s, d) | mode | step s | wait s | push wait s | spanning | reward (mean) |",
        "|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for setting in args.settings:
        s, d = (int(x) for x in setting.split(","))
        results = {mode: run(mode, s, d, args.steps, args.latency, args.spread, root) for mode in MODES}
        for mode, r in results.items():
            lines.append(
                f"| ({s}, {d}) | {mode} | {r['step_s']:.2f} | {r['wait_s']:.2f} | {r['sync_wait_s']:.2f} | "
                f"{r['spanning']:.2f} | {r['reward']:.3f} |"
            )
        ratio = results["overlapped, drain"]["step_s"] / results["overlapped, partial"]["step_s"]
        ratios.append(f"({s}, {d}): {ratio:.2f}x")
    lines += ["", "Drain / partial step time: " + ", ".join(ratios) + ".", ""]
    text = "\n".join(lines)
    name = "partial_rollout.md" if args.spread == "fixed" else f"partial_rollout_{args.spread}.md"
    (RESULTS / name).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
