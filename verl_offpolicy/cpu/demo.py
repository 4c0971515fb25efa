"""End-to-end CPU demo: stock ``python -m verl.trainer.main_ppo`` on a tiny model, in a few minutes.

:func:`run_demo` builds the tiny model (:mod:`.tiny`) and the repeat task (:mod:`.task`) into
``output_dir``, runs verl's real pipeline in a subprocess with the ``+cpu=demo`` overlay (plus the
algorithm preset and any extra Hydra overrides), streams per-step progress to the console, and
finally reads verl's file logger (JSONL) and writes a reward-curve PNG. The subprocess runs in its
own process group and its own Ray temp dir: on timeout, failure, Ctrl-C or SIGTERM the group is
killed and every process of that Ray session is ended, so nothing is left behind (an interrupted run
raises :class:`DemoInterrupted`, one line saying where its partial output is).

Files: everything a run writes is under ``output_dir`` or its Ray temp dir (removed after the run):
the datasets cache (``HF_DATASETS_CACHE``) and matplotlib's font cache (``MPLCONFIGDIR``) under
``output_dir/.cache`` unless those variables are set, and Ray's session token in the Ray temp dir
(``RAY_AUTH_TOKEN_PATH``; Ray would otherwise create ``~/.ray/auth_token``) unless a Ray token or
``RAY_AUTH_MODE`` is set. A lock file (:data:`LOCK_NAME`) holds ``output_dir`` for one run at a time.

Usage::

    from verl_offpolicy.cpu.demo import run_demo
    result = run_demo(steps=40, output_dir="runs/cpu_demo")
    print(result.reward_start, result.reward_end, result.timings)
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, TextIO

from verl_offpolicy.configs import PRIMARY_CONFIGS, STOCK_CONFIGS, preset_selector
from verl_offpolicy.cpu.demo_models import DEFAULT_MODEL, get_model
from verl_offpolicy.cpu.platform import CPU_ENV, LOOPBACK_ENV
from verl_offpolicy.cpu.process import (
    ExclusiveLock,
    Interrupt,
    InterruptSignals,
    LockHeld,
    is_loopback,
    held_shared_memory,
    kill_process_tree,
    listening_addresses,
    remove_leftover_files,
    spawn,
)
from verl_offpolicy.cpu.progress import StartupPhases, plain_summary

DEFAULT_CONFIG_NAME = "ppo_trainer"
# Training engine -> (our primary config, its CPU overlay, the key of the engine's seed). The primary
# config decides: verl's/our Megatron config runs with +cpu=megatron (``verl-offpolicy demo --engine``).
CPU_ENGINES = {
    "fsdp": (PRIMARY_CONFIGS[0], "+cpu=demo", "actor_rollout_ref.actor.fsdp_config.seed"),
    "megatron": (PRIMARY_CONFIGS[1], "+cpu=megatron", "actor_rollout_ref.actor.megatron.seed"),
}
CPU_OVERLAY = CPU_ENGINES["fsdp"][1]


def cpu_engine(config_name: str) -> str:
    """``megatron`` for verl's and our Megatron primary configs, else ``fsdp``."""
    return "megatron" if config_name in (STOCK_CONFIGS[1], PRIMARY_CONFIGS[1]) else "fsdp"
TRAIN_SCORE = "critic/score/mean"
STEP_TIME = "timing_s/step"
LOG_NAME = "train.log"
METRICS_NAME = "metrics.jsonl"
PLOT_NAME = "reward_curve.png"
LOCK_NAME = ".verl-offpolicy-demo.lock"
CACHE_NAME = ".cache"


class DemoError(RuntimeError):
    """The demo run failed or timed out; the message carries the end of the training log, and
    ``ray_temp_dir`` the run's own Ray session dir once one was made (removed with the run)."""

    exit_code = 1
    ray_temp_dir: Optional[str] = None


class DemoInputError(DemoError):
    """The demo cannot start (e.g. an unusable output directory); raised before anything is started."""

    exit_code = 2


