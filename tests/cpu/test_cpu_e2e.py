"""CI end-to-end: stock ``python -m verl.trainer.main_ppo`` on the CPU.

verl's real pipeline (Ray, v1 trainer with TransferQueue, FSDP2 ActorRolloutRefWorker, agent loop,
reward loop, hf rollout with weight sync) through :func:`verl_offpolicy.demo.run.run_demo`, which
kills the run (process group and its Ray session) if it exceeds the timeout: GRPO learning the task
(one run proves the pipeline's checks and the learning), two presets of ours through main_ppo with
verl's rollout correction, the timeout, and the console script interrupted.
"""

import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.jobs import queued_at_start
from tests.scenario_runs import LEARN_STEPS, LEARN_TIMEOUT, SMALL_DEMO
from tests.scenario_runs import learn_run as start_learn_run
from verl_offpolicy.cpu.platform import is_loopback
from verl_offpolicy.demo.errors import DemoError
from verl_offpolicy.demo.output_dir import OutputDirLock
from verl_offpolicy.demo.process import kill_process_tree, session_processes, spawn
from verl_offpolicy.demo.results import DemoResult
from verl_offpolicy.demo.run import run_demo

STEPS = 2
# A 2-step run takes ~75 s on an idle 2-core machine (about 60 s of start-up); 240 s killed runs still
# starting their workers on a machine shared with other test runs.
TIMEOUT = 900

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(TIMEOUT + 300)]


def check_completed(result: DemoResult, steps: int = STEPS) -> None:
    """The run logged every training step with verl's metrics, and rollout/trainer agree."""
    assert [m["step"] for m in result.metrics] == list(range(1, steps + 1))
    for m in result.metrics:
        for key in ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "timing_s/step", "response_length/mean"):
            assert key in m and math.isfinite(float(m[key])), (key, m.get(key))
        assert 0.0 <= m["critic/score/mean"] <= 1.0
        assert m["training/rollout_probs_diff_valid"] == 1
        # verl's own debug metric: |p_rollout - p_actor| on the sampled tokens, after the weight sync.
        assert m["training/rollout_probs_diff_max"] < 1e-3
    assert 0 in result.validation  # val_before_train
    assert Path(result.plot_path).stat().st_size > 0
    assert result.timings["mean_step_s"] > 0


def check_console(out: str, result: DemoResult, steps: int) -> None:
    """What a person saw: every start-up phase once, in order, seconds rising; then the plain summary above the JSON."""
    from verl_offpolicy.demo.progress import PHASES

    phases = [line for line in out.splitlines() if re.match(r"\[cpu-demo\] +[\d.]+ s  ", line)]
    assert len(phases) == len(PHASES), out
    seconds = [float(line.split()[1]) for line in phases]
    assert seconds == sorted(seconds) and seconds[0] > 0, phases
    assert phases[1].endswith("Ray started (127.0.0.1)") and phases[-1].endswith("first training step done"), phases
    lines = out.splitlines()
    done = next(i for i, line in enumerate(lines) if line.startswith("[cpu-demo] done: {"))
    summary = lines[done - 7 : done]
    assert summary[0] == f"[cpu-demo] finished {steps} training steps", summary
    assert summary[1].endswith(f"{result.reward_start:.3f} -> {result.reward_end:.3f}"), summary
    assert summary[3].startswith(f"  time: {result.timings['mean_step_s']:.1f} s per step"), summary
    assert summary[4:6] == [f"  reward curve: {result.plot_path}", f"  log: {result.log_path}"], summary


RC = "algorithm.rollout_correction"


