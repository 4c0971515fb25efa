"""End-to-end CPU demo: stock ``python -m verl.trainer.main_ppo`` on a tiny model, in a few minutes.

:func:`run_demo` builds the model and the task data of the chosen demo model (:mod:`.models`) into
``output_dir``, runs verl's real pipeline in a subprocess with the ``+cpu=demo`` overlay (plus the
algorithm preset and any extra Hydra overrides: :mod:`.command`), streams start-up phases and
per-step progress to the console (:mod:`.progress`), and finally reads verl's file logger (JSONL,
:mod:`.results`) and writes a reward-curve PNG (:mod:`.plot`). The subprocess runs in its own
process group and its own Ray temp dir (:mod:`.launch`): on timeout, failure, Ctrl-C or SIGTERM the
group is killed and every process of that Ray session is ended, so nothing is left behind (an
interrupted run raises :class:`~.errors.DemoInterrupted`, one line saying where its partial output is).

Files: everything a run writes is under ``output_dir`` or its Ray temp dir (removed after the run;
:mod:`.output_dir`, :mod:`.environment`). A lock file holds ``output_dir`` for one run at a time. Re-running
in the same ``output_dir`` continues the run there, from its latest checkpoint if it has one (verl's
``trainer.resume_mode=auto``), and keeps every earlier record: ``train.log`` and ``metrics.jsonl`` are
appended to, the restart marked in both (:mod:`.records`).
If the demo itself is SIGKILLed, ``main_ppo`` and its Ray session die with it (:mod:`.parent_death`) and
the next run removes the Ray temp dir it left (its owner process is dead).

Usage::

    from verl_offpolicy.demo.run import run_demo
    result = run_demo(steps=40, output_dir="runs/cpu_demo")
    print(result.reward_start, result.reward_end, result.timings)
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, TextIO

from verl_offpolicy.cpu.registration import FSDP_RUN_SKIPS, SKIP_ENGINES_ENV
from verl_offpolicy.demo.cluster import joins_cluster, worker_env_overrides
from verl_offpolicy.demo.command import DEFAULT_CONFIG_NAME, DemoInputs, build_inputs, cpu_engine, demo_command
from verl_offpolicy.demo.environment import cpu_env, run_files_env
from verl_offpolicy.demo.errors import DemoError, DemoInputError, DemoInterrupted
from verl_offpolicy.demo.launch import failure_message, run_subprocess, tail
from verl_offpolicy.demo.model_size import model_size
from verl_offpolicy.demo.models import DEFAULT_MODEL, get_model
from verl_offpolicy.demo.output_dir import (
    LOG_NAME,
    METRICS_NAME,
    PLOT_NAME,
    SUMMARY_NAME,
    OutputDirLock,
    prepare_output_dir,
)
from verl_offpolicy.demo.parent_death import launcher
from verl_offpolicy.demo.plot import PlotUnavailable, write_plot
from verl_offpolicy.demo.process import (
    Interrupt,
    InterruptSignals,
    make_owned_temp_dir,
    remove_dead_owners_dirs,
    retry_ray_start,
)
from verl_offpolicy.demo.progress import StartupPhases, plain_summary, progress_line
from verl_offpolicy.demo.records import continued_step, log_banner, merge_part, start_records
from verl_offpolicy.demo.results import (
    DemoResult,
    missing_steps,
    read_metrics,
    rollout_vs_trainer_gap,
    run_timings,
    training_metrics,
    validation_rewards,
)

RAY_DIR_PREFIX = "vo-ray-"


@dataclass(frozen=True)
class DemoRun:
    """What one run of :func:`run_demo` does (its arguments, with ``output_dir`` created and the environment read)."""

    preset: str
    steps: int
    seed: int
    output_dir: Path
    timeout: float
    overrides: tuple[str, ...]
    config_name: str
    model: str
    plot: bool
    base_env: dict[str, str]

    @property
    def log_path(self) -> Path:
        return self.output_dir / LOG_NAME

    @property
    def metrics_path(self) -> Path:
        return self.output_dir / METRICS_NAME

    def command(self, inputs: DemoInputs, ray_temp_dir: str) -> list[str]:
        """This run's ``main_ppo`` command line (:func:`~verl_offpolicy.demo.command.demo_command`)."""
        return demo_command(
            inputs,
            output_dir=self.output_dir,
            preset=self.preset,
            steps=self.steps,
            seed=self.seed,
            overrides=self.overrides,
            config_name=self.config_name,
            ray_temp_dir=ray_temp_dir,
            model=self.model,
        )


