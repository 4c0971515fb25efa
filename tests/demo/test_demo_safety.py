"""``verl-offpolicy demo`` refuses what it cannot do before starting anything, one run per output
directory, and keeps its caches and Ray's token out of the home directory. Real processes, real
locks and real unwritable paths (tests run as root, so permission bits do not block writes: the
read-only directory is ``/sys/kernel``, where the kernel refuses new files to everyone)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl_offpolicy.demo.environment import run_files_env
from verl_offpolicy.demo.errors import DemoInputError
from verl_offpolicy.demo.output_dir import LOCK_NAME, OutputDirLock, prepare_output_dir

CLI_TIMEOUT = 300  # the console script imports verl: slow on a busy machine
READ_ONLY_DIR = "/sys/kernel"


def _cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")) if p
    )
    env.update(extra)
    return env


def _demo_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "verl_offpolicy.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        env=_cli_env(),
        stdin=subprocess.DEVNULL,
    )


def _bad_dirs(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """name -> (path, the reason the message must give)."""
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    return {
        "file": (str(a_file), "is not a directory"),
        "file-in-path": (str(a_file / "run"), "cannot create the output directory"),
        "read-only": (READ_ONLY_DIR, "cannot write in the output directory"),
        "impossible": ("/proc/verl-offpolicy-demo/run", "cannot create the output directory"),
    }


@pytest.mark.parametrize("case", ["file", "file-in-path", "read-only", "impossible"])
def test_unusable_output_dir_is_one_clear_error(tmp_path, case):
    path, reason = _bad_dirs(tmp_path)[case]
    with pytest.raises(DemoInputError) as info:
        OutputDirLock(prepare_output_dir(path)).acquire()
    message = str(info.value)
    assert path in message and reason in message and "\n" not in message, message


@pytest.mark.parametrize("case", ["file-in-path", "read-only"])
@pytest.mark.slow  # fresh processes import verl (the console script, the lock holder)
def test_demo_cli_rejects_an_unusable_output_dir_in_one_line(tmp_path, case):
    """Through the console's code path: rc 2, one stderr line naming the directory, nothing started."""
    path, reason = _bad_dirs(tmp_path)[case]
    proc = _demo_cli("--steps", "1", "--output-dir", path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("verl-offpolicy demo: "), proc.stderr
    assert path in lines[0] and reason in lines[0]
    assert "[cpu-demo]" not in proc.stdout  # the run never started


@pytest.mark.slow  # fresh processes import verl (the console script, the lock holder)
def test_an_output_dir_held_by_a_live_run_is_refused_and_a_dead_runs_lock_is_taken_over(tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from verl_offpolicy.demo.output_dir import OutputDirLock, prepare_output_dir; "
            "OutputDirLock(prepare_output_dir(sys.argv[1])).acquire(); print('held', flush=True); time.sleep(600)",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=_cli_env(),
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert (out / LOCK_NAME).read_text().strip() == str(holder.pid)
        with pytest.raises(DemoInputError, match=rf"in use by another demo run \(PID {holder.pid}, lock "):
            OutputDirLock(out).acquire()
        proc = _demo_cli("--steps", "1", "--output-dir", str(out))
        assert proc.returncode == 2, proc.stderr
        assert f"in use by another demo run (PID {holder.pid}" in proc.stderr and str(out) in proc.stderr
    finally:
        holder.kill()
        holder.wait(timeout=60)
    # The holder is dead; its PID is still in the lock file: the next run takes the lock over.
    assert (out / LOCK_NAME).read_text().strip() == str(holder.pid)
    lock = OutputDirLock(out).acquire()
    try:
        assert (out / LOCK_NAME).read_text().strip() == str(os.getpid())
    finally:
        lock.release()


def test_run_files_stay_under_the_output_and_ray_temp_dirs(tmp_path):
    """The variables that keep a run's datasets cache, matplotlib cache and Ray token out of $HOME;
    a variable the user set is kept (the run's own e2e check is in test_cpu_e2e.py)."""
    ray_dir = tmp_path / "ray"
    ray_dir.mkdir()
    env = run_files_env(tmp_path / "out", str(ray_dir), {})
    assert env["HF_DATASETS_CACHE"].startswith(str(tmp_path / "out"))
    assert env["MPLCONFIGDIR"].startswith(str(tmp_path / "out"))
    assert env["VLLM_CACHE_ROOT"].startswith(str(tmp_path / "out"))  # demo --rollout vllm wrote ~/.cache/vllm
    token = Path(env["RAY_AUTH_TOKEN_PATH"])
    assert token.parent == ray_dir and len(token.read_text()) == 64 and token.stat().st_mode & 0o777 == 0o600
    kept = run_files_env(tmp_path / "out", str(ray_dir), {"MPLCONFIGDIR": "/mine", "RAY_AUTH_MODE": "disabled"})
    assert "MPLCONFIGDIR" not in kept and "RAY_AUTH_TOKEN_PATH" not in kept


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.slow  # a fresh Python process (the middle one)
def test_a_command_started_through_the_launcher_dies_with_its_parent():
    """The demo's SIGKILL ends main_ppo (in a session of its own): the launcher's parent-death signal, shown
    on `sleep` started by a middle process that is then SIGKILLed."""
    import psutil

    code = (
        "import os, subprocess, sys, time; from verl_offpolicy.demo.parent_death import launcher; "
        "p = subprocess.Popen(launcher(os.getpid(), ['sleep', '300']), start_new_session=True); "
        "print(p.pid, flush=True); time.sleep(300)"
    )
    middle = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=_cli_env())
    child = None
    try:
        child = psutil.Process(int(middle.stdout.readline()))
        deadline = time.monotonic() + 60
        while child.cmdline()[:1] != ["sleep"]:  # the launcher has exec'd the command
            assert time.monotonic() < deadline
            time.sleep(0.1)
        middle.kill()
        middle.wait(timeout=60)
        psutil.wait_procs([child], timeout=30)
        assert not _alive(child), child
    finally:  # nothing of this test survives it, whatever failed
        middle.kill()
        middle.wait(timeout=60)
        if child is not None and _alive(child):
            child.kill()


def _alive(proc) -> bool:
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_only_temp_dirs_whose_owner_died_are_removed(tmp_path):
    """The next start removes what a SIGKILLed run left (its Ray temp dir): only dirs whose owner process is
    dead; a live owner's dir, and a dir without an owner file (not made by us), stay."""
    import psutil

    from verl_offpolicy.demo.process import OWNER_NAME, make_owned_temp_dir, remove_dead_owners_dirs

    dead = subprocess.Popen(["sleep", "0.5"])
    started = psutil.Process(dead.pid).create_time()
    dead.wait(timeout=60)
    killed = tmp_path / "vo-ray-killed"
    killed.mkdir()
    (killed / OWNER_NAME).write_text(f"{dead.pid} {started}\n")
    (killed / "session_latest").mkdir()
    live = Path(make_owned_temp_dir("vo-ray-", str(tmp_path)))
    unknown = tmp_path / "vo-ray-unknown"
    unknown.mkdir()
    other = tmp_path / "not-ours"
    other.mkdir()
    (other / OWNER_NAME).write_text(f"{dead.pid} {started}\n")
    # the killed run's orphans (Ray's agents outlive its raylet; reparented, as here, to init): one ends on
    # SIGTERM, one ignores it (only SIGKILL ends it); a live run's process stays
    script = tmp_path / "sleeper.py"
    script.write_text(
        "import signal, sys, time\nif sys.argv[1] == 'stubborn':\n    signal.signal(signal.SIGTERM, "
        "signal.SIG_IGN)\ntime.sleep(600)\n"
    )

    def orphan(kind: str, temp_dir: Path) -> psutil.Process:
        shell = f"{sys.executable} {script} {kind} --temp-dir={temp_dir} >/dev/null 2>&1 & echo $!"
        return psutil.Process(
            int(subprocess.run(["sh", "-c", shell], capture_output=True, text=True, timeout=60).stdout)
        )

    orphans = [orphan("polite", killed), orphan("stubborn", killed)]
    bystander = orphan("polite", live)
    try:
        time.sleep(1.0)  # the handlers are installed
        assert remove_dead_owners_dirs("vo-ray-", str(tmp_path), grace_s=2.0) == [str(killed)]
        assert sorted(p.name for p in tmp_path.iterdir() if p != script) == sorted(
            [live.name, "vo-ray-unknown", "not-ours"]
        )
        _, alive = psutil.wait_procs(orphans, timeout=60)
        assert alive == []
        assert bystander.is_running()
    finally:
        for proc in (*orphans, bystander):
            with contextlib.suppress(psutil.Error):
                proc.kill()


def test_a_finished_run_without_matplotlib_skips_the_plot_with_a_note(tmp_path, monkeypatch):
    """`pip install -e .` without the plot extra: the run trained, its results are read and reported; the
    reward curve is skipped with one line (it used to raise ModuleNotFoundError after training)."""
    import io
    import json

    from verl_offpolicy.demo.results import TRAIN_SCORE
    from verl_offpolicy.demo.run import DemoRun, _collect

    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an environment without matplotlib gives: ImportError
    run = DemoRun(
        preset="grpo",
        steps=2,
        seed=0,
        output_dir=tmp_path,
        timeout=60.0,
        overrides=(),
        config_name="ppo_trainer",
        model="tiny",
        plot=True,
        base_env={},
    )
    run.metrics_path.write_text("".join(json.dumps({"step": s, "data": {TRAIN_SCORE: 0.5}}) + "\n" for s in (1, 2)))
    console = io.StringIO()
    result = _collect(
        run,
        ["main_ppo"],
        t0=0.0,
        wall=1.0,
        first_step_s=None,
        ray_temp_dir="/tmp/none",
        listening=[],
        shared_memory={},
        console=console,
    )
    assert result.plot_path is None and [m["step"] for m in result.metrics] == [1, 2]
    note = console.getvalue().strip()
    assert note.startswith("[cpu-demo] reward curve skipped: matplotlib is not installed") and "\n" not in note
    assert "pip install 'verl-offpolicy[plot]'" in note
    assert not (tmp_path / "reward_curve.png").exists()


@pytest.mark.slow  # a fresh process imports verl
def test_verls_checkpoint_locks_stay_in_the_runs_temp_dir(tmp_path):
    """verl's local_mkdir_safe (three calls per checkpoint) leaves ckpt_<hash>.lock in the temp dir; in a
    demo run's environment that is the run's Ray temp dir (removed after the run), not /tmp."""
    ray_dir = tmp_path / "ray"
    ray_dir.mkdir()
    base = {k: v for k, v in _cli_env().items() if k != "TMPDIR"}
    env = {**base, **run_files_env(tmp_path / "out", str(ray_dir), base)}
    code = "import sys; from verl.utils.fs import local_mkdir_safe; local_mkdir_safe(sys.argv[1])"
    subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "ckpt" / "global_step_1")], check=True, timeout=CLI_TIMEOUT, env=env
    )
    assert (tmp_path / "ckpt" / "global_step_1").is_dir()
    assert [p.name.startswith("ckpt_") and p.name.endswith(".lock") for p in ray_dir.rglob("*.lock")] == [True]
    kept = run_files_env(tmp_path / "out", str(ray_dir), {"TMPDIR": "/mine"})
    assert "TMPDIR" not in kept


