"""The CPU demo with several presets at the same seed: does each one learn the repeat task?

One ``verl-offpolicy demo`` run per preset (stock ``main_ppo``, ``offpolicy_trainer``, the demo's
8 prompts x 16 samples, 40 steps by default), then a table of the mean training reward of the
first and last 5 steps, the greedy validation reward before and after, and the run time.

    python benchmarks/demo_presets.py [--presets grpo opmd agro agro:algorithm.offpolicy.beta=0.1] [--steps 40]

A run is ``<preset>`` or ``<preset>:<override>[,<override>...]`` (Hydra overrides for that run only).
``agro`` runs with the demo's β = 0.01 for this task (``verl_offpolicy.demo.models``, the tiny model's
``task_overrides``);
``agro:algorithm.offpolicy.beta=0.1`` shows the preset's β.

Writes benchmarks/results/demo_presets.md (``--output`` names another file) and one reward-curve PNG per run
next to it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from _results import RESULTS, command_line, write_table  # benchmarks/_results.py (this script's folder is on sys.path)

from verl_offpolicy.demo.run import run_demo


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--presets",
        nargs="+",
        default=["grpo", "opmd", "rec_oneside_nois", "agro", "agro:algorithm.offpolicy.beta=0.1"],
    )
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="demo_presets.md", help="the table's file name in benchmarks/results/")
    args = parser.parse_args(argv)

    RESULTS.mkdir(exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="vo-demo-presets-") as tmp:
        for index, spec in enumerate(args.presets):
            preset, _, extra = spec.partition(":")
            overrides = [o for o in extra.split(",") if o]
            print(f"[demo-presets] {spec}: {args.steps} steps ...", flush=True)
            result = run_demo(
                preset=preset,
                steps=args.steps,
                seed=args.seed,
                output_dir=Path(tmp) / f"{index}-{preset}",
                timeout=1800,
                overrides=overrides,
                config_name="offpolicy_trainer",
                stream=False,
            )
            rewards = result.rewards
            # e.g. agro + algorithm.offpolicy.beta=0.1 -> demo_agro_beta0.1.png
            tag = preset + "".join("_" + o.split("=", 1)[0].rsplit(".", 1)[-1] + o.split("=", 1)[1] for o in overrides)
            shutil.copy(result.plot_path, RESULTS / f"demo_{tag}.png")
            rows.append(
                {
                    "preset": spec.replace(":", " ").replace(",", " "),
                    "first5": sum(rewards[:5]) / 5,
                    "last5": sum(rewards[-5:]) / 5,
                    "val_before": result.validation.get(0, float("nan")),
                    "val_after": result.validation.get(args.steps, float("nan")),
                    "total_s": result.timings["total_s"],
                    "step_s": result.timings["mean_step_s"],
                }
            )
            print(f"[demo-presets] {rows[-1]}", flush=True)
    write_table(
        args.output,
        "CPU demo: reward at the start and the end, per preset",
        command_line("demo_presets.py", argv),
        f"Stock `main_ppo` + `offpolicy_trainer`, tiny Llama, repeat task, 8 prompts x 16 samples, {args.steps} steps, "
        f"seed {args.seed}, 2-core CPU. Reward curves: `benchmarks/results/demo_<preset>.png`.",
        [
            "preset",
            "train reward, first 5 steps",
            "last 5 steps",
            "greedy validation, step 0",
            "last step",
            "run (s)",
            "s/step",
        ],
        [
            [
                r["preset"],
                f"{r['first5']:.3f}",
                f"{r['last5']:.3f}",
                f"{r['val_before']:.3f}",
                f"{r['val_after']:.3f}",
                f"{r['total_s']:.0f}",
                f"{r['step_s']:.2f}",
            ]
            for r in rows
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