def run_demo(
    preset: str = "grpo",
    steps: int = 40,
    seed: int = 0,
    output_dir: Optional[str | os.PathLike] = None,
    *,
    timeout: float = 900.0,
    overrides: Iterable[str] = (),
    config_name: str = DEFAULT_CONFIG_NAME,
    stream: bool | TextIO = True,
    plot: bool = True,
    model: str = DEFAULT_MODEL,
    env: Optional[Mapping[str, str]] = None,
) -> DemoResult:
    """Train a model on its task through stock ``main_ppo`` on the CPU (by default the tiny model on the repeat task).

    Args:
        preset: ``grpo`` (verl's GRPO, vanilla loss) or an algorithm preset name
            (``+algorithm=<preset>``, see :func:`verl_offpolicy.demo.command.preset_overrides`).
        steps: training steps (``trainer.total_training_steps``).
        seed: seeds the model init, the data order and the rollout sampler.
        output_dir: where model, data, log, metrics and plot go (default: a new temp dir); one run
            at a time (:class:`~verl_offpolicy.demo.output_dir.OutputDirLock`).
        timeout: seconds before the run is killed (and a :class:`DemoError` raised).
        overrides: extra Hydra overrides, applied last.
        config_name: primary config (``ppo_trainer``; e.g. ``offpolicy_trainer`` with its presets).
        stream: the console lines (start-up phases, a line per step, the summary): to stdout (True), to
            this text stream, or nowhere (False).
        plot: write ``reward_curve.png``.
        model: ``tiny`` or ``smollm2-135m`` (:mod:`verl_offpolicy.demo.models`).
        env: the environment the run starts from (default: this process's, read at the call); the CPU
            path's variables are added to it.

    Returns:
        :class:`DemoResult` with per-step metrics, validation rewards and timings.

    Raises:
        DemoInputError: before anything starts, if ``output_dir`` cannot be created or written, or
            another live run holds it, or ``timeout`` is not in (0, ``threading.TIMEOUT_MAX``].
        DemoInterrupted: on SIGINT (Ctrl-C) or SIGTERM in the main thread, after the run's processes
            and Ray temp dir are gone.
        DemoError: the run failed or timed out.
    """
    get_model(model)  # an unknown model fails before anything is created
    if not (math.isfinite(timeout) and 0 < timeout <= threading.TIMEOUT_MAX):  # the run's wait holds at most that
        raise DemoInputError(
            f"--timeout must be a number of seconds > 0 and at most {threading.TIMEOUT_MAX:.0f} (the longest wait this "
            f"platform's timers hold), got {timeout:g}"
        )
    # What killed runs (SIGKILL: nothing of theirs could clean up) left: their Ray temp dirs, owner dead.
    remove_dead_owners_dirs(RAY_DIR_PREFIX)
    run = DemoRun(
        preset=preset,
        steps=steps,
        seed=seed,
        output_dir=prepare_output_dir(
            output_dir if output_dir is not None else tempfile.mkdtemp(prefix="vo-cpu-demo-")
        ),
        timeout=timeout,
        overrides=tuple(overrides),
        config_name=config_name,
        model=model,
        plot=plot,
        base_env=dict(os.environ if env is None else env),
    )
    lock = OutputDirLock(run.output_dir).acquire()
    try:
        with InterruptSignals() as signals:
            try:
                return _run_locked(run, _console(stream), lock, signals)
            except Interrupt as exc:
                name = signal.Signals(exc.signum).name
                raise DemoInterrupted(
                    f"interrupted by {name}: the run's processes were stopped and its Ray temp dir removed; "
                    f"partial output in {run.output_dir} (log: {run.log_path})",
                    exc.signum,
                ) from None
    finally:
        lock.release()


