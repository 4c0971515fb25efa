"""Overlapped vs colocated scheduler, and verl's separate_async, on the CPU end-to-end path.

One real ``main_ppo`` run per setting (``opmd``, the demo's 8 prompts x 16 samples, no validation),
measured in one invocation:

- colocated and overlapped (``+cpu_rollout=standalone``) at each (s, d) of ``--settings``: training steps
  per second (verl's ``timing_s/step``, steps 2.. to leave out the first step's warm-up), the
  trainer's wait for data (``offpolicy/wait_s``: colocated, the whole generation; overlapped, the wait
  for the head batch) plus the wait before a weight push (``offpolicy/sync_wait_s``), the weight
  push (``timing_s/update_weights``), training (``timing_s/update_actor`` + ``old_log_prob`` + ``ref``)
  and the rollout's busy fraction;
- verl's own ``separate_async`` with the same preset (its rollout on its own pool, the cpu_mailbox
  transport; ``parameter_sync_step`` 1);
- reward against wall-clock time (PNG) for colocated (1, 0), colocated (1, 1) and overlapped (1, 1).

    python benchmarks/bench_overlap.py [--steps 12] [--settings 1,1 2,1 4,1]

Writes benchmarks/results/overlap.md (table, breakdown, command) and benchmarks/results/overlap_reward_wallclock.png.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from _results import RESULTS, command_line, write_table  # benchmarks/_results.py (this script's folder is on sys.path)
from verl_offpolicy.demo.run import run_demo
NO_VALIDATION = ["trainer.val_before_train=false", "trainer.test_freq=-1"]
STANDALONE = ["+cpu_rollout=standalone"]


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def measure(name: str, overrides: list[str], steps: int, workdir: Path) -> dict:
    result = run_demo(
        preset="opmd", steps=steps, seed=0, output_dir=workdir / name, timeout=3600,
        overrides=NO_VALIDATION + overrides, stream=False, plot=False,
    )
    ms = result.metrics[1:]  # step 1 includes the first generation of every batch of version 0 and warm-up
    step_s = [m["timing_s/step"] for m in ms]
    train = [sum(m.get(f"timing_s/{k}", 0.0) for k in ("update_actor", "old_log_prob", "ref", "adv")) for m in ms]
    elapsed, wall = [], 0.0
    for m in result.metrics:
        wall += m["timing_s/step"]
        elapsed.append(wall)
    return {
        "name": name,
        "steps_per_s": len(step_s) / sum(step_s),
        "step_s": _mean(step_s),
        "wait_s": _mean(m.get("offpolicy/wait_s", m.get("timing_s/gen", 0.0)) for m in ms),
        "sync_wait_s": _mean(m.get("offpolicy/sync_wait_s", 0.0) for m in ms),
        "push_s": _mean(m.get("timing_s/update_weights", 0.0) for m in ms),
        "train_s": _mean(train),
        "busy": _mean(m["offpolicy/rollout_busy_fraction"] for m in ms if "offpolicy/rollout_busy_fraction" in m),
        "reward_curve": (elapsed, [m["critic/score/mean"] for m in result.metrics]),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--settings", nargs="+", default=["1,1", "2,1", "4,1"])
    parser.add_argument("--only", nargs="+", default=None, help="run only these rows (e.g. 'overlapped s1d1')")
    parser.add_argument("--overrides", nargs="*", default=[], help="extra Hydra overrides for every run")
    args = parser.parse_args(argv)
    settings = [tuple(int(x) for x in s.split(",")) for s in args.settings]

    runs: dict[str, dict] = {}
    plan = [("colocated s1d0", ["algorithm.offpolicy.sync_offset=0"])]
    for s, d in settings:
        schedule = [f"algorithm.offpolicy.sync_interval={s}", f"algorithm.offpolicy.sync_offset={d}"]
        plan += [(f"colocated s{s}d{d}", schedule), (f"overlapped s{s}d{d}", schedule + STANDALONE)]
    plan.append(("verl separate_async", STANDALONE + ["trainer.v1.trainer_mode=separate_async"]))
    plan = [(name, overrides + args.overrides) for name, overrides in plan if args.only is None or name in args.only]
    with tempfile.TemporaryDirectory(prefix="vo-bench-overlap-") as tmp:
        for name, overrides in plan:
            print(f"[bench] {name}: {args.steps} steps ...", flush=True)
            runs[name] = measure(name.replace(" ", "_"), overrides, args.steps, Path(tmp))
            print(f"[bench] {({k: v for k, v in runs[name].items() if k != 'reward_curve'})}", flush=True)

    rows = []
    for name, r in runs.items():
        # overlapped: vs colocated at the same (s, d); verl's separate_async (one step off-policy): vs colocated (1, 1)
        base = runs.get(name.replace("overlapped", "colocated") if name.startswith("overlapped") else "colocated s1d1")
        ratio = f"{r['steps_per_s'] / base['steps_per_s']:.2f}x" if base and not name.startswith("colocated") else ""
        busy = "" if r["busy"] != r["busy"] else f"{r['busy']:.2f}"
        rows.append([name, f"{r['steps_per_s']:.3f}", ratio, f"{r['step_s']:.2f}", f"{r['wait_s']:.2f}", f"{r['sync_wait_s']:.2f}",
                     f"{r['push_s']:.2f}", f"{r['train_s']:.2f}", busy])
    write_table(
        "overlap.md",
        "Overlapped vs colocated scheduler on the CPU end-to-end path",
        command_line("bench_overlap.py", argv),
        f"opmd, 8 prompts x 16 samples, 8-token responses, {args.steps} steps (step 1 excluded), no validation; "
        "one run per row, in one invocation on a 2-core machine. Seconds are means per step. The ratio compares an "
        "overlapped run with the colocated run at the same (s, d), and verl's separate_async with colocated (1, 1).",
        ["run", "steps/s", "ratio", "step (s)", "wait for data (s)", "wait before push (s)", "push (s)", "training (s)", "rollout busy"],
        rows,
    )

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name in ("colocated s1d0", "colocated s1d1", "overlapped s1d1"):
        if name in runs:
            x, y = runs[name]["reward_curve"]
            ax.plot(x, y, marker=".", label=name)
    ax.set_xlabel("wall-clock training time (s, start-up excluded)")
    ax.set_ylabel("train reward (critic/score/mean)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "overlap_reward_wallclock.png", dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