class DemoInterrupted(DemoError):
    """Ctrl-C or SIGTERM stopped the run; its processes and Ray temp dir are gone, its partial output stays."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


def preset_overrides(preset: str, config_name: str = DEFAULT_CONFIG_NAME, model: str = DEFAULT_MODEL) -> list[str]:
    """Hydra overrides selecting an algorithm, plus the model's task settings for it
    (:attr:`verl_offpolicy.cpu.demo_models.DemoModel.task_overrides`, e.g. AGRO's β on the repeat task).

    On verl's stock configs (``ppo_trainer``), ``grpo`` is verl's built-in GRPO with the vanilla
    PPO-clip loss (plain verl keys, no preset file); any other name, and every name on our primary
    configs (``offpolicy_trainer``), selects the preset file ``verl_offpolicy/configs/algorithm/<preset>.yaml``
    (``+algorithm=`` or ``algorithm=``: :func:`verl_offpolicy.configs.preset_selector`).
    """
    task = list(get_model(model).task_overrides.get(preset, ()))
    if preset == "grpo" and config_name in STOCK_CONFIGS:
        return [
            "algorithm.adv_estimator=grpo",
            "algorithm.norm_adv_by_std_in_grpo=true",
            "algorithm.use_kl_in_reward=false",
            "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
            "actor_rollout_ref.actor.loss_agg_mode=token-mean",
            *task,
        ]
    return [preset_selector(preset, config_name), *task]


@dataclass
class DemoInputs:
    model_path: str
    tokenizer_path: str
    train_files: str
    val_files: str


def build_inputs(output_dir: str | os.PathLike, seed: int = 0, model: str = DEFAULT_MODEL) -> DemoInputs:
    """Build (or reuse) the model, tokenizer and task data of ``model`` (:mod:`.demo_models`) under ``output_dir``."""
    return DemoInputs(**get_model(model).build(Path(output_dir), seed))


def demo_command(
    inputs: DemoInputs,
    *,
    output_dir: str | os.PathLike,
    preset: str = "grpo",
    steps: int = 20,
    seed: int = 0,
    overrides: Sequence[str] = (),
    config_name: str = DEFAULT_CONFIG_NAME,
    ray_temp_dir: Optional[str] = None,
    python: str = sys.executable,
    model: str = DEFAULT_MODEL,
) -> list[str]:
    """The ``main_ppo`` command line of a demo run (overlay, inputs, preset, the model's settings, then ``overrides``)."""
    output_dir = Path(output_dir).resolve()
    _, overlay, seed_key = CPU_ENGINES[cpu_engine(config_name)]
    command = [
        python,
        "-m",
        "verl.trainer.main_ppo",
        "--config-name",
        config_name,
        overlay,
        f"actor_rollout_ref.model.path={inputs.model_path}",
        f"actor_rollout_ref.model.tokenizer_path={inputs.tokenizer_path}",
        f"data.train_files={inputs.train_files}",
        f"data.val_files={inputs.val_files}",
        f"data.seed={seed}",
        f"actor_rollout_ref.rollout.seed={seed}",
        f"actor_rollout_ref.actor.data_loader_seed={seed}",
        f"{seed_key}={seed}",
        f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={output_dir / 'checkpoints'}",
        f"hydra.run.dir={output_dir / 'hydra'}",
    ]
    if ray_temp_dir:
        command.append(f"+ray_kwargs.ray_init._temp_dir={ray_temp_dir}")
    return command + run_overrides(preset, config_name, model, overrides)


def run_overrides(preset: str, config_name: str, model: str, overrides: Sequence[str] = ()) -> list[str]:
    """The last overrides of a demo run, in the order Hydra applies them (the last one wins): the preset
    (:func:`preset_overrides`), then the model's settings, then the caller's ``overrides``."""
    return [*preset_overrides(preset, config_name, model), *get_model(model).overrides, *overrides]


# ----------------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------------


def read_metrics(path: str | os.PathLike) -> dict[int, dict[str, Any]]:
    """verl FileLogger JSONL -> {step: merged metrics} (a step may be logged more than once)."""
    steps: dict[int, dict[str, Any]] = {}
    path = Path(path)
    if not path.exists():
        return steps
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        record = json.loads(line)
        steps.setdefault(int(record["step"]), {}).update(record["data"])
    return steps


_VAL_KEY = re.compile(r"^val-(core|aux)/[^@]+/(reward|acc)/mean@\d+$")


def validation_key(metrics: dict[str, Any]) -> Optional[str]:
    """The mean validation reward key if logged: ``val-(core|aux)/<data_source>/(reward|acc)/mean@<n>``.

    verl names the custom reward ``reward`` (``val-aux``) and, for a float score, also ``acc``
    (``val-core``); both hold the same mean. ``reward`` is preferred.
    """
    keys = sorted((k for k in metrics if _VAL_KEY.match(k)), key=lambda k: ("/reward/" not in k, k))
    return keys[0] if keys else None


@dataclass
class DemoResult:
    output_dir: str
    command: list[str]
    metrics: list[dict[str, Any]]  # one dict per training step (step >= 1), with "step"
    validation: dict[int, float]  # step -> mean validation reward (greedy); step 0 = before training
    timings: dict[str, float]
    plot_path: Optional[str]
    log_path: str
    metrics_path: str
    rollout_vs_trainer: dict[str, float] = field(default_factory=dict)
    ray_temp_dir: Optional[str] = None  # the run's own Ray session dir (removed after the run)
    listening: list[str] = field(default_factory=list)  # TCP listen addresses at the first training step
    # /dev/shm files the run's processes had mapped at the first training step, and those of them it left
    # behind (unlinked by the demo after the run)
    shared_memory: dict[str, list[str]] = field(default_factory=dict)

    @property
    def rewards(self) -> list[float]:
        return [m[TRAIN_SCORE] for m in self.metrics if TRAIN_SCORE in m]

    @property
    def reward_start(self) -> float:
        return self.rewards[0]

    @property
    def reward_end(self) -> float:
        return self.rewards[-1]

    def summary(self) -> dict[str, Any]:
        rewards = self.rewards
        window = max(1, min(3, len(rewards) // 3))
        return {
            "steps": len(self.metrics),
            "reward_first": rewards[0] if rewards else None,
            "reward_last": rewards[-1] if rewards else None,
            f"reward_first{window}_mean": sum(rewards[:window]) / window if rewards else None,
            f"reward_last{window}_mean": sum(rewards[-window:]) / window if rewards else None,
            "validation": self.validation,
            "timings": self.timings,
            "rollout_vs_trainer": self.rollout_vs_trainer,
            "listening_sockets": len(self.listening),
            "listening_not_loopback": [a for a in self.listening if not is_loopback(a)],
            "shared_memory_left_by_run": self.shared_memory.get("removed", []),  # unlinked by the demo
            "plot": self.plot_path,
        }


def write_plot(
    result_metrics: list[dict[str, Any]], validation: dict[int, float], path: str | os.PathLike, title: str = "tiny Llama, repeat task"
) -> str:
    """Reward curve (train score per step, greedy validation reward) as a PNG.

    matplotlib's config and font cache go next to the PNG (``.cache/matplotlib``) unless
    ``MPLCONFIGDIR`` is set or matplotlib is already imported (it reads the variable at import).
    """
    own_config = "matplotlib" not in sys.modules and "MPLCONFIGDIR" not in os.environ
    if own_config:
        os.environ["MPLCONFIGDIR"] = str(Path(path).absolute().parent / CACHE_NAME / "matplotlib")
    try:
        from matplotlib.figure import Figure  # builds the font cache (matplotlib caches the dir it chose)
    finally:
        if own_config:
            del os.environ["MPLCONFIGDIR"]

    # A Figure of its own, not pyplot's global state: runs in threads (the tests' shared runs) may plot at once.
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    steps = [m["step"] for m in result_metrics if TRAIN_SCORE in m]
    ax.plot(steps, [m[TRAIN_SCORE] for m in result_metrics if TRAIN_SCORE in m], marker="o", label="train reward (sampled)")
    if validation:
        val_steps = sorted(validation)
        ax.plot(val_steps, [validation[s] for s in val_steps], marker="s", label="validation reward (greedy)")
    ax.set_xlabel("training step")
    ax.set_ylabel("mean reward")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"verl-offpolicy CPU demo ({title})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return str(path)


# ----------------------------------------------------------------------------------------------
# Running main_ppo (spawn, timeouts, cleanup: verl_offpolicy.cpu.process)
# ----------------------------------------------------------------------------------------------


def _number(text: str) -> str:
    """'np.float64(0.109375)' / '2.4956220470' -> '0.1094' / '2.496' (4 significant digits)."""
    inner = re.search(r"\(([^()]*)\)", text)  # np.float64(0.1) -> 0.1
    match = re.search(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", inner.group(1) if inner else text)
    if not match:
        return text
    return f"{float(match.group(0)):.4g}"


_STEP_LINE = re.compile(r"(?:^|\s)step:(\d+) - ")
_ERROR_LINE = re.compile(r"Traceback \(most recent call last\)|\b[A-Z]\w*(?:Error|Exception): |verl-offpolicy:")


def _progress_line(line: str) -> Optional[str]:
    """A compact console line for verl's per-step console log, or None to stay quiet."""
    match = _STEP_LINE.search(line)
    if match:
        line = line[match.start() :].strip()
        fields = {}
        for part in line.split(" - "):
            if ":" in part:
                key, _, value = part.rpartition(":")
                fields[key.strip()] = value.strip()
        step = fields.get("step", "?")
        keys = [
            ("reward", TRAIN_SCORE),
            ("step_s", STEP_TIME),
            ("pg_loss", "actor/pg_loss"),
            ("|p_rollout-p_actor|max", "training/rollout_probs_diff_max"),
        ]
        shown = [f"{label}={_number(fields[k])}" for label, k in keys if k in fields]
        val_key = validation_key(fields)
        val = [f"val={_number(fields[val_key])}"] if val_key else []
        return f"[cpu-demo] step {step}: " + " ".join(shown + val)
    if "Warning" not in line and _ERROR_LINE.search(line):
        return f"[cpu-demo] {line}"
    return None


def run_subprocess(
    command: Sequence[str],
    *,
    env: dict[str, str],
    log_path: str | os.PathLike,
    timeout: float,
    ray_marker: Optional[str] = None,
    on_line: Optional[Callable[[str], None]] = None,
    cwd: Optional[str] = None,
    listening: Optional[list[str]] = None,
    pass_fds: Sequence[int] = (),
    shared_memory: Optional[dict[str, list[str]]] = None,
) -> tuple[int, float, dict[str, float]]:
    """Run ``command`` in its own process group with a timeout; log to ``log_path``.

    Returns (return code, wall seconds, {first_step_line: seconds after launch}). If ``listening``
    is a list, it receives the addresses the run listens on at its first training step. If
    ``shared_memory`` is a dict, ``held`` receives the ``/dev/shm`` files the run's processes have mapped at
    that step and ``removed`` those of them the run left behind, which are unlinked once its processes are
    gone (vLLM's engine queues and semaphores: their creators never shut down, see docs/vllm_cpu.md). On timeout
    the process tree is killed and :class:`DemoError` is raised with the log's tail. After any exit,
    processes of the run's Ray session that are still alive are ended. ``pass_fds`` stay open in the
    subprocess (the output directory's lock).
    """
    start = time.monotonic()
    marks: dict[str, float] = {}
    held: list[str] = []
    log_path = Path(log_path)
    with open(log_path, "w", buffering=1) as log:
        proc = spawn(command, env, cwd, pass_fds)

        def pump() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.rstrip("\n")
                log.write(raw)
                if "first_step" not in marks:
                    match = _STEP_LINE.search(line)
                    if match and match.group(1) == "1":
                        marks["first_step"] = time.monotonic() - start
                        if listening is not None:
                            listening.extend(listening_addresses(proc, ray_marker))
                        if shared_memory is not None:
                            held.extend(held_shared_memory(proc, ray_marker))
                if on_line is not None:
                    try:
                        on_line(line)
                    except Exception:  # noqa: BLE001 - the pipe must keep draining or the child blocks
                        pass

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            try:
                returncode = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_process_tree(proc, ray_marker)
                reader.join(timeout=5)
                raise DemoError(
                    f"the CPU demo did not finish within {timeout:.0f}s and was killed (process group and its Ray "
                    f"session); end of {log_path}:\n{tail(log_path)}"
                ) from None
            except BaseException:
                kill_process_tree(proc, ray_marker)
                raise
            reader.join(timeout=30)
            # A clean exit shuts Ray down itself; this catches anything a failed run left behind.
            kill_process_tree(proc, ray_marker)
        finally:
            if shared_memory is not None:
                shared_memory.update(held=sorted(held), removed=remove_leftover_files(held))
    return returncode, time.monotonic() - start, marks


def tail(path: str | os.PathLike, lines: int = 60) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


def prepare_output_dir(output_dir: str | os.PathLike) -> Path:
    """Create ``output_dir`` (absolute) or raise :class:`DemoInputError`: one line naming it and why."""
    path = Path(output_dir).expanduser().absolute()
    if path.exists() and not path.is_dir():
        raise DemoInputError(f"output directory {path} is not a directory (a file of that name exists)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DemoInputError(f"cannot create the output directory {path}: {exc.strerror or exc}") from None
    return path.resolve()


class OutputDirLock(ExclusiveLock):
    """One run per output directory: the :class:`ExclusiveLock` on ``output_dir/LOCK_NAME``; the training
    subprocess inherits the locked file (``pass_fds``), so the directory stays held while it lives."""

    def __init__(self, output_dir: Path):
        super().__init__(output_dir / LOCK_NAME)

    def acquire(self) -> "OutputDirLock":
        """Take the lock or raise :class:`DemoInputError`: one line naming the directory and why."""
        try:
            super().acquire()
        except LockHeld as exc:
            raise DemoInputError(
                f"output directory {self.path.parent} is in use by another demo run (PID {exc.holder}, lock {self.path}); "
                "wait for it to end or choose another --output-dir"
            ) from None
        except OSError as exc:
            raise DemoInputError(f"cannot write in the output directory {self.path.parent}: {exc.strerror or exc}") from None
        return self


def run_files_env(output_dir: str | os.PathLike, ray_temp_dir: Optional[str], base: dict[str, str]) -> dict[str, str]:
    """Variables that keep the caches and Ray's token of a run under ``output_dir`` / ``ray_temp_dir``.

    A variable the caller has set is kept. The Ray token file (a fresh random token, mode 0600) is
    written to ``ray_temp_dir``, so it is removed with it.
    """
    cache = Path(output_dir) / CACHE_NAME
    env = {}
    if "HF_DATASETS_CACHE" not in base:
        env["HF_DATASETS_CACHE"] = str(cache / "huggingface" / "datasets")
    if "MPLCONFIGDIR" not in base:
        env["MPLCONFIGDIR"] = str(cache / "matplotlib")
    if ray_temp_dir and not {"RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"} & set(base):
        token = Path(ray_temp_dir) / "auth_token"
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        env["RAY_AUTH_TOKEN_PATH"] = str(token)
    return env


def cpu_env(metrics_path: str | os.PathLike, base: Optional[dict[str, str]] = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(CPU_ENV)
    env.update(LOOPBACK_ENV)
    env["VERL_FILE_LOGGER_PATH"] = str(metrics_path)
    env["PYTHONUNBUFFERED"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    env.setdefault("RAY_DEDUP_LOGS", "0")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    return env


def run_demo(
    preset: str = "grpo",
    steps: int = 40,
    seed: int = 0,
    output_dir: Optional[str | os.PathLike] = None,
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
            (``+algorithm=<preset>``, see :func:`preset_overrides`).
        steps: training steps (``trainer.total_training_steps``).
        seed: seeds the model init, the data order and the rollout sampler.
        output_dir: where model, data, log, metrics and plot go (default: a new temp dir); one run
            at a time (:class:`OutputDirLock`).
        timeout: seconds before the run is killed (and a :class:`DemoError` raised).
        overrides: extra Hydra overrides, applied last.
        config_name: primary config (``ppo_trainer``; e.g. ``offpolicy_trainer`` with its presets).
        stream: the console lines (start-up phases, a line per step, the summary): to stdout (True), to
            this text stream, or nowhere (False).
        plot: write ``reward_curve.png``.
        model: ``tiny`` or ``smollm2-135m`` (:mod:`verl_offpolicy.cpu.demo_models`).
        env: the environment the run starts from (default: this process's, read at the call); the CPU
            path's variables are added to it.

    Returns:
        :class:`DemoResult` with per-step metrics, validation rewards and timings.

    Raises:
        DemoInputError: before anything starts, if ``output_dir`` cannot be created or written, or
            another live run holds it.
        DemoInterrupted: on SIGINT (Ctrl-C) or SIGTERM in the main thread, after the run's processes
            and Ray temp dir are gone.
        DemoError: the run failed or timed out.
    """
    get_model(model)  # an unknown model fails before anything is created
    output_dir = prepare_output_dir(output_dir if output_dir is not None else tempfile.mkdtemp(prefix="vo-cpu-demo-"))
    lock = OutputDirLock(output_dir).acquire()
    log_path = output_dir / LOG_NAME
    try:
        with InterruptSignals() as signals:
            try:
                return _run_locked(
                    preset, steps, seed, output_dir, timeout, list(overrides), config_name, _console(stream), plot, lock,
                    signals, model, dict(os.environ if env is None else env),
                )
            except Interrupt as exc:
                name = signal.Signals(exc.signum).name
                raise DemoInterrupted(
                    f"interrupted by {name}: the run's processes were stopped and its Ray temp dir removed; "
                    f"partial output in {output_dir} (log: {log_path})",
                    exc.signum,
                ) from None
    finally:
        lock.release()


def _run_locked(
    preset: str,
    steps: int,
    seed: int,
    output_dir: Path,
    timeout: float,
    overrides: list[str],
    config_name: str,
    console: Optional[TextIO],
    plot: bool,
    lock: OutputDirLock,
    signals: InterruptSignals,
    model: str,
    base_env: dict[str, str],
) -> DemoResult:
    t0 = time.monotonic()
    if console:
        print(f"[cpu-demo] preparing {get_model(model).preparing} ...", file=console, flush=True)
    inputs = build_inputs(output_dir, seed=seed, model=model)
    metrics_path = output_dir / METRICS_NAME
    if metrics_path.exists():
        metrics_path.unlink()
    # Short and unique: Ray puts unix sockets under it (path length limit) and we find its processes by it.
    ray_temp_dir = tempfile.mkdtemp(prefix="vo-ray-", dir="/tmp")
    command = demo_command(
        inputs,
        output_dir=output_dir,
        preset=preset,
        steps=steps,
        seed=seed,
        overrides=overrides,
        config_name=config_name,
        ray_temp_dir=ray_temp_dir,
        model=model,
    )
    phases = StartupPhases()

    def on_line(line: str) -> None:
        if console and signals.received is None:  # once interrupted, the dying run's output goes to the log only
            for shown in (phases.feed(line), _progress_line(line)):
                if shown:
                    print(shown, file=console, flush=True)

    if console:
        print(
            f"[cpu-demo] output: {output_dir}; running {' '.join(command[:4])} ... (log: {output_dir / LOG_NAME})\n"
            "[cpu-demo] start-up (Ray, TransferQueue, the training worker, the rollout server) takes one to several "
            "minutes on a small machine; phases below as they complete, seconds since launch:",
            file=console,
            flush=True,
        )
    listening: list[str] = []
    shared_memory: dict[str, list[str]] = {}
    try:
        env = cpu_env(metrics_path, base=base_env)
        env.update(run_files_env(output_dir, ray_temp_dir, env))
        returncode, wall, marks = run_subprocess(
            command,
            env=env,
            log_path=output_dir / LOG_NAME,
            timeout=timeout,
            ray_marker=ray_temp_dir,
            on_line=on_line,
            cwd=str(output_dir),
            listening=listening,
            pass_fds=[lock.fd],
            shared_memory=shared_memory,
        )
        if returncode != 0:
            raise DemoError(f"main_ppo exited with status {returncode}; end of {output_dir / LOG_NAME}:\n{tail(output_dir / LOG_NAME)}")
    except DemoError as exc:  # a timeout (run_subprocess) or a failed run
        exc.ray_temp_dir = ray_temp_dir
        raise
    finally:
        shutil.rmtree(ray_temp_dir, ignore_errors=True)

    by_step = read_metrics(metrics_path)
    metrics = [{"step": s, **m} for s, m in sorted(by_step.items()) if s >= 1 and TRAIN_SCORE in m]
    if len(metrics) < steps:
        raise DemoError(
            f"main_ppo exited 0 but {metrics_path} has {len(metrics)} training steps, expected {steps}; "
            f"end of log:\n{tail(output_dir / LOG_NAME)}"
        )
    validation = {}
    for s, m in sorted(by_step.items()):
        key = validation_key(m)
        if key is not None:
            validation[s] = float(m[key])
    step_times = [m[STEP_TIME] for m in metrics if STEP_TIME in m]
    timings = {
        "total_s": round(time.monotonic() - t0, 2),
        "subprocess_s": round(wall, 2),
        "mean_step_s": round(sum(step_times) / len(step_times), 3) if step_times else float("nan"),
    }
    if "first_step" in marks and step_times:
        timings["startup_s"] = round(marks["first_step"] - step_times[0], 2)
    diffs = [m["training/rollout_probs_diff_max"] for m in metrics if "training/rollout_probs_diff_max" in m]
    rollout_vs_trainer = {}
    if diffs:
        rollout_vs_trainer = {
            "rollout_probs_diff_max": max(diffs),
            "rollout_probs_diff_mean": sum(m["training/rollout_probs_diff_mean"] for m in metrics) / len(metrics),
        }
    plot_path = write_plot(metrics, validation, output_dir / PLOT_NAME, get_model(model).title) if plot else None
    result = DemoResult(
        output_dir=str(output_dir),
        command=command,
        metrics=metrics,
        validation=validation,
        timings=timings,
        plot_path=plot_path,
        log_path=str(output_dir / LOG_NAME),
        metrics_path=str(metrics_path),
        rollout_vs_trainer=rollout_vs_trainer,
        ray_temp_dir=ray_temp_dir,
        listening=listening,
        shared_memory=shared_memory,
    )
    (output_dir / "summary.json").write_text(json.dumps(result.summary(), indent=2, default=str))
    if console:
        print(plain_summary(result.summary(), log_path=result.log_path, metrics_path=result.metrics_path), file=console, flush=True)
        print(f"[cpu-demo] done: {json.dumps(result.summary(), default=str)}", file=console, flush=True)
    return result


def _console(stream: bool | TextIO) -> Optional[TextIO]:
    """Where :func:`run_demo`'s console lines go: ``stream``, stdout for True, nowhere for False."""
    if stream is True:
        return sys.stdout
    return stream or None