def _run_locked(run: DemoRun, console: Optional[TextIO], lock: OutputDirLock, signals: InterruptSignals) -> DemoResult:
    """The run, with its output directory held: inputs, ``main_ppo``, then its results and summary."""
    t0 = time.monotonic()
    _say(console, f"[cpu-demo] preparing {get_model(run.model).preparing} ...")
    resumed = _resume_step(run, console)
    inputs = build_inputs(run.output_dir, seed=run.seed, model=run.model)
    listening: list[str] = []
    shared_memory: dict[str, list[str]] = {}

    def attempt_run(attempt: int) -> tuple[list[str], str, float, dict[str, float]]:
        # Short and unique: Ray puts unix sockets under it (path length limit) and we find its processes by it.
        ray_temp_dir = make_owned_temp_dir(RAY_DIR_PREFIX)
        command = run.command(inputs, ray_temp_dir)
        if attempt == 1:
            _say(
                console,
                f"[cpu-demo] output: {run.output_dir}; running {' '.join(command[:4])} ... (log: {run.log_path})\n"
                "[cpu-demo] start-up (Ray, TransferQueue, the training worker, the rollout server) takes one to "
                "several "
                "minutes on a small machine; phases below as they complete, seconds since launch:",
            )
        wall, marks = _train(
            run,
            command,
            ray_temp_dir=ray_temp_dir,
            lock=lock,
            listening=listening,
            shared_memory=shared_memory,
            on_line=_console_lines(console, signals),
            resumed=resumed,
        )
        return command, ray_temp_dir, wall, marks

    command, ray_temp_dir, wall, marks = retry_ray_start(
        attempt_run, DemoError, lambda line: _say(console, line), "[cpu-demo]"
    )
    result = _collect(
        run,
        command,
        t0=t0,
        wall=wall,
        first_step_s=marks.get("first_step"),
        ray_temp_dir=ray_temp_dir,
        listening=listening,
        shared_memory=shared_memory,
        resumed=resumed,
        console=console,
    )
    _report(result, console)
    return result


def _resume_step(run: DemoRun, console: Optional[TextIO]) -> int:
    """The step ``main_ppo`` will resume from in ``run.output_dir`` (0: from scratch; :mod:`.records`),
    said on the console; a checkpoint at or past ``run.steps`` raises :class:`DemoInputError`."""
    resumed = continued_step(run.output_dir, run.overrides, run.steps)
    if resumed:
        _say(
            console,
            f"[cpu-demo] resuming from the checkpoint of step {resumed} in {run.output_dir} (verl's "
            "trainer.resume_mode): "
            f"steps {resumed + 1}..{run.steps}; {LOG_NAME} and {METRICS_NAME} keep the earlier records "
            "(trainer.resume_mode=disable starts afresh)",
        )
    return resumed


def _train(
    run: DemoRun,
    command: list[str],
    *,
    ray_temp_dir: str,
    lock: OutputDirLock,
    listening: list[str],
    shared_memory: dict[str, list[str]],
    on_line: Callable[[str], None],
    resumed: int = 0,
) -> tuple[float, dict[str, float]]:
    """Run ``command`` (``main_ppo``) to its end, continuing after step ``resumed``; return (wall seconds,
    marks). Earlier records in the output dir are kept (:mod:`.records`). A failed or timed-out run raises
    :class:`DemoError` carrying the Ray temp dir; that dir is removed in any case."""
    banner = log_banner(run.output_dir, resumed, run.steps)
    try:
        env = cpu_env(start_records(run.output_dir, resumed), base=run.base_env)
        env.update(run_files_env(run.output_dir, ray_temp_dir, env))
        if cpu_engine(run.config_name) == "fsdp":  # the driver too skips importing Megatron (its workers: +cpu=demo)
            env.setdefault(SKIP_ENGINES_ENV, FSDP_RUN_SKIPS)
        if joins_cluster(command):  # the cluster's workers inherit its raylets' environment, not this one
            command = command + worker_env_overrides(env)
        returncode, wall, marks = run_subprocess(
            launcher(os.getpid(), command),  # main_ppo dies with this process, even when it is SIGKILLed
            env=env,
            log_path=run.log_path,
            timeout=run.timeout,
            ray_marker=ray_temp_dir,
            on_line=on_line,
            cwd=str(run.output_dir),
            listening=listening,
            pass_fds=[lock.fd],
            shared_memory=shared_memory,
            log_banner=banner,
        )
        if returncode != 0:
            raise DemoError(failure_message(returncode, run.log_path))
    except DemoError as exc:  # a timeout (run_subprocess) or a failed run
        exc.ray_temp_dir = ray_temp_dir
        raise
    finally:
        merge_part(run.output_dir)
        shutil.rmtree(ray_temp_dir, ignore_errors=True)
    return wall, marks


