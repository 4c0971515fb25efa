"""The end-to-end tests' demo runs: their overrides, the session's shared runs and resumed runs, and
what the tests read back from a run's output (verl's rollout dumps, checkpoints).

- :class:`DemoRuns`: :class:`tests.jobs.SharedJobs` plus demo runs (:meth:`DemoRuns.start`, once per
  configuration); conftest's ``demo_runs`` fixture is the session's one.
- :func:`opmd_run`: the scheduler's and the overlapped mode's small ``opmd`` runs at (s, d).
- :func:`start_resumed`: a run resumed from another run's checkpoint, queued once that run is done.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from tests.jobs import SharedJob, SharedJobs
from verl_offpolicy.demo.process import RAY_SUBDIR


def demo_command(out: Path, steps: int, *args: str, preset: str = "opmd") -> list[str]:
    """``python -m verl_offpolicy.cli demo`` as the end-to-end tests start it: ``preset``, ``steps`` training
    steps into ``out``, then ``args`` (options and Hydra overrides)."""
    return [
        sys.executable,
        "-m",
        "verl_offpolicy.cli",
        "demo",
        "--preset",
        preset,
        "--steps",
        str(steps),
        "--output-dir",
        str(out),
        *args,
    ]


# Demo overrides of the end-to-end tests: no validation, 4 prompts x 4 samples per step (the demo's default is 8 x 16).
NO_VALIDATION = ["trainer.val_before_train=false", "trainer.test_freq=-1"]
SMALL_DEMO = NO_VALIDATION + [
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
]


PRIMARY_CONFIG = "offpolicy_trainer"
SCHEDULED_STEPS = 6  # steps of the scheduler's shared runs: (4, 1) trains its first new version at step 6
SHARED_RUN_TIMEOUT = 600
STANDALONE = ["+cpu_rollout=standalone"]  # the overlapped mode's rollout on its own worker


def ranks(n: int, micro_batch: int) -> list[str]:
    """The overrides of ``n`` training ranks (FSDP2 processes on gloo, one fake Ray GPU each, one colocated
    ``hf`` rollout replica each) that split every batch into micro-batches of ``micro_batch`` samples per rank
    (it must divide a rank's share: the CPU guard says so otherwise)."""
    micro_keys = (
        "actor.ppo_micro_batch_size_per_gpu",
        "rollout.log_prob_micro_batch_size_per_gpu",
        "ref.log_prob_micro_batch_size_per_gpu",
    )
    return [f"trainer.n_gpus_per_node={n}"] + [f"actor_rollout_ref.{key}={micro_batch}" for key in micro_keys]


def schedule(s: int, d: int) -> list[str]:
    """The overrides of ``sync_interval = s``, ``sync_offset = d``."""
    return [f"algorithm.offpolicy.sync_interval={s}", f"algorithm.offpolicy.sync_offset={d}"]


# The pair of runs at (2, 1) (the colocated run, and the overlapped cluster run: tests/scenario_cluster.py) trains on
# two ranks, one micro-batch of 8 samples each, and the overlapped run's rollout has two replicas: the weights go
# from two training ranks to two rollout replicas, and the pair must still train the same samples (a seeded
# request samples the same tokens on any replica: verl_offpolicy.cpu.sampling.request_seed).
PAIR = (2, 1)
PAIR_RANKS = ranks(2, micro_batch=8)
PAIR_REPLICAS = ["actor_rollout_ref.rollout.n_gpus_per_node=2"]
# The pair validates at step 3 (inside version 2: the overlapped rollout holds version 2 then) and at its last step.
PAIR_TEST_FREQ = 3


def opmd_overrides(s: int, d: int, mode: str) -> list[str]:
    """The overrides of the scheduler's small ``opmd`` runs at (s, d): 4 prompts x 4 samples, no
    validation; ``mode`` is ``colocated`` or ``overlapped`` (the standalone rollout); at :data:`PAIR`, two
    training ranks, (overlapped) two rollout replicas, and validation every :data:`PAIR_TEST_FREQ` steps."""
    assert mode in ("colocated", "overlapped"), mode
    overlapped = mode == "overlapped"
    small = SMALL_DEMO
    pair = []
    if (s, d) == PAIR:
        pair = PAIR_RANKS + (PAIR_REPLICAS if overlapped else [])
        small = [f"trainer.test_freq={PAIR_TEST_FREQ}" if o == "trainer.test_freq=-1" else o for o in SMALL_DEMO]
    return small + schedule(s, d) + (STANDALONE if overlapped else []) + pair


def opmd_run(demo_runs, s: int, d: int, mode: str, extra: Sequence[str] = ()):
    """The future of the ``opmd`` run at (s, d) of the scheduler's and the overlapped mode's tests (one
    per mode and setting, shared through :class:`DemoRuns`): :func:`opmd_overrides` + ``extra``, 6
    steps, on our primary config."""
    overrides = opmd_overrides(s, d, mode) + list(extra)
    return demo_runs.start(
        "opmd", SCHEDULED_STEPS, overrides, PRIMARY_CONFIG, opmd_timeout(s, d), name=f"opmd_{mode}_s{s}d{d}"
    )


def opmd_timeout(s: int, d: int) -> float:
    """Seconds before an ``opmd`` run at (s, d) is killed: twice the shared runs' at :data:`PAIR` (two ranks)."""
    return SHARED_RUN_TIMEOUT * (2 if (s, d) == PAIR else 1)


# The learning run: the demo's defaults (8 prompts x 16 samples, greedy validation before training and every 10
# steps) through verl's stock config and trainer, for its first 20 steps (the demo's default is 40): the same
# configuration learns most of the task by then (benchmarks/results/staleness_e2e/grpo__s1_d0__seed0__steps40.json,
# the same run on our trainer: train reward 0.081 over steps 1-5 -> 0.490 over steps 16-20, greedy validation
# 0.109 -> 0.891 at step 20). Its first steps are also the stock side of the sync-trainer comparison
# (tests/scheduler/test_scheduler_e2e.py).
LEARN_STEPS = 20
LEARN_TIMEOUT = 900


def learn_run(demo_runs):
    """The learning run (its console lines kept, its reward plot written): ``grpo`` on verl's ``ppo_trainer``
    with the demo's defaults, :data:`LEARN_STEPS` steps."""
    return demo_runs.start("grpo", LEARN_STEPS, [], "ppo_trainer", LEARN_TIMEOUT, name="learn", plot=True, console=True)


DAPO_STEPS = 4  # (2, 1): versions 0 0 0 2, two versions that generate
DAPO = [
    "algorithm.filter_groups.enable=true",
    "algorithm.filter_groups.metric=reward",
    "algorithm.filter_groups.max_num_gen_batches=8",
]


def dapo_run(demo_runs, mode: str, extra: Sequence[str] = (), name: str = ""):
    """The future of the filtered (DAPO dynamic sampling) ``opmd`` run at (2, 1) in ``mode``
    (tests/scheduler/test_filter_groups.py):
    :func:`opmd_overrides` + :data:`DAPO` (+ ``extra``), :data:`DAPO_STEPS` steps (the pair's two ranks, two replicas
    overlapped)."""
    return demo_runs.start(
        "opmd",
        DAPO_STEPS,
        opmd_overrides(*PAIR, mode) + DAPO + list(extra),
        PRIMARY_CONFIG,
        opmd_timeout(*PAIR),
        name=name or f"dapo_{mode}_s2d1",
    )


def dumped_batches(rollout_dir: Path, steps) -> dict[int, list[tuple]]:
    """Per step, the trained samples as sorted (prompt, response, score) from verl's rollout dumps
    (``trainer.rollout_data_dir``). Uids are left out: they are uuid4, new in every run; the content is
    what must match between runs."""
    out = {}
    for step in steps:
        rows = [json.loads(line) for line in (Path(rollout_dir) / f"{step}.jsonl").read_text().splitlines()]
        out[step] = sorted((r["input"], r["output"], r["score"]) for r in rows)
    return out


def dumped_uid_groups(rollout_dir: Path, steps) -> set[str]:
    """The prompt groups (uid prefixes) trained in ``steps``, from verl's rollout dumps."""
    return {
        json.loads(line)["uid"].split("_")[0]
        for step in steps
        for line in (Path(rollout_dir) / f"{step}.jsonl").read_text().splitlines()
    }


def demo_run_command(
    out: Path,
    preset: str,
    steps: int,
    overrides: Sequence[str],
    config_name: Optional[str] = None,
    model: Optional[str] = None,
) -> list[str]:
    """The ``main_ppo`` command of a demo run of ``model`` (default: the demo's) in ``out`` (seed 0, verl's rollout
    dumps in ``out/rollouts``) with a Ray session dir of its own: what :func:`run_resumed` starts."""
    from verl_offpolicy.demo.command import DEFAULT_CONFIG_NAME, DEFAULT_MODEL, build_inputs, demo_command

    out.mkdir(parents=True, exist_ok=True)
    model = model or DEFAULT_MODEL
    return demo_command(
        build_inputs(out, seed=0, model=model),
        output_dir=out,
        preset=preset,
        steps=steps,
        seed=0,
        overrides=[*overrides, f"trainer.rollout_data_dir={out / 'rollouts'}"],
        config_name=config_name or DEFAULT_CONFIG_NAME,
        ray_temp_dir=tempfile.mkdtemp(prefix="vo-ray-", dir="/tmp"),
        model=model,
    )


class DemoRuns(SharedJobs):
    """:class:`SharedJobs` and demo runs (:func:`verl_offpolicy.demo.run.run_demo`, seed 0, verl's rollout
    dumps in ``<out>/rollouts``; one per distinct preset, steps, overrides, config and environment)."""

    def __init__(self, tmp_path_factory, parallel: int = 2):
        from verl_offpolicy.demo.run import run_demo

        super().__init__(tmp_path_factory, parallel)
        self._run_demo = run_demo  # bound now: a test may monkeypatch the module's attribute while jobs run

    def start(
        self,
        preset: str,
        steps: int,
        overrides: Sequence[str],
        config_name: str,
        timeout: float,
        *,
        name: str = "run",
        plot: bool = False,
        env: Optional[dict[str, str]] = None,
        console: bool = False,
        model: Optional[str] = None,
    ) -> QueuedRun:
        """Queue the demo run (once per configuration). ``env``: variables set on top of :attr:`environ`;
        ``console``: keep the run's console lines (``run_demo(stream=...)``) in :attr:`QueuedRun.console`;
        ``model``: the demo model (default: the demo's)."""
        import io

        from verl_offpolicy.demo.models import DEFAULT_MODEL

        env, model = dict(env or {}), model or DEFAULT_MODEL
        key = ("run", preset, steps, tuple(overrides), config_name, plot, tuple(sorted(env.items())), console, model)

        def queue() -> QueuedRun:
            out, stream = self.tmp_dir(name), io.StringIO() if console else None
            job = self.submit(
                ("job",) + key,
                self._run_demo,
                preset=preset,
                steps=steps,
                seed=0,
                output_dir=out,
                timeout=timeout,
                overrides=[*overrides, f"trainer.rollout_data_dir={out / 'rollouts'}"],
                config_name=config_name,
                stream=stream or False,
                plot=plot,
                env={**self.environ, **env},
                model=model,
            )
            return QueuedRun(self, job.future, out, stream)

        return self.once(key, queue)


@dataclass(frozen=True)
class QueuedRun(SharedJob):
    """A demo run queued in :class:`DemoRuns`: also its output directory (known at once) and the stream
    that receives its console lines if they are kept. ``result()``: its
    :class:`~verl_offpolicy.demo.results.DemoResult`."""

    output_dir: Path = None
    console: Optional[Any] = None


def checkpoint_of(result, step: int) -> Path:
    """The ``global_step_<step>`` checkpoint a demo run saved (``trainer.save_freq``): the checkpoint an
    interruption right after that step would leave, since verl writes the tracker file
    (``latest_checkpointed_iteration.txt``) only once a checkpoint is complete."""
    checkpoint = Path(result.output_dir) / "checkpoints" / f"global_step_{step}"
    tracker = checkpoint.parent / "latest_checkpointed_iteration.txt"
    assert checkpoint.is_dir() and tracker.exists(), f"no complete step-{step} checkpoint in {checkpoint.parent}"
    return checkpoint


def run_resumed(
    command: Sequence[str], out: Path, timeout: float, env: Optional[dict[str, str]] = None
) -> tuple[str, dict[int, dict[str, Any]]]:
    """Run a resumed demo ``command`` to the end (log ``out/train.log``, metrics ``out/metrics.jsonl``;
    its Ray session dir removed afterwards, and the ``/dev/shm`` files of vLLM's kinds that it left, as the
    demo does: docs/vllm_cpu.md), from ``env`` (default: this process's environment); assert it exited 0 and
    return (log text, metrics by step)."""
    import shutil

    from verl_offpolicy.demo.environment import cpu_env
    from verl_offpolicy.demo.launch import run_subprocess
    from verl_offpolicy.demo.process import orphaned_since, remove_leftover_files, shared_memory_listing
    from verl_offpolicy.demo.results import read_metrics

    ray_dir = _ray_temp_dir(command)
    before = shared_memory_listing()
    try:
        returncode, _, _ = run_subprocess(
            command,
            env=cpu_env(out / "metrics.jsonl", base=env),
            log_path=out / "train.log",
            timeout=timeout,
            ray_marker=ray_dir,
            cwd=str(out),
        )
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
        remove_leftover_files(orphaned_since(before))
    log = (out / "train.log").read_text(errors="replace")
    assert returncode == 0, log[-4000:]
    return log, read_metrics(out / "metrics.jsonl")


def start_resumed(
    demo_runs: DemoRuns,
    reference: QueuedRun,
    step: int,
    *,
    preset: str,
    steps: int,
    overrides: Sequence[str],
    config_name: str,
    timeout: float,
    name: str,
    model: Optional[str] = None,
):
    """Queue a run that resumes ``reference``'s configuration (``overrides``, without its checkpointing; the demo's
    ``model``) from its step-``step`` checkpoint, once ``reference`` is done; its future gives (output dir, log,
    metrics by step) (:func:`run_resumed`)."""

    def job():
        out = demo_runs.tmp_dir(name) / "resumed"
        checkpoint = checkpoint_of(reference.result(), step)
        resumed = [*overrides, *resume_overrides(checkpoint)]
        command = demo_run_command(out, preset, steps, resumed, config_name, model=model)
        return (out, *run_resumed(command, out, timeout, env=demo_runs.environ))

    return demo_runs.submit(("resumed", name), job, after=[reference])


def resume_overrides(checkpoint: Path) -> list[str]:
    """Overrides that resume a demo run from ``checkpoint`` (a ``global_step_<k>`` dir) and save nothing more."""
    return [
        f"trainer.default_local_dir={checkpoint.parent}",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={checkpoint}",
        "trainer.save_freq=-1",
    ]


def _ray_temp_dir(command: Sequence[str]) -> str:
    """The Ray session dir a demo command was built with (``demo_command(..., ray_temp_dir=...)``)."""
    for arg in command:
        if arg.startswith("+ray_kwargs.ray_init._temp_dir=") or arg.startswith("ray_kwargs.ray_init._temp_dir="):
            ray_dir = Path(arg.split("=", 1)[1])
            return str(ray_dir.parent if ray_dir.name == RAY_SUBDIR else ray_dir)  # our private dir around Ray's
    raise ValueError("the command has no Ray temp dir: build it with demo_command(..., ray_temp_dir=...)")


def check_stopped_before_training_on_a_wrong_version(run) -> None:
    """The negative control of the observed-version check: ``run`` (a :class:`QueuedRun` whose weight pushes are
    tagged one version ahead, ``PUSH_VERSION_FAULT_ENV=1``) failed, saying step 1's batch came from version 1,
    before training anything."""
    from verl_offpolicy.demo.errors import DemoError

    try:
        run.result()
    except DemoError:
        pass
    else:
        raise AssertionError("the run whose pushes are tagged a version ahead did not fail")
    log = (run.output_dir / "train.log").read_text(errors="replace")
    assert (
        "step 1 is scheduled to train on a batch generated at version 0, but the rollout reports versions 1..1" in log
    ), log[-3000:]
    assert "step:1 - " not in log  # nothing was trained
