"""Overlapped vs colocated scheduler on the CPU end-to-end path, against the bound max(generation, training).

One real ``main_ppo`` run per setting (``opmd``, the demo's 8 prompts x 16 samples, no validation, seed 0),
all in one invocation: colocated and overlapped (``+cpu_rollout=standalone``) at each (s, d) of
``--settings`` (default (1, 1), (2, 1), (4, 1), (4, 0)). Steps 2.. are measured (step 1 holds the
generation of version 0's s + d batches and the warm-up). Per setting:

- steps/s of both modes (verl's ``timing_s/step``) and their ratio;
- the bound of overlap from the colocated run's own timings: a colocated step is generation (its
  ``offpolicy/wait_s``, per batch generated: ``gen``) plus everything else (``train`` = step − wait); with
  generation entirely hidden behind training, or training behind generation, a step takes
  max(gen, train), so overlapped steps/s ≤ 1 / max(gen, train) (on separate devices; here both share
  the same 2 cores);
- the bound the cores set (:mod:`_cpu_account`): the machine's busy CPU seconds per step over the same steps,
  for both modes; ``cores / CPU seconds per step`` of the overlapped run is the most steps/s its work allows
  on this machine (all cores busy, nothing waiting), and where that CPU goes, by process;
- the rollout's busy seconds per batch in the overlapped run (``offpolicy/rollout_busy_fraction`` x wall
  time, over the batches generated): the cost of generating one batch per server batch (streaming);
- per overlapped step, what the trainer waited for: B_t (``offpolicy/wait_s``), in-flight batches before a
  weight push (``offpolicy/sync_wait_s``), the push (``timing_s/update_weights``), training
  (``update_actor`` + ``old_log_prob`` + ``ref`` + ``adv``), the rest.

Before the runs, the rollout server alone (``tests/scenario_rollout.py::rollout_batching_cost``, no trainer):
4 x 128 requests as one server batch (a version's batches in one call) vs as 4 server batches (streamed),
the batching efficiency streaming gives up.

Also a reward vs wall-clock plot of colocated and overlapped at ``--plot-setting`` (default 4,1), same seed:
the same rewards step by step, reached sooner.

``--variants`` adds runs per setting, each in a table against the mode it varies (:data:`VARIANTS`):
``colocated-all-cores``, colocated with its trainer on all cores (Ray sets OMP_NUM_THREADS=1 in a worker
that asks no CPUs and verl's training workers ask none, so by default both modes' trainers compute on one
core: the overlapped mode's right split on 2 cores, the rollout has the other; colocated, the second core
idles while it trains); ``overlapped-unordered``, the overlapped mode with the agent loop that does not
order a version's batches (the server still does).

    python benchmarks/bench_overlap.py [--steps 12] [--settings 1,1 2,1 4,1 4,0] [--verl-async] [--variants
    colocated-all-cores overlapped-unordered]
    python benchmarks/bench_overlap.py --quick   # one round of (2, 1) and (4, 1): before and after a change to
    the overlapped path

Writes benchmarks/results/overlap.md (tables, load, command) and benchmarks/results/overlap_reward_wallclock.png
(``--name overlap_repeat``: overlap_repeat.md and overlap_repeat_reward_wallclock.png, e.g. for a second invocation).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from _cpu_account import CpuAccount  # benchmarks/_cpu_account.py
from _results import RESULTS, command_line, measured_commit, write_table  # benchmarks/_results.py

from verl_offpolicy.demo.errors import DemoError
from verl_offpolicy.demo.run import run_demo
from verl_offpolicy.glue.registration import SEEDED_AGENT_LOOP

NO_VALIDATION = ["trainer.val_before_train=false", "trainer.test_freq=-1"]
QUICK_SETTINGS = ("2,1", "4,1")  # --quick: where overlap gains most, and fell back first
QUICK_NAME = "overlap_quick"
STANDALONE = ["+cpu_rollout=standalone"]
TRAIN_TIMERS = ("update_actor", "old_log_prob", "ref", "adv")
# --variants: extra runs per setting, each against the mode it varies: name -> (base mode, overrides, what it is)
VARIANTS = {
    "colocated-all-cores": (
        "colocated",
        [f"+ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS='{os.cpu_count()}'"],
        "colocated with its trainer on all cores (above, both modes' trainers compute on one core, Ray's default "
        "for a worker that asks no CPUs; colocated, the other core idles while it trains)",
    ),
    "overlapped-unordered": (
        "overlapped",
        STANDALONE + [f"actor_rollout_ref.rollout.agent.default_agent_loop={SEEDED_AGENT_LOOP}"],
        "overlapped with the unordered agent loop (the server still generates B_t first; the agent loop works on "
        "a version's batches interleaved, as before ordered_single_turn_agent)",
    ),
}


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f} (1, 5, 15 min) on {os.cpu_count()} cores"


def _run(name: str, overrides: list[str], steps: int, workdir: Path, attempts: int = 3):
    """One demo run; started again (at most ``attempts`` times) when Ray's node does not come up within its fixed
    30 s (a loaded machine), the only failure retried."""
    for attempt in range(1, attempts + 1):
        output_dir = workdir / f"{name}_{attempt}"
        try:
            with CpuAccount(output_dir) as account:
                result = run_demo(
                    preset="opmd",
                    steps=steps,
                    seed=0,
                    output_dir=output_dir,
                    timeout=3600,
                    overrides=NO_VALIDATION + overrides,
                    stream=False,
                    plot=False,
                )
            return result, account.result(first_step=1)
        except DemoError as exc:
            if "timed out during startup" not in str(exc) or attempt == attempts:
                raise
            print(f"[bench] {name}: Ray's node did not start in time (load {_load()}); again", flush=True)


def measure(name: str, overrides: list[str], steps: int, workdir: Path) -> dict:
    load_before = _load()
    result, cpu = _run(name, overrides, steps, workdir)
    all_steps = result.metrics
    ms = all_steps[1:]  # step 1 includes the generation of every batch of version 0 and the warm-up
    step_s = [m["timing_s/step"] for m in ms]
    wait = [m.get("offpolicy/wait_s", 0.0) for m in ms]
    generated = sum(m.get("offpolicy/generated_batches", 0.0) for m in ms)
    # overlapped: rollout busy seconds (the fraction is over the wall time since the previous step)
    busy_s = [
        m["offpolicy/rollout_busy_fraction"] * m["timing_s/step"]
        for m in all_steps
        if "offpolicy/rollout_busy_fraction" in m
    ]
    all_generated = sum(m.get("offpolicy/generated_batches", 0.0) for m in all_steps)
    elapsed, wall = [], 0.0
    for m in all_steps:
        wall += m["timing_s/step"]
        elapsed.append(wall)
    per_step = []
    for m in all_steps:
        train = sum(m.get(f"timing_s/{k}", 0.0) for k in TRAIN_TIMERS)
        sync_wait = m.get("offpolicy/sync_wait_s", 0.0)  # timed inside update_weights (the push waits first)
        parts = (m.get("offpolicy/wait_s", 0.0), sync_wait, m.get("timing_s/update_weights", 0.0) - sync_wait, train)
        per_step.append(
            (int(m["step"]), int(m["offpolicy/version"]), *parts, m["timing_s/step"] - sum(parts), m["timing_s/step"])
        )
    return {
        "name": name,
        "steps_per_s": len(step_s) / sum(step_s),
        "step_s": _mean(step_s),
        "wait_s": _mean(wait),
        "sync_wait_s": _mean(m.get("offpolicy/sync_wait_s", 0.0) for m in ms),
        "push_s": _mean(m.get("timing_s/update_weights", 0.0) - m.get("offpolicy/sync_wait_s", 0.0) for m in ms),
        "train_s": _mean(sum(m.get(f"timing_s/{k}", 0.0) for k in TRAIN_TIMERS) for m in ms),
        # colocated: generation per batch generated, and the rest of a step (the two parts of the bound)
        "gen_per_batch": sum(wait) / generated if generated else float("nan"),
        "rest_s": _mean(s - w for s, w in zip(step_s, wait)),
        "busy_per_batch": sum(busy_s) / all_generated if busy_s and all_generated else float("nan"),
        "per_step": per_step,
        "rewards": [m["critic/score/mean"] for m in all_steps],
        "elapsed": elapsed,
        "load": f"before: {load_before}; after: {_load()}",
        "cpu": cpu,  # CPU seconds per step over the same steps (_cpu_account.py)
    }


def measure_batching() -> dict:
    """The hf server alone: a version's 4 x 128 requests as one server batch vs 4 streamed ones (fresh CPU process)."""
    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root))  # the repository's tests package (the scenario runs in a process of its own)
    from tests.cpu_harness import isolated

    with tempfile.TemporaryDirectory(prefix="vo-bench-batching-") as tmp:
        result = isolated("tests.scenario_rollout:rollout_batching_cost", timeout=900, workdir=tmp)
    result["load"] = _load()
    return result