def _collect(
    run: DemoRun,
    command: list[str],
    *,
    t0: float,
    wall: float,
    first_step_s: Optional[float],
    ray_temp_dir: str,
    listening: list[str],
    shared_memory: dict[str, list[str]],
    resumed: int = 0,
    console: Optional[TextIO] = None,
) -> DemoResult:
    """Read what the finished run logged (every step 1..N there, those before ``resumed`` by the runs it
    continues, or :class:`DemoError`) and plot its reward curve.

    ``t0``: when the run started (monotonic); ``wall``: the subprocess's seconds; ``first_step_s``: seconds
    from launch to verl's step 1 line, if seen."""
    by_step = read_metrics(run.metrics_path)
    metrics = training_metrics(by_step)
    unlogged, missing = missing_steps(metrics, run.steps, resumed)
    if unlogged:
        _say(
            console,
            f"[cpu-demo] note: no metrics record of step(s) {unlogged}: the earlier run that trained them was "
            "stopped after their checkpoint and before verl logged them (verl saves a step's checkpoint first)",
        )
    if missing:
        resume = (
            f" (steps {resumed + 1}.. by this run, resumed from the checkpoint of step {resumed})" if resumed else ""
        )
        raise DemoError(
            f"main_ppo exited 0 but {run.metrics_path} lacks training steps {missing} of 1..{run.steps}{resume}; "
            f"end of log:\n{tail(run.log_path)}"
        )
    validation = validation_rewards(by_step)
    timings = run_timings(metrics, total_s=time.monotonic() - t0, subprocess_s=wall, first_step_s=first_step_s)
    plot_path = _plot(run, metrics, validation, console) if run.plot else None
    return DemoResult(
        output_dir=str(run.output_dir),
        command=command,
        metrics=metrics,
        validation=validation,
        timings=timings,
        plot_path=plot_path,
        log_path=str(run.log_path),
        metrics_path=str(run.metrics_path),
        rollout_vs_trainer=rollout_vs_trainer_gap(metrics),
        ray_temp_dir=ray_temp_dir,
        listening=listening,
        shared_memory=shared_memory,
        resumed_after_step=resumed or None,
        unlogged_steps=unlogged,
        model_size=model_size(Path(run.output_dir) / "hydra" / ".hydra" / "config.yaml") or {},
    )


def _plot(run: DemoRun, metrics: list[dict], validation: dict[int, float], console: Optional[TextIO]) -> Optional[str]:
    """The reward-curve PNG's path, or None with a one-line note if matplotlib is not installed (an optional
    dependency: the run itself succeeded)."""
    try:
        return write_plot(metrics, validation, run.output_dir / PLOT_NAME, get_model(run.model).title)
    except PlotUnavailable as exc:
        _say(console, f"[cpu-demo] {exc}")
        return None


def _report(result: DemoResult, console: Optional[TextIO]) -> None:
    """Write ``summary.json`` and print the plain summary and the summary's JSON."""
    summary = result.summary()
    (Path(result.output_dir) / SUMMARY_NAME).write_text(json.dumps(summary, indent=2, default=str))
    _say(console, plain_summary(summary, log_path=result.log_path, metrics_path=result.metrics_path))
    _say(console, f"[cpu-demo] done: {json.dumps(summary, default=str)}")


def _console_lines(console: Optional[TextIO], signals: InterruptSignals) -> Callable[[str], None]:
    """The run's output line -> its console lines: start-up phases as they complete, a line per step."""
    phases = StartupPhases()
    seen_errors: set[str] = set()

    def on_line(line: str) -> None:
        if console and signals.received is None:  # once interrupted, the dying run's output goes to the log only
            for shown in (phases.feed(line), progress_line(line, seen_errors)):
                if shown:
                    print(shown, file=console, flush=True)

    return on_line


def _say(console: Optional[TextIO], text: str) -> None:
    """Print ``text`` to the console, if there is one."""
    if console:
        print(text, file=console, flush=True)


def _console(stream: bool | TextIO) -> Optional[TextIO]:
    """Where :func:`run_demo`'s console lines go: ``stream``, stdout for True, nowhere for False."""
    if stream is True:
        return sys.stdout
    return stream or None