@pytest.mark.slow  # fresh processes import verl (the console script, the lock holder)
def test_the_reward_plot_writes_nothing_under_home(tmp_path):
    """write_plot (matplotlib in the demo's own process) with an empty HOME and XDG dirs."""
    home = tmp_path / "home"
    home.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    xdg = {k: str(home / k.lower()) for k in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME")}
    env = _cli_env(HOME=str(home), **xdg)
    env.pop("MPLCONFIGDIR", None)
    code = (
        "import sys; from verl_offpolicy.demo.plot import write_plot; "
        "write_plot([{'step': 1, 'critic/score/mean': 0.5}], {0: 0.1}, sys.argv[1])"
    )
    subprocess.run([sys.executable, "-c", code, str(out / "curve.png")], check=True, timeout=CLI_TIMEOUT, env=env)
    assert (out / "curve.png").stat().st_size > 0
    assert list(home.rglob("*")) == []


def test_tiny_models_built_in_threads_at_once_are_the_seeded_model(tmp_path):
    """The tests' shared runs build their inputs in threads (``tests.scenario_runs.DemoRuns``): the tiny
    model's weights come from torch's global RNG, so builds at the same time must not interleave draws.
    Four threads build at once; every model equals a build made alone, and the caller's RNG is untouched."""
    import threading

    import torch
    from safetensors.torch import load_file

    from verl_offpolicy.demo.tiny import build_tiny

    def weights(root):
        return load_file(str(Path(build_tiny(root)["model_path"]) / "model.safetensors"))

    alone = weights(tmp_path / "alone")
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    start = threading.Barrier(4)
    threads = [threading.Thread(target=lambda i=i: (start.wait(), build_tiny(tmp_path / f"t{i}"))) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert torch.equal(torch.rand(3), expected_next)
    for i in range(4):
        built = weights(tmp_path / f"t{i}")
        assert built.keys() == alone.keys()
        assert all(torch.equal(built[k], alone[k]) for k in alone), i


def test_ray_start_is_retried_only_on_rays_start_up_timeout_and_at_most_three_times():
    """The demo and the local cluster start Ray again when a raylet missed Ray's fixed 30 s (a loaded machine);
    any other error, and the third timeout, are raised."""
    from verl_offpolicy.demo.process import RAY_START_TIMED_OUT, retry_ray_start

    said, calls = [], []

    def start(outcomes):
        def attempt(n):
            calls.append(n)
            outcome = outcomes[n - 1]
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        return attempt

    timeout = RuntimeError(f"main_ppo exited: Exception: {RAY_START_TIMED_OUT}. This could happen ...")
    assert retry_ray_start(start([timeout, timeout, "ok"]), RuntimeError, said.append, "[x]") == "ok"
    assert calls == [1, 2, 3]
    assert said == [
        f"[x] Ray's raylet missed the fixed 30 s Ray gives it to start (a loaded machine; nothing ran yet): "
        f"starting again, attempt {n} of 3"
        for n in (2, 3)
    ]
    calls.clear()
    with pytest.raises(RuntimeError, match="timed out during startup"):
        retry_ray_start(start([timeout, timeout, timeout, "never"]), RuntimeError, said.append, "[x]")
    assert calls == [1, 2, 3]
    calls.clear()
    with pytest.raises(RuntimeError, match="bad key"):
        retry_ray_start(start([RuntimeError("bad key"), "never"]), RuntimeError, said.append, "[x]")
    assert calls == [1]
    with pytest.raises(ValueError):  # not one of the errors retried
        retry_ray_start(start([ValueError(RAY_START_TIMED_OUT), "never"]), RuntimeError, said.append, "[x]")


@pytest.mark.slow  # starts a Python process (the file's live holder)
def test_shared_memory_a_run_left_unmapped_is_found_and_anothers_live_file_is_not():
    """What ``run_subprocess`` unlinks after a run besides the files its processes held at the first step:
    files of the run's kinds created since the run started that no live process maps (a vLLM run left a
    ``sem.mp-*`` semaphore this way: created after the first step, its creator killed). A file some live
    process maps (another job's), one that existed before, and one of another kind are never taken."""
    from verl_offpolicy.demo.process import SHM_DIR, orphaned_since, shared_memory_listing

    tag = f"votest{os.getpid()}"
    old, left, live, other = (
        f"{SHM_DIR}/{name}" for name in (f"psm_{tag}_old", f"sem.mp-{tag}", f"psm_{tag}_live", f"{tag}_other")
    )
    holder = None
    try:
        Path(old).write_bytes(b"\0" * 4096)
        before = shared_memory_listing()
        for path in (left, live, other):
            Path(path).write_bytes(b"\0" * 4096)
        # a live process that maps `live`, as a semaphore's or segment's holder does
        code = (
            f"import mmap, sys, time\nf = open({live!r}, 'r+b')\nm = mmap.mmap(f.fileno(), 4096)\n"
            "print('mapped', flush=True)\ntime.sleep(600)"
        )
        holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "mapped"
        found = [p for p in orphaned_since(before) if tag in p]
        assert found == [left]
        holder.kill()
        holder.wait(timeout=60)
        assert [p for p in orphaned_since(before) if tag in p] == sorted([left, live])  # its holder is gone
    finally:
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait(timeout=60)
        for path in (old, left, live, other):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


@pytest.mark.slow  # starts a Python process (the semaphore's live holder)
def test_a_live_spawn_context_semaphore_of_another_process_is_never_orphaned():
    """glibc maps a named semaphore under a temporary name (``sem.XXXXXX (deleted)``), so by name a semaphore in
    use looks unmapped: a demo's clean-up unlinked another run's live ``sem.mp-*`` and its vLLM engine died
    (``SemLock._rebuild ... FileNotFoundError``). Holders are found by inode."""
    from verl_offpolicy.demo.process import SHM_DIR, orphaned_since, shared_memory_listing

    before = shared_memory_listing()
    code = (
        "import multiprocessing as mp, sys, time\nlock = mp.get_context('spawn').Lock()\n"
        "print(lock._semlock.name, flush=True)\ntime.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        name = holder.stdout.readline().strip()  # e.g. /mp-abc123: the file is /dev/shm/sem.mp-abc123
        path = f"{SHM_DIR}/sem.{name.lstrip('/')}"
        assert os.path.exists(path), path
        assert path not in orphaned_since(before)
    finally:
        holder.kill()
        holder.wait(timeout=60)


@pytest.mark.slow  # starts a Python process (the file's holder)
def test_a_runs_clean_up_takes_only_files_its_own_processes_mapped(tmp_path):
    """``owned`` (what :class:`SharedMemoryWatch` recorded of the run's processes): an unmapped file another
    process made and left is not the run's to remove; one the run's process mapped, then left, is."""
    from verl_offpolicy.demo.process import SHM_DIR, SharedMemoryWatch, orphaned_since, shared_memory_listing

    tag = f"votest{os.getpid()}"
    ours, theirs = f"{SHM_DIR}/psm_{tag}_ours", f"{SHM_DIR}/psm_{tag}_theirs"
    before = shared_memory_listing()
    code = (
        f"import mmap, time\nf = open({ours!r}, 'w+b'); f.write(bytes(4096)); f.flush()\n"
        "m = mmap.mmap(f.fileno(), 4096)\nprint('mapped', flush=True)\ntime.sleep(600)"
    )
    run = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        Path(theirs).write_bytes(b"\0" * 4096)
        assert run.stdout.readline().strip() == "mapped"
        watch = SharedMemoryWatch()
        watch.poll(run, None)
        run.kill()
        run.wait(timeout=60)
        assert [p for p in orphaned_since(before, owned=watch.inodes) if tag in p] == [ours]
        assert [p for p in orphaned_since(before) if tag in p] == sorted([ours, theirs])  # without owned: both
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(timeout=60)
        for path in (ours, theirs):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


@pytest.mark.slow  # starts Python processes
def test_ending_a_run_stops_its_ray_session_while_the_driver_still_shuts_down(tmp_path):
    """verl's trainer is a Ray actor, outside the driver's process group: ending the run must stop it at once,
    not once the driver has shut Ray down (a Ctrl-C'd demo trained three more steps meanwhile; CI's
    test_demo_rerun saw the run reach its last step). A "driver" that takes 3 s to exit on SIGTERM and a
    "worker" with the session's marker each write a line when they get SIGTERM: the worker's comes first."""
    from verl_offpolicy.demo.process import kill_process_tree

    marker = str(tmp_path / "ray-session-marker")
    events = tmp_path / "events"
    handler = (
        "import signal, sys, time\n"
        "def on_term(*_):\n"
        "    open({events!r}, 'a').write({name!r} + ' got SIGTERM\\n')\n"
        "    time.sleep({linger})\n"
        "    open({events!r}, 'a').write({name!r} + ' exits\\n')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "print('ready', flush=True)\n"
        "time.sleep(300)\n"
    )
    driver = subprocess.Popen(
        [sys.executable, "-c", handler.format(events=str(events), name="driver", linger=3)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", handler.format(events=str(events), name="worker", linger=0), marker],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert driver.stdout.readline().strip() == "ready" and worker.stdout.readline().strip() == "ready"
        kill_process_tree(driver, marker, grace_s=30)
        worker.wait(timeout=60)
        lines = events.read_text().splitlines()
        assert lines.index("worker got SIGTERM") < lines.index("driver exits"), lines
    finally:
        for proc in (driver, worker):
            proc.kill()
            proc.wait(timeout=60)


@pytest.mark.slow  # starts Python processes
def test_ending_a_run_ends_the_children_of_its_ray_processes_too(tmp_path):
    """A Ray worker's own children (vLLM's engine processes) have no Ray temp dir in their command line:
    ending the run must end them too, before their parent is gone (they then hold ``/dev/shm`` segments as
    orphans; a SIGINT'd vLLM demo left two). Shown with a process carrying the session's marker that starts
    ``sleep`` in a session of its own, and the run's main process beside it."""
    import psutil

    from verl_offpolicy.demo.process import kill_process_tree

    marker = str(tmp_path / "ray-session-marker")
    code = (
        "import subprocess, sys, time; p = subprocess.Popen(['sleep', '300'], start_new_session=True); "
        "print(p.pid, flush=True); time.sleep(300)"
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", code, marker], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    main = subprocess.Popen(["sleep", "300"], start_new_session=True)
    grandchild = None
    try:
        grandchild = psutil.Process(int(worker.stdout.readline()))
        killed = kill_process_tree(main, marker, grace_s=10)
        worker.wait(timeout=60)
        psutil.wait_procs([grandchild], timeout=30)
        assert not _alive(grandchild), grandchild
        assert {main.pid, worker.pid, grandchild.pid} <= set(killed)
    finally:  # nothing of this test survives it, whatever failed
        for proc in (worker, main):
            proc.kill()
            proc.wait(timeout=60)
        if grandchild is not None and _alive(grandchild):
            grandchild.kill()


@pytest.mark.slow  # starts a Python process (the run)
def test_a_log_that_cannot_be_written_ends_the_run_at_once_naming_the_path():
    """A full output disk once killed the log pump; nobody drained the run's pipe, the run blocked after 64 KiB
    and the demo waited its whole timeout. ``/dev/full`` fails every write with ENOSPC, as a full disk does."""
    from verl_offpolicy.demo.errors import DemoError
    from verl_offpolicy.demo.launch import run_subprocess

    # prints far more than a pipe holds, then would sleep for the whole timeout
    code = "import sys, time\nfor i in range(20000): print('x' * 80)\nsys.stdout.flush()\ntime.sleep(600)"
    start = time.monotonic()
    with pytest.raises(
        DemoError, match=r"cannot write the run's log /dev/full: No space left on device \(.*\); the run was ended"
    ) as info:
        run_subprocess([sys.executable, "-c", code], env=dict(os.environ), log_path="/dev/full", timeout=300)
    assert time.monotonic() - start < 120, "the run was not ended at once"
    assert info.value.__context__ is None or not isinstance(info.value.__context__, OSError)


@pytest.mark.e2e  # builds a demo command (the suite's rule: what builds one is in the end-to-end tier); runs nothing
@pytest.mark.slow
def test_ray_runs_in_a_subdir_of_the_runs_private_dir(tmp_path):
    """Ray makes its temp dir mode 0777 (another local user could replace a run's files in it); the demo hands
    Ray a subdir of its own 0700 dir, which holds the run's token and temporary files."""
    from verl_offpolicy.demo.command import DemoInputs, demo_command
    from verl_offpolicy.demo.process import make_owned_temp_dir

    private = make_owned_temp_dir("vo-ray-", str(tmp_path))
    inputs = DemoInputs(
        model_path=str(tmp_path), tokenizer_path=str(tmp_path), train_files=str(tmp_path), val_files=str(tmp_path)
    )
    command = demo_command(inputs, output_dir=tmp_path / "out", ray_temp_dir=private)
    assert f"+ray_kwargs.ray_init._temp_dir={private}/ray" in command
    assert Path(private).stat().st_mode & 0o777 == 0o700