PRESET_RUNS = {
    # +algorithm=asymre on verl's config, with token-level TIS (weights π_old/π_rollout truncated at 2)
    "asymre-stock-config-token_tis": (
        "asymre",
        "ppo_trainer",
        [f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=2.0"],
    ),
    # algorithm=agro on ours, with sequence-level MIS (IcePop bounds: sequence weights outside [0.5, 2] are zeroed)
    "agro-primary-config-seq_mis": (
        "agro",
        "offpolicy_trainer",
        [f"{RC}.rollout_is=sequence", f"{RC}.rollout_is_threshold=0.5_2.0"],
    ),
    # the behaviour-anchored rec_oneside_nois at (4, 1) with sequence IS in IcePop's band and geometric rejection:
    # on stale batches verl's correction compares π_behaviour with π_rollout (glue/scheduler/correction.py)
    "rec_oneside_nois-s4d1-seq_icepop_geo_rs": (
        "rec_oneside_nois",
        "offpolicy_trainer",
        [
            f"{RC}.rollout_is=sequence",
            f"{RC}.rollout_is_threshold=0.5_2.0",
            f"{RC}.rollout_rs=seq_mean_k1",
            f"{RC}.rollout_rs_threshold=0.9_1.1",
            "algorithm.offpolicy.sync_interval=4",
            "algorithm.offpolicy.sync_offset=1",
        ],
    ),
}
# The asymre case runs in the extended tier: the default run keeps the claim it shares with agro (verl's rollout
# correction weights multiplied into our loss: one code path for every loss, glue/losses.py::_aggregate) and a
# preset of ours on verl's stock config (rec_oneside_nois, tests/scheduler/test_verl_async_modes.py); asymre's shifted
# advantage is checked against hand-derived values in the fast tier (tests/algorithms/test_algorithms_estimators.py).
EXTENDED_PRESET_RUNS = ["asymre-stock-config-token_tis", "rec_oneside_nois-s4d1-seq_icepop_geo_rs"]
# Steps of a case other than STEPS: (4, 1) trains versions [0, 0, 0, 0, 0, 4], staleness [0, 1, 2, 3, 4, 1]
CASE_STEPS = {"rec_oneside_nois-s4d1-seq_icepop_geo_rs": 6}
# verl's rollout_corr/* on a stale batch under the behaviour anchor (the engines' mismatch) against
# offpolicy/anchor_corr/* (π_proximal vs π_behaviour, the staleness): how much smaller the first must be
STALE_KL_FACTOR = 10.0


@queued_at_start(scope="module")
def learn_run(demo_runs):
    """The learning run (tests/scenario_runs.py: ``learn_run``; the scheduler tests' stock sync run too)."""
    return start_learn_run(demo_runs)


def _start_preset_runs(demo_runs, cases):
    runs = {}
    for case in cases:
        preset, config_name, correction = PRESET_RUNS[case]
        steps = CASE_STEPS.get(case, STEPS)
        runs[case] = demo_runs.start(
            preset, steps, ["trainer.test_freq=-1", *correction], config_name, TIMEOUT, name=case, plot=True
        )
    return lambda case: runs[case].result()


@queued_at_start(scope="module")
def preset_runs(demo_runs):
    """The result of the run of a case of :data:`PRESET_RUNS` outside :data:`EXTENDED_PRESET_RUNS`."""
    return _start_preset_runs(demo_runs, sorted(set(PRESET_RUNS) - set(EXTENDED_PRESET_RUNS)))


@queued_at_start(scope="module")
def extended_preset_runs(demo_runs):
    """The result of the run of a case of :data:`EXTENDED_PRESET_RUNS` (queued only in a session that selects one)."""
    return _start_preset_runs(demo_runs, EXTENDED_PRESET_RUNS)


def _check_behaviour_corrections(result):
    """(4, 1), behaviour anchor, sequence IS (IcePop [0.5, 2]) and geometric rejection ([0.9, 1.1]).

    On every stale step verl's rollout_corr/* describe π_behaviour against π_rollout, the two engines at the same
    weights: the KL is tiny, every weight ≈ 1 and nothing is rejected, while the same step's anchor_corr KL
    (π_proximal against π_behaviour: the staleness) is at least STALE_KL_FACTOR times larger. Computed on the
    proximal policy (verl's decoupled pair, the negative control of
    tests/scheduler/test_rollout_correction_anchor.py), the
    correction would carry that staleness.
    """
    stale = [m for m in result.metrics if m["training/off_policy/trajectory_staleness/mean"] > 0]
    assert len(stale) >= 5, [m["training/off_policy/trajectory_staleness/mean"] for m in result.metrics]
    for m in stale:
        engines = abs(m["rollout_corr/kl"])
        staleness = abs(m["offpolicy/anchor_corr/kl"])
        assert engines < 1e-3 and staleness > STALE_KL_FACTOR * engines, (m["step"], engines, staleness)
        assert m["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=0.05), m["rollout_corr/rollout_is_mean"]
        assert m["rollout_corr/rollout_rs_masked_fraction"] == 0.0, m["rollout_corr/rollout_rs_masked_fraction"]
    # the schedule held: step t trains version 4·max(0, ⌊(t − 2)/4⌋)
    assert [m["offpolicy/version"] for m in result.metrics] == [
        4 * max(0, (m["step"] - 2) // 4) for m in result.metrics
    ]


@pytest.mark.timeout(LEARN_TIMEOUT + 300)
def test_grpo_learns_through_main_ppo_on_cpu_on_loopback_and_leaves_nothing_behind(learn_run):
    """Acceptance and the pipeline's end-to-end checks in one run (~4 minutes on 2 cores): GRPO
    (vanilla loss) through stock main_ppo, 20 steps of 8 prompts x 16 samples (tiny Llama, repeat task).

    Every step logged verl's metrics with rollout and trainer agreeing; the mean training reward of the
    last steps clearly exceeds that of the first steps and the greedy validation reward rises;
    everything that listened on a port was on loopback; nothing of the run is left behind.
    """
    result = learn_run.result()
    output_dir = result.output_dir
    check_console(learn_run.console.getvalue(), result, LEARN_STEPS)
    print(result.summary())
    check_completed(result, LEARN_STEPS)
    # Everything that listens on a port (Ray, TransferQueue, the process groups) binds to loopback.
    # Ray alone has a GCS, a raylet and a gRPC server per worker: an empty snapshot would be a bug.
    assert len(result.listening) >= 5, result.listening
    assert [a for a in result.listening if not is_loopback(a)] == [], result.listening
    # Nothing of the run (main_ppo, its Ray session) is left behind.
    assert session_processes(output_dir) == []
    assert session_processes(result.ray_temp_dir) == []
    rewards = result.rewards
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    # Observed (20 steps): 0.081 -> 0.490 (mean reward, first and last 5 steps), 0.109 -> 0.891 (validation);
    # a random policy scores ~0.05.
    assert last > first + 0.3, (first, last, rewards)
    assert result.validation[LEARN_STEPS] > result.validation[0] + 0.25, result.validation


@pytest.mark.parametrize("case", sorted(set(PRESET_RUNS) - set(EXTENDED_PRESET_RUNS)))
def test_our_presets_train_through_main_ppo_with_our_estimator_loss_and_trainer(preset_runs, case):
    """Our presets through stock main_ppo: our trainer, loss and estimator were the ones used, with verl's
    decoupled rollout correction (verl computes the IS weights, our loss multiplies its per-token loss
    by them: ``glue/losses.py::_aggregate``, common to every loss of ours)."""
    _check_preset_run(case, preset_runs(case))


@pytest.mark.extended
@pytest.mark.parametrize("case", EXTENDED_PRESET_RUNS)
def test_our_presets_train_through_main_ppo_with_our_estimator_loss_and_trainer_extended(extended_preset_runs, case):
    """The same claim for :data:`EXTENDED_PRESET_RUNS`."""
    _check_preset_run(case, extended_preset_runs(case))


def _check_preset_run(case, result):
    """The claim of the two tests above on the run of ``case``."""
    preset = PRESET_RUNS[case][0]
    if (
        case in CASE_STEPS
    ):  # a stale run: verl's rollout_probs_diff compares the proximal policy, check_completed's 1e-3 is for fresh
        assert [m["step"] for m in result.metrics] == list(range(1, CASE_STEPS[case] + 1))
        _check_behaviour_corrections(result)
        return
    check_completed(result)
    for m in result.metrics:
        # our trainer (offpolicy/*) and our rec loss (its metrics, which verl's vanilla loss does not log)
        assert m["offpolicy/version"] == m["step"] - 1
        assert m["training/off_policy/trajectory_staleness/mean"] == 0  # verl's own name
        assert {"actor/pg_clipfrac_upper", "actor/ratio_mean", "actor/ratio_max"} <= set(m)
        assert m["actor/grad_norm"] > 0
        # our trainer generates under verl's own "gen" timer: a real share of the step, not ~0.01 s
        assert m["timing_s/gen"] > 0.15 * m["timing_s/step"], (m["timing_s/gen"], m["timing_s/step"])
        # verl computed the rollout-correction weights of this batch (rollout vs trainer agree to < 1e-3: weights ≈ 1)
        assert m["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=0.05), m["rollout_corr/rollout_is_mean"]
        if preset == "asymre":
            # A = r − (r̄ + shift): the token-mean advantage is ≈ −shift = +0.1 (GRPO's would be ≈ 0)
            assert m["critic/advantages/mean"] == pytest.approx(0.1, abs=0.03)
        else:
            # AGRO's R = r − β·log(π/π_ref) is verl's KL-in-reward with the fixed coefficient β
            # (the demo's β = 0.01 for this task, set once in algorithm.offpolicy.beta)
            assert m["actor/reward_kl_penalty_coeff"] == pytest.approx(0.01)
            assert "actor/reward_kl_penalty" in m


def test_timeout_becomes_a_failure_and_cleans_up(tmp_path):
    """A run that cannot finish in time is killed with its Ray session, and says why."""
    output_dir = str(tmp_path / "e2e-timeout")
    start = time.monotonic()
    with pytest.raises(DemoError, match="did not finish within 30s") as failure:
        run_demo(steps=STEPS, output_dir=output_dir, timeout=30, overrides=["trainer.test_freq=-1"])
    assert time.monotonic() - start < 120
    assert session_processes(output_dir) == []
    ray_dir = failure.value.ray_temp_dir  # the run's own Ray session dir: other runs may be alive on the machine
    assert ray_dir and "vo-ray-" in ray_dir, ray_dir
    leftovers = session_processes(ray_dir)
    assert leftovers == [], [" ".join(p.cmdline()) for p in leftovers]
    assert not Path(ray_dir).exists()


# ---------------------------------------------------------------------- the console script, interrupted

CLI = str(Path(sys.executable).with_name("verl-offpolicy"))
STARTUP_TIMEOUT = 900  # to the first training step; start-up alone took 200 s on a loaded 2-core machine


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class DemoProcess:
    """``verl-offpolicy demo`` (the installed console script) in its own process group, HOME and XDG
    dirs pointed at an empty directory; its output is collected line by line."""

    def __init__(self, tmp_path: Path, *args: str):
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.out = tmp_path / "out"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")) if p
        )
        env["HOME"] = str(self.home)
        for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
            env[name] = str(self.home / name.lower())
        for name in ("MPLCONFIGDIR", "HF_DATASETS_CACHE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
            env.pop(name, None)
        self.env = env
        # --steps far beyond what runs before the signal: the run is always interrupted mid-way
        self.proc = spawn(
            [CLI, "demo", "--steps", "500", "--output-dir", str(self.out), "trainer.test_freq=-1", *args], env, None
        )
        self.lines: list[str] = []
        self.ray_dir: str | None = None
        self.recorded: list[psutil.Process] = []
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, predicate, what: str, timeout: float = STARTUP_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.proc.poll() is None, f"the demo exited ({self.proc.returncode}) before {what}:\n" + "\n".join(
                self.lines[-40:]
            )
            assert time.monotonic() < deadline, f"no {what} within {timeout}s:\n" + "\n".join(self.lines[-40:])
            time.sleep(0.5)

    def find_ray_dir(self) -> bool:
        """The run's Ray temp dir, from main_ppo's command line (``_temp_dir=``), once Ray runs in it."""
        if self.ray_dir is None:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                try:
                    match = re.search(r"_temp_dir=(\S+)", " ".join(child.cmdline()))
                except psutil.NoSuchProcess:
                    continue
                if match:
                    self.ray_dir = match.group(1)
        return self.ray_dir is not None and any("raylet" in p.name() for p in session_processes(self.ray_dir))

    def run_processes(self) -> list[psutil.Process]:
        """Every process of the run: the demo's descendants and its Ray session (remembered for cleanup)."""
        procs = psutil.Process(self.proc.pid).children(recursive=True) + session_processes(self.ray_dir)
        self.recorded = list({p.pid: p for p in procs}.values())
        return self.recorded

    def interrupt(self, signum: int) -> int:
        os.killpg(self.proc.pid, signum)  # what a terminal's Ctrl-C (SIGINT) or `timeout`/CI (SIGTERM) do
        returncode = self.proc.wait(timeout=300)
        self.reader.join(timeout=60)
        return returncode

    def cleanup(self) -> None:
        """End whatever of the run is still alive (after a failed test) and remove its Ray temp dir."""
        if self.proc.poll() is None:
            self.recorded += psutil.Process(self.proc.pid).children(recursive=True)
            kill_process_tree(self.proc, self.ray_dir)
        if self.ray_dir:
            self.recorded += session_processes(self.ray_dir)
        for proc in self.recorded:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        if self.ray_dir:
            shutil.rmtree(self.ray_dir, ignore_errors=True)

    def problems_after_interrupt(self, signum: int) -> list[str]:
        """What is wrong after the signal; expected: exit code 128 + signal, one last line (no
        traceback) naming the partial output, no process of the run alive, its Ray temp dir gone."""
        problems = []
        output = "\n".join(self.lines)
        if self.proc.returncode != 128 + signum:
            problems.append(f"exit code {self.proc.returncode}")
        if "Traceback" in output:
            problems.append("a traceback was printed")
        name = signal.Signals(signum).name
        last = self.lines[-1] if self.lines else ""
        if not (
            last.startswith(f"verl-offpolicy demo: interrupted by {name}: ")
            and f"partial output in {self.out} " in last
        ):
            problems.append(f"last line: {last!r}")
        _, alive = psutil.wait_procs(self.recorded, timeout=5)
        alive = [" ".join(p.cmdline()) for p in alive if _running(p)]
        alive += [" ".join(p.cmdline()) for p in session_processes(self.ray_dir) + session_processes(str(self.out))]
        if alive:
            problems.append(f"processes of the run alive: {alive}")
        if Path(self.ray_dir).exists():
            problems.append(f"Ray temp dir {self.ray_dir} left behind")
        if not (self.out / "train.log").exists():
            problems.append("no partial output (train.log)")
        if self.proc.returncode is not None and not problems:
            OutputDirLock(self.out).acquire().release()  # the directory is free again
        return problems + ([f"output:\n{output[-3000:]}"] if problems else [])


@pytest.mark.timeout(STARTUP_TIMEOUT + 600)
def test_ctrl_c_at_startup_stops_the_run_with_one_line(tmp_path):
    """Ctrl-C once main_ppo has started Ray: the run's processes and Ray temp dir are gone, one line."""
    demo = DemoProcess(tmp_path)
    try:
        demo.wait_for(demo.find_ray_dir, "Ray session")
        assert len(demo.run_processes()) >= 3, demo.recorded  # main_ppo, GCS, raylet at least
        demo.interrupt(signal.SIGINT)
        problems = demo.problems_after_interrupt(signal.SIGINT)
        assert problems == [], "\n".join(problems)
    finally:
        demo.cleanup()


# The kernel signals main_ppo and Ray's GCS and raylet at once (parent-death signals): bounded well under the
# minute the run used to go on for (until main_ppo's next write to the dead demo's pipe), generously for a loaded
# 2-core machine. Ray's agents and workers notice their raylet is gone on their own polling, the agents at times
# minutes later under load: the next start ends whatever of the run is still alive.
KILLED_RUN_CORE_ENDS_S = 30
KILLED_RUN_ENDS_S = 60
RUN_CORE = ("verl.trainer.main_ppo", "gcs_server", "raylet")


def _is_core(proc) -> bool:
    """main_ppo (the module it runs), Ray's GCS or raylet (the executable): not a helper process whose
    command line only mentions one of them (Ray's agents and log monitor name the raylet)."""
    try:
        argv = proc.cmdline()
    except psutil.Error:
        return False
    return argv[1:3] == ["-m", RUN_CORE[0]] or (bool(argv) and argv[0].rsplit("/", 1)[-1] in RUN_CORE[1:])


def _is_fork_in_flight(proc) -> bool:
    """A child still running its parent's program: the raylet starts a worker by fork then exec, and between
    the two the child has the raylet's command line (seen once in a full run: two "raylets")."""
    try:
        parent = proc.parent()
        return parent is not None and parent.cmdline() == proc.cmdline()
    except psutil.Error:
        return False


@pytest.mark.timeout(STARTUP_TIMEOUT + 600)
def test_sigkill_of_the_demo_ends_its_run_and_the_next_start_removes_what_it_left(tmp_path):
    """SIGKILL of the demo alone (the OOM killer, kill -9): nothing of it can clean up. main_ppo (in a session
    of its own) used to run on for a minute and its Ray temp dir stayed. Now the run dies with the demo, and
    the next start ends what is left of it (Ray's dashboard and runtime-env agents can outlive the raylet by
    minutes on a loaded machine) and removes its Ray temp dir (its owner is dead) before anything else."""
    demo = DemoProcess(tmp_path)
    try:
        demo.wait_for(demo.find_ray_dir, "Ray session")
        procs = demo.run_processes()
        assert len(procs) >= 3, procs  # main_ppo, GCS, raylet at least
        core = [p for p in procs if _is_core(p) and not _is_fork_in_flight(p)]
        assert len(core) == 3, [p.cmdline() for p in procs]
        demo.proc.kill()
        demo.proc.wait(timeout=60)
        _, alive = psutil.wait_procs(core, timeout=KILLED_RUN_CORE_ENDS_S)
        assert [" ".join(p.cmdline()) for p in alive if _running(p)] == []
        assert Path(demo.ray_dir).is_dir()  # left behind: the demo could not remove it
        a_file = tmp_path / "a_file"  # a start refused at once (its output dir is a file), after the clean-up
        a_file.write_text("x")
        second = subprocess.run(
            [CLI, "demo", "--output-dir", str(a_file)],
            capture_output=True,
            text=True,
            timeout=300,
            env=demo.env,
            stdin=subprocess.DEVNULL,
        )
        assert second.returncode == 2 and "is not a directory" in second.stderr, second.stderr
        assert not Path(demo.ray_dir).exists()
        _, alive = psutil.wait_procs(procs, timeout=KILLED_RUN_ENDS_S)  # the clean-up waits for what it ends
        alive = [" ".join(p.cmdline()) for p in alive if _running(p)]
        alive += [" ".join(p.cmdline()) for p in session_processes(demo.ray_dir)]
        assert alive == [], alive
    finally:
        demo.cleanup()


@pytest.mark.timeout(STARTUP_TIMEOUT + 900)
def test_sigterm_during_training_stops_everything_and_nothing_is_written_outside_the_run(tmp_path):
    """SIGTERM after the first training step (what `timeout`, CI cancels and job schedulers send).

    One run checks: a second demo into the same output directory is refused while it trains (naming
    its PID); SIGTERM ends every process of the run, removes its Ray temp dir, prints one line; and
    the run wrote nothing under HOME/XDG dirs (datasets cache, matplotlib cache, Ray's token).
    Every problem found is reported together.
    """
    # to the first step sooner: no validation, 4 prompts x 4 samples (DemoProcess sets trainer.test_freq)
    demo = DemoProcess(tmp_path, *[o for o in SMALL_DEMO if not o.startswith("trainer.test_freq=")])
    try:
        demo.wait_for(lambda: any(line.startswith("[cpu-demo] step 1:") for line in demo.lines), "first training step")
        second = subprocess.run(
            [CLI, "demo", "--steps", "1", "--output-dir", str(demo.out)],
            capture_output=True,
            text=True,
            timeout=300,
            env=demo.env,
            stdin=subprocess.DEVNULL,
        )
        assert second.returncode == 2, second.stderr
        assert f"is in use by another demo run (PID {demo.proc.pid}" in second.stderr, second.stderr
        assert demo.proc.poll() is None and demo.find_ray_dir()
        assert len(demo.run_processes()) >= 5, demo.recorded  # main_ppo, GCS, raylet, workers
        demo.interrupt(signal.SIGTERM)
        problems = demo.problems_after_interrupt(signal.SIGTERM)
        if "step:1 - " not in (demo.out / "train.log").read_text(errors="replace"):
            problems.append("train.log lacks step 1")
        written = [str(p) for p in demo.home.rglob("*")]
        if written:
            problems.append(f"written under HOME: {written}")
        if not (demo.out / ".cache" / "huggingface" / "datasets").is_dir():
            problems.append("the datasets cache is not under the output dir")
        assert problems == [], "\n".join(problems)
    finally:
        demo.cleanup()