def _round_tag(r: int) -> str:
    """The suffix of round ``r``'s run names (the first round's runs carry none)."""
    return "" if r == 1 else f" #{r}"


def _of_cpu_bound(run: dict) -> float:
    """The run's steps/s over the most its CPU work allows on this machine's cores (cores / CPU seconds per step)."""
    return run["steps_per_s"] * run["cpu"]["cpu_per_step"] / os.cpu_count()


def _x(value: float, digits: int = 2) -> str:
    return "" if value != value else f"{value:.{digits}f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--settings", nargs="+", default=["1,1", "2,1", "4,1", "4,0"])
    parser.add_argument("--plot-setting", default="4,1", help="(s, d) of the reward vs wall-clock plot")
    parser.add_argument(
        "--verl-async", action="store_true", help="also run verl's own separate_async (vs colocated (1, 1))"
    )
    parser.add_argument("--overrides", nargs="*", default=[], help="extra Hydra overrides for every run")
    parser.add_argument("--variants", nargs="*", default=[], choices=sorted(VARIANTS), help="extra runs per setting")
    parser.add_argument("--name", default="overlap", help="results file stem (benchmarks/results/<name>.md)")
    parser.add_argument("--rounds", type=int, default=1, help="pairs of runs per setting (the first round is detailed)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"the guard a change to the overlapped path runs before and after (docs/testing.md): one round of "
        f"{' and '.join(QUICK_SETTINGS)}, the settings whose overlap is most sensitive, into results/{QUICK_NAME}.md",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.settings, args.rounds, args.name, args.plot_setting = (
            list(QUICK_SETTINGS),
            1,
            QUICK_NAME,
            QUICK_SETTINGS[-1],
        )
    settings = [tuple(int(x) for x in s.split(",")) for s in args.settings]

    plan = []
    for r in range(1, args.rounds + 1):  # round after round, each over every setting; variants in the first
        for s, d in settings:
            schedule = [f"algorithm.offpolicy.sync_interval={s}", f"algorithm.offpolicy.sync_offset={d}"]
            tag = f"s{s}d{d}{_round_tag(r)}"
            plan += [(f"colocated {tag}", schedule), (f"overlapped {tag}", schedule + STANDALONE)]
            plan += [(f"{variant} {tag}", schedule + VARIANTS[variant][1]) for variant in args.variants if r == 1]
    if args.verl_async:
        plan.append(("verl separate_async", STANDALONE + ["trainer.v1.trainer_mode=separate_async"]))
    runs: dict[str, dict] = {}
    started = time.time()
    print(f"[bench] rollout server batching (load {_load()}) ...", flush=True)
    batching = measure_batching()
    print(f"[bench] {batching}", flush=True)
    with tempfile.TemporaryDirectory(prefix="vo-bench-overlap-") as tmp:
        for name, overrides in plan:
            print(f"[bench] {name}: {args.steps} steps (load {_load()}) ...", flush=True)
            runs[name] = measure(re.sub(r"\W", "_", name), overrides + args.overrides, args.steps, Path(tmp))
            r = runs[name]
            print(
                f"[bench] {name}: {r['steps_per_s']:.3f} steps/s, step {r['step_s']:.2f} s, wait {r['wait_s']:.2f} s",
                flush=True,
            )
            report(
                args, argv, settings, runs, batching, (time.time() - started) / 60
            )  # after every run: a partial table
    return 0


def _cpu_tables(runs: dict, settings: list) -> str:
    """The cores as the bound (per setting: both modes' CPU seconds per step, the overlapped run's CPU bound and its
    share of it) and where the overlapped runs' CPU goes, by process; "" without CPU accounting."""
    cores = os.cpu_count()
    done = [(s, d) for s, d in settings if runs[f"colocated s{s}d{d}"]["cpu"] and runs[f"overlapped s{s}d{d}"]["cpu"]]
    if not done:
        return ""
    rows, names = [], []
    for s, d in done:
        col, ovl = runs[f"colocated s{s}d{d}"], runs[f"overlapped s{s}d{d}"]
        c, o = col["cpu"], ovl["cpu"]
        cpu_bound = cores / o["cpu_per_step"]
        rows.append(
            f"| ({s}, {d}) | {c['cpu_per_step']:.2f} / {o['cpu_per_step']:.2f} | "
            f"{c['cpu_per_step'] / c['wall_per_step'] / cores:.2f} / "
            f"{o['cpu_per_step'] / o['wall_per_step'] / cores:.2f} | "
            f"{cpu_bound:.3f} | {cpu_bound / col['steps_per_s']:.2f}x | {_of_cpu_bound(ovl):.2f} |"
        )
        names += [n for n in o["by_process"] if n not in names]
    by_process = [
        f"| {n} | "
        + " | ".join(_x(runs[f"overlapped s{s}d{d}"]["cpu"]["by_process"].get(n, 0.0)) for s, d in done)
        + " |"
        for n in names[:10]
    ]
    return (
        f"The {cores} cores as the bound (`benchmarks/_cpu_account.py`: the machine's busy CPU seconds over the same "
        f"steps, per step; busy = of all {cores} cores; CPU bound = {cores} / the overlapped run's CPU seconds "
        "per step, "
        "the most steps/s its work allows on these cores):\n\n"
        "| (s, d) | CPU (s/step) col / ovl | busy col / ovl | CPU bound (steps/s) | CPU bound / colocated | "
        "overlapped of CPU bound |\n"
        "|---|---:|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n\n"
        "Where the overlapped runs' CPU goes (CPU seconds per step, by process; verl's Ray actors by class):\n\n"
        "| process | "
        + " | ".join(f"({s}, {d})" for s, d in done)
        + " |\n|---|"
        + "---:|" * len(done)
        + "\n"
        + "\n".join(by_process)
        + "\n\n"
    )


def _rounds_table(runs: dict, settings: list, rounds: int, commit: str) -> str:
    """Per setting, every round's ratio, the ratio of the mean steps/s, the overlapped runs' share of their
    CPU bound and the commit measured; "" for one round."""
    if rounds == 1:
        return ""
    lines = [
        f"Every round (a colocated and an overlapped run per setting; rounds one after the other, {rounds} "
        "planned): overlapped / colocated steps/s per round, the ratio of the mean steps/s, and the overlapped "
        "run's share of its CPU bound per round:\n",
        "| (s, d) | ratio per round | mean colocated / overlapped steps/s | ratio of means | overlapped of CPU "
        "bound per round | commit |",
        "|---|---|---:|---:|---|---|",
    ]
    for s, d in settings:
        tags = [_round_tag(r) for r in range(1, rounds + 1)]
        pairs = [
            (runs[f"colocated s{s}d{d}{t}"], runs[f"overlapped s{s}d{d}{t}"])
            for t in tags
            if f"colocated s{s}d{d}{t}" in runs and f"overlapped s{s}d{d}{t}" in runs
        ]
        col, ovl = _mean(c["steps_per_s"] for c, _ in pairs), _mean(o["steps_per_s"] for _, o in pairs)
        lines.append(
            f"| ({s}, {d}) | "
            + ", ".join(f"{o['steps_per_s'] / c['steps_per_s']:.2f}x" for c, o in pairs)
            + f" | {col:.3f} / {ovl:.3f} | {ovl / col:.2f}x | "
            + ", ".join(_x(_of_cpu_bound(o)) if o["cpu"] else "" for _, o in pairs)
            + f" | {commit} |"
        )
    return "\n".join(lines) + "\n\n"


def report(args, argv, settings, runs: dict, batching: dict, minutes: float) -> None:
    """Write overlap.md (the settings both of whose runs are done) and the reward plot."""
    planned = len(settings)
    settings = [(s, d) for s, d in settings if f"colocated s{s}d{d}" in runs and f"overlapped s{s}d{d}" in runs]
    partial = "" if len(settings) == planned else f" PARTIAL: {len(settings)} of {planned} settings done so far."
    rows = []
    for s, d in settings:
        c, o = runs[f"colocated s{s}d{d}"], runs[f"overlapped s{s}d{d}"]
        bound = 1.0 / max(c["gen_per_batch"], c["rest_s"]) if c["gen_per_batch"] == c["gen_per_batch"] else float("nan")
        rows.append(
            [
                f"({s}, {d})",
                f"{c['steps_per_s']:.3f}",
                f"{o['steps_per_s']:.3f}",
                f"{o['steps_per_s'] / c['steps_per_s']:.2f}x",
                _x(c["gen_per_batch"]),
                _x(c["rest_s"]),
                _x(bound, 3),
                _x(bound / c["steps_per_s"]) + "x",
                _x(o["steps_per_s"] / bound) if bound == bound else "",
                _x(o["wait_s"]),
                _x(o["sync_wait_s"]),
                _x(o["push_s"]),
                f"{c['train_s']:.2f} / {o['train_s']:.2f}",
                _x(o["busy_per_batch"]),
            ]
        )
    if "verl separate_async" in runs:
        v, c = runs["verl separate_async"], runs.get("colocated s1d1")
        ratio = f"{v['steps_per_s'] / c['steps_per_s']:.2f}x vs colocated (1, 1)" if c else ""
        rows.append(
            [
                "verl separate_async",
                "",
                f"{v['steps_per_s']:.3f}",
                ratio,
                "",
                "",
                "",
                "",
                "",
                _x(v["wait_s"]),
                "",
                _x(v["push_s"]),
                f"/ {v['train_s']:.2f}",
                "",
            ]
        )

    breakdown = []
    for s, d in settings:
        o = runs[f"overlapped s{s}d{d}"]
        breakdown += [
            f"\n### What the overlapped trainer waits for, per step: (s, d) = ({s}, {d})\n",
            "| step | version | wait for B_t (s) | wait before push (s) | push (s) | training (s) | rest (s) | "
            "step (s) |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        breakdown += [
            "| " + " | ".join([str(p[0]), str(p[1])] + [f"{x:.2f}" for x in p[2:]]) + " |" for p in o["per_step"]
        ]
    cpu_table = _cpu_tables(runs, settings)
    rounds_table = _rounds_table(runs, settings, args.rounds, measured_commit())
    runs_per = (
        "one run" if args.rounds == 1 else f"{args.rounds} runs (rounds; every table but the rounds table is the first)"
    )
    loads = "\n".join(f"- {name}: {r['load']}" for name, r in runs.items())
    variant_tables = ""
    for variant, (base, overrides, what) in VARIANTS.items():
        done = [(s, d) for s, d in settings if f"{variant} s{s}d{d}" in runs]
        if not done:
            continue
        lines = [
            f"`{variant}`: {what}; `{' '.join(overrides)}`:\n",
            f"| (s, d) | {base} steps/s | {variant} steps/s | {variant} / {base} | training (s) {base} / "
            f"{variant} | wait for B_t (s) {base} / {variant} |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for s, d in done:
            b, v = runs[f"{base} s{s}d{d}"], runs[f"{variant} s{s}d{d}"]
            lines.append(
                f"| ({s}, {d}) | {b['steps_per_s']:.3f} | {v['steps_per_s']:.3f} | "
                f"{v['steps_per_s'] / b['steps_per_s']:.2f}x | "
                f"{b['train_s']:.2f} / {v['train_s']:.2f} | {b['wait_s']:.2f} / {v['wait_s']:.2f} |"
            )
        variant_tables += "\n".join(lines) + "\n\n"
    write_table(
        f"{args.name}.md",
        "Overlapped vs colocated scheduler on the CPU end-to-end path",
        command_line("bench_overlap.py", argv),
        f"opmd, 8 prompts x 16 samples, 8-token responses, {args.steps} steps (step 1 excluded), no validation, "
        "seed 0; "
        f"{runs_per} per mode and setting, all in one invocation ({minutes:.0f} min) on a {os.cpu_count()}-core "
        "machine. "
        "Seconds are means per step unless said otherwise. gen = the colocated run's generation per batch generated; "
        "train = the rest of its step; bound = 1 / max(gen, train) steps/s, the most overlap can give if generation "
        "and training did not share the cores; 'of bound' = overlapped steps/s / bound. Overlapped columns: the "
        "wait for B_t, the wait for in-flight batches before a weight push, the push; training (colocated / "
        "overlapped: the same work, slower when the rollout generates on the same cores); rollout busy s per batch "
        "= the rollout server's generation time per batch generated." + partial,
        [
            "(s, d)",
            "colocated steps/s",
            "overlapped steps/s",
            "ratio",
            "gen (s/batch)",
            "train (s)",
            "bound (steps/s)",
            "bound / colocated",
            "of bound",
            "wait for B_t (s)",
            "wait before push (s)",
            "push (s)",
            "training (s) col / ovl",
            "rollout busy (s/batch)",
        ],
        rows,
        after=(
            rounds_table
            + cpu_table
            + variant_tables
            + f"Streaming's cost to the rollout (the hf server alone, {batching['num_threads']} thread, "
            f"`tests/scenario_rollout.py::rollout_batching_cost`): {batching['batches']} x "
            f"{batching['per_batch']} sampled "
            f"requests of 8 tokens take {batching['one_batch_s']:.2f} s as one server batch (a version's batches "
            "in one "
            f"call) and {batching['streamed_s']:.2f} s as {batching['batches']} streamed server batches "
            f"({batching['streamed_s'] / batching['one_batch_s']:.2f}x; fastest of 3 rounds each; load "
            f"{batching['load']}).\n\n"
            f"Machine load (`os.getloadavg`) at the start and end of each run:\n\n{loads}\n" + "\n".join(breakdown)
        ),
    )

    s, d = (int(x) for x in args.plot_setting.split(","))
    pair = [f"colocated s{s}d{d}", f"overlapped s{s}d{d}"]
    if all(name in runs for name in pair):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax, ax_steps) = plt.subplots(1, 2, figsize=(11, 4))
        for name, marker in zip(pair, ("o", "x")):
            r = runs[name]
            ax.plot(r["elapsed"], r["rewards"], marker=marker, label=name)
            ax_steps.plot(range(1, len(r["rewards"]) + 1), r["rewards"], marker=marker, label=name)
        ax.set_xlabel("wall-clock training time (s, start-up excluded)")
        ax.set_ylabel("train reward (critic/score/mean)")
        ax.set_title(f"(s, d) = ({s}, {d}), seed 0: reward vs wall clock")
        ax_steps.set_xlabel("training step")
        ax_steps.set_title("the same rewards per step")
        for a in (ax, ax_steps):
            a.legend()
        fig.tight_layout()
        fig.savefig(RESULTS / f"{args.name}_reward_wallclock.png", dpi=120)
        plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
