"""`verl-offpolicy cluster stop` ends what the cluster recorded, and the demo's next start ends what a SIGKILLed run
left, found by its Ray session dir.

The cluster's and the run's processes are stand-ins (``sleep``, ``sh``): a recorded server with a child, a Ray process
naming the session dir, and one whose command line is a bare title holding a log file of the session open, as Ray's
retitled ``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent`` do. No Ray is started.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from verl_offpolicy.demo.cluster import (
    MARKER_NAME,
    MARKER_TEXT,
    SERVER_NAME,
    STATE_NAME,
    ClusterError,
    LocalCluster,
    node_resource,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cluster_dir(parent: Path) -> tuple[Path, Path]:
    """A cluster dir as `cluster start` makes it (marker, Ray temp dir with a session's logs); (dir, logs)."""
    path = parent / "vo-cluster-abc"
    logs = path / "ray" / "session_1" / "logs"
    logs.mkdir(parents=True)
    (path / MARKER_NAME).write_text(MARKER_TEXT)
    return path, logs


def _record_server(path: Path, proc: psutil.Process, started_offset: float = 0.0) -> None:
    (path / SERVER_NAME).write_text(json.dumps({"pid": proc.pid, "started": proc.create_time() + started_offset}))


def _orphan(shell: str) -> psutil.Process:
    """``shell``'s background command, reparented to init (as Ray's agents are once their raylet is gone)."""
    out = subprocess.run(["sh", "-c", f"{shell} & echo $!"], capture_output=True, text=True, timeout=60).stdout
    return psutil.Process(int(out))


def _sleeper(*args: str) -> subprocess.Popen:
    """A process whose command line names ``args``."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", *args])


def _kill(procs) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()


@pytest.mark.slow  # starts the command line (a Python process)
def test_stop_under_timeout_with_a_relative_dir_ends_the_recorded_cluster_and_spares_its_wrapper(tmp_path):
    """`cd <parent> && timeout 120 env ... verl-offpolicy cluster stop --dir vo-cluster-abc`, the wrapper's argv naming
    the dir and its Ray dir: exit 0 (the stop once SIGTERMed its own `timeout`: exit 143), the recorded server, its
    child, a Ray process and a retitled agent ended, and only then the dir removed (a relative dir once matched no
    process: the dir went, all of them lived on). A process that merely names the dir, and another dir's, live on."""
    path, logs = _cluster_dir(tmp_path)
    # the server outlives `cluster start`, an orphan of init
    server = _orphan(
        f'{sys.executable} -c \'import subprocess, time; subprocess.Popen(["sleep", "300"]); time.sleep(300)\' '
        ">/dev/null 2>&1"
    )
    ray_proc = _sleeper(f"--session-dir={path}/ray/session_1")
    with open(logs / "dashboard_agent.out", "w") as log:  # its command line is `sleep 300`: no dir in it
        agent = subprocess.Popen(["sleep", "300"], stdout=log)
    bystander = _sleeper(str(path))  # `tail -f D/server.log`, an editor of D's files, ...
    other = _sleeper(f"{path}x/ray/session_1")
    time.sleep(2.0)  # the server has started its child
    child = server.children()[0]
    _record_server(path, server)
    procs = [psutil.Process(p.pid) for p in (ray_proc, agent, bystander, other)] + [server, child]
    try:
        proc = subprocess.run(
            [
                "timeout",
                "120",
                "env",
                f"VO_CLUSTER={path}",
                f"VO_RAY_DIR={path}/ray",
                sys.executable,
                "-m",
                "verl_offpolicy.cli",
                "cluster",
                "stop",
                "--dir",
                path.name,
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=180,
            env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        for p in (ray_proc, agent):
            assert p.wait(timeout=60) is not None
        server_gone, _ = psutil.wait_procs([server, child], timeout=60)
        assert len(server_gone) == 2
        assert not path.exists()
        assert bystander.poll() is None and other.poll() is None
    finally:
        _kill(procs)
        for p in (ray_proc, agent, bystander, other):
            p.wait(timeout=60)


def test_the_dir_stays_while_a_process_of_the_cluster_lives_and_a_reused_pid_is_not_the_server(tmp_path, monkeypatch):
    """A process of the cluster that does not end (here: end_processes does nothing): stop raises naming its pid
    and the dir stays whole (token, state, logs: the only way to reach the cluster). A pid the dir recorded, now
    another process's (a different start time), is not signalled."""
    import verl_offpolicy.demo.cluster as cluster_module

    path, logs = _cluster_dir(tmp_path)
    with open(logs / "runtime_env_agent.out", "w") as log:
        agent = subprocess.Popen(["sleep", "300"], stdout=log)
    try:
        with monkeypatch.context() as m:
            m.setattr(cluster_module, "end_processes", lambda procs, grace_s=0: None)
            with pytest.raises(ClusterError, match=f"{agent.pid} \\(sleep\\).*{path} is kept"):
                LocalCluster(path).stop()
        assert (path / MARKER_NAME).is_file() and (logs / "runtime_env_agent.out").is_file()
        reused = subprocess.Popen(["sleep", "300"])
        try:
            _record_server(path, psutil.Process(reused.pid), started_offset=-100.0)
            LocalCluster(path).stop(grace_s=5.0)
            assert agent.wait(timeout=60) is not None and not path.exists()
            assert reused.poll() is None
        finally:
            reused.kill()
            reused.wait(timeout=60)
    finally:
        agent.kill()
        agent.wait(timeout=60)


def test_the_workers_by_node_leave_out_a_process_that_ended_while_the_listing_was_read(tmp_path, monkeypatch):
    """A process of the listing ends before its name is read (a Ray worker exiting mid-run): it is left out, and
    the node's raylet (a stand-in named ``raylet`` whose command line names node 0's resource) still reports its
    children (stand-ins named ``ray::Worker``). Before, the ended process's name raised out of the listing."""
    path, _ = _cluster_dir(tmp_path)
    (path / STATE_NAME).write_text(json.dumps({"nodes": [{}], "address": "127.0.0.1:1"}))
    raylet_exe, worker_exe = tmp_path / "raylet", tmp_path / "ray::Worker"
    shutil.copy("/bin/sh", raylet_exe)
    shutil.copy(shutil.which("sleep"), worker_exe)
    script = f'"{worker_exe}" 300 & "{worker_exe}" 300 & wait'
    raylet = subprocess.Popen([str(raylet_exe), "-c", script, "sh", f"--resources={node_resource(0)},CPU"])
    short = subprocess.Popen(["sleep", "0"])
    ended = psutil.Process(short.pid)
    short.wait(timeout=60)  # reaped: its /proc entry is gone, its name cannot be read
    try:
        monkeypatch.setattr(LocalCluster, "processes", lambda self, extra=(): [ended, psutil.Process(raylet.pid)])
        deadline = time.monotonic() + 60
        while len(psutil.Process(raylet.pid).children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert LocalCluster(path).workers_by_node() == {0: ["ray::Worker", "ray::Worker"]}
    finally:
        _kill(psutil.Process(raylet.pid).children() + [psutil.Process(raylet.pid)])
        raylet.wait(timeout=60)


def test_the_next_start_ends_a_killed_runs_retitled_agents_found_by_their_session_dir(tmp_path):
    """A SIGKILLed run leaves Ray's DashboardAgent and RuntimeEnvAgent as orphans of init, their command line a bare
    title: the cmdline sweep does not see them, remove_dead_owners_dirs finds them by the session logs they hold
    open, ends them, then removes the dir. A live run's agent (the same kind, its owner alive) stays."""
    from verl_offpolicy.demo.process import OWNER_NAME, make_owned_temp_dir, remove_dead_owners_dirs, session_processes

    dead = subprocess.Popen(["sleep", "0.1"])
    started = psutil.Process(dead.pid).create_time()
    dead.wait(timeout=60)
    killed = tmp_path / "vo-ray-killed"
    (killed / "ray" / "session_1" / "logs").mkdir(parents=True)
    (killed / OWNER_NAME).write_text(f"{dead.pid} {started}\n")
    live = Path(make_owned_temp_dir("vo-ray-", str(tmp_path)))
    (live / "ray" / "session_2" / "logs").mkdir(parents=True)
    logs = killed / "ray" / "session_1" / "logs"
    agents = [
        _orphan(f"sleep 300 >{logs}/dashboard_agent.out 2>{logs}/dashboard_agent.err"),
        _orphan(f"sleep 301 >{logs}/runtime_env_agent.out 2>&1"),
    ]
    bystander = _orphan(f"sleep 302 >{live}/ray/session_2/logs/dashboard_agent.out 2>&1")
    try:
        assert all(a.ppid() != os.getpid() for a in agents)  # orphans: no parent to find them by
        assert {p.pid for p in session_processes(str(killed))} & {
            a.pid for a in agents
        } == set()  # the old sweep's blind spot
        assert remove_dead_owners_dirs("vo-ray-", str(tmp_path), grace_s=2.0) == [str(killed)]
        _, alive = psutil.wait_procs(agents, timeout=60)
        assert alive == [] and not killed.exists()
        assert _alive(bystander) and live.is_dir()
    finally:
        _kill([*agents, bystander])


RAY_DRIVER = """
import sys, time
import ray
ray.init(_temp_dir=sys.argv[1], include_dashboard=False, _node_ip_address="127.0.0.1", num_cpus=1)
print("up", flush=True)
time.sleep(600)
"""
AGENT_TITLES = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(1.0)
    raise AssertionError(f"not within {timeout:g} s: {what}")


@pytest.mark.e2e  # starts a Ray session (one node on 127.0.0.1, one CPU)
def test_a_sigkilled_ray_driver_leaves_its_agents_and_the_next_sweep_ends_them():
    """A real Ray session in a run's owned temp dir, its driver SIGKILLed (the demo's fate: GCS and raylet die with
    it): Ray's DashboardAgent and RuntimeEnvAgent live on, retitled, orphans of init, and the command-line sweep
    does not see them; remove_dead_owners_dirs ends them and removes the dir."""
    import signal
    import tempfile

    from verl_offpolicy.cpu.platform import LOOPBACK_ENV
    from verl_offpolicy.demo.environment import ray_token_env
    from verl_offpolicy.demo.process import (
        OWNER_NAME,
        dir_processes,
        ray_dir_in,
        remove_dead_owners_dirs,
        session_processes,
    )

    path = Path(tempfile.mkdtemp(prefix="vo-sweep-e2e-", dir="/tmp"))  # Ray's socket paths must stay short
    env = {**os.environ, **LOOPBACK_ENV, **ray_token_env(path, {}), "RAY_USAGE_STATS_ENABLED": "0"}
    for key in ("RAY_ADDRESS", "RAY_AUTH_MODE"):
        env.pop(key, None)
    driver = subprocess.Popen(
        [sys.executable, "-c", RAY_DRIVER, ray_dir_in(path)],
        env=env,
        cwd=str(path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    (path / OWNER_NAME).write_text(f"{driver.pid} {psutil.Process(driver.pid).create_time()}\n")
    try:

        def agents():
            procs = [p for p in dir_processes(str(path)) if _alive(p) and p.name() in AGENT_TITLES]
            return procs if {p.name() for p in procs} == set(AGENT_TITLES) else None

        found = _wait_for(agents, 300, "Ray's two agents up")
        assert all(" ".join(p.cmdline()).strip() in AGENT_TITLES for p in found)  # retitled: no dir in the cmdline
        driver.kill()
        driver.wait(timeout=60)
        _wait_for(
            lambda: not any(_alive(p) and p.name() in ("raylet", "gcs_server") for p in dir_processes(str(path))),
            120,
            "the raylet and GCS end with their driver",
        )
        assert [p for p in found if _alive(p)] == found, "the agents ended with the raylet: nothing to sweep here"
        assert {p.pid for p in session_processes(str(path))} & {p.pid for p in found} == set()
        assert remove_dead_owners_dirs("vo-sweep-e2e-", "/tmp", grace_s=10.0) == [str(path)]
        assert not any(_alive(p) for p in found) and not path.exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
        _kill(dir_processes(str(path)) if path.exists() else [])
        driver.wait(timeout=60)
        import shutil

        shutil.rmtree(path, ignore_errors=True)
