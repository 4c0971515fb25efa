"""The cluster run: a Ray cluster of three nodes on 127.0.0.1 started before the run, as a user's cluster exists
before their job, the demo joining it, and ``verl-offpolicy doctor --address`` after the run.

The run is the overlapped mode's ``opmd`` run at (s, d) = (2, 1) (tests/scenario_runs.py: ``opmd_overrides``,
:data:`STEPS` steps, a checkpoint every :data:`SAVE_FREQ` steps, verl's rollout dumps): the overlapped mode's
tests compare it with the colocated run on one node and resume from its checkpoint (tests/scheduler/test_overlapped.py),
the cluster tests check where it ran and the cluster around it (tests/scheduler/test_cluster_e2e.py). One shared job
(tests/jobs.py) that leaves nothing behind: it stops the cluster and records what was left.

Nodes 0 and 1 have two fake GPUs each (the trainer's pool, two ranks, takes one node, the standalone rollout's, two
replicas, the other: the run is the pair run of tests/scenario_runs.py, ``PAIR``); node 2
has neither CPUs nor GPUs (so no job lands on it) and workers that cannot see the plugin
(``VERL_USE_EXTERNAL_PLUGINS=none`` in its raylet's environment, which its workers inherit).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tests.scenario_runs import SCHEDULED_STEPS, demo_command, opmd_overrides
from verl_offpolicy.demo.cluster import LocalCluster, NodeSpec, node_resource
from verl_offpolicy.demo.results import read_metrics, training_metrics
from verl_offpolicy.doctor import STORAGE_NODE_KEY
from verl_offpolicy.glue.plugin_setting import PLUGINS_ENV

STEPS = SCHEDULED_STEPS
SAVE_FREQ = 2  # the overlapped resume test starts from the step-2 checkpoint
RUN_TIMEOUT = 1200
DOCTOR_TIMEOUT = 900
# nodes 0 and 1: two fake GPUs each (the trainer's pool, two ranks, and the rollout's, two replicas); node 2: no
# resources, no plugin
NODES = [NodeSpec(gpus=2, cpus=12), NodeSpec(gpus=2, cpus=12), NodeSpec(gpus=0, cpus=0, env={PLUGINS_ENV: "none"})]
BLIND = 2


def cluster_overrides(output_dir: Path) -> list[str]:
    """The run's overrides: the overlapped (2, 1) run's, its checkpoints and rollout dumps, and TransferQueue's
    storage unit (1 CPU) on the trainer's node: dealt by node id, it would land on the CPU-less third node on
    one run in three and never start (the fix doctor names)."""
    return [
        *opmd_overrides(2, 1, "overlapped"),
        f"trainer.save_freq={SAVE_FREQ}",
        f"trainer.rollout_data_dir={output_dir / 'rollouts'}",
        f"+{STORAGE_NODE_KEY}={node_resource(0)}",
    ]


@dataclass(frozen=True)
class ClusterRun:
    """What the cluster job saw: the demo's process (exit code, output), its output dir, the worker names seen on
    each node while it ran (and the most processes of each name at once), every listening socket of the cluster
    ("ip name"), whether the cluster outlived the run, doctor's process, and what of the cluster was left once it
    was stopped."""

    proc: subprocess.CompletedProcess
    output_dir: Path
    seen: dict[int, dict[str, int]]
    listening: set[str]
    alive_after: bool
    address_file: bool  # Ray's ray_current_cluster was in the cluster's own dir while it ran
    doctor: subprocess.CompletedProcess
    left_after_stop: list[str]

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """The training steps' metrics (verl's file logger), as a demo result's; a failed run raises with its output."""
        if self.proc.returncode != 0:
            raise AssertionError(
                "the cluster run exited with "
                f"{self.proc.returncode}:\n{self.proc.stdout[-2000:]}\n{self.proc.stderr[-3000:]}"
            )
        return training_metrics(read_metrics(self.output_dir / "metrics.jsonl"))


def cluster_job(demo_runs):
    """The cluster run, a shared job queued once per session (its :class:`ClusterRun` from ``.result()``)."""
    return demo_runs.submit(
        ("cluster_run",), lambda: run_on_cluster(demo_runs.tmp_dir("cluster") / "out", demo_runs.environ)
    )


def run_on_cluster(out: Path, environ: dict[str, str]) -> ClusterRun:
    """Start the cluster, run the demo on it while watching its nodes, run doctor, stop the cluster."""
    cluster = LocalCluster.start(NODES, base_env=environ)
    seen: dict[int, dict[str, int]] = {}
    listening: set[str] = set()
    done = threading.Event()

    def watch():
        while not done.is_set():
            record_workers(cluster, seen)
            listening.update(_listening(cluster.processes() + [c for p in cluster.processes() for c in _children(p)]))
            time.sleep(1.0)

    command = demo_command(out, STEPS, "--ray-address", cluster.address, *cluster_overrides(out))
    env = {**environ, **cluster.env(), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        # cwd: a job thread must not inherit the test process's working directory, which a test may have changed
        # (monkeypatch.chdir): `-m` puts it first on sys.path, and Ray passes the driver's sys.path to its workers
        out.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            command,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            stdin=subprocess.DEVNULL,
            cwd=str(out),
        )
        done.set()
        watcher.join(timeout=60)
        alive_after = bool(cluster.processes()) and bool(cluster.address)
        address_file = (cluster.path / "ray" / "ray_current_cluster").is_file()
        doctor = subprocess.run(
            [
                sys.executable,
                "-m",
                "verl_offpolicy.cli",
                "doctor",
                "--address",
                cluster.address,
                "--timeout",
                str(DOCTOR_TIMEOUT),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=2 * DOCTOR_TIMEOUT,
            stdin=subprocess.DEVNULL,
            cwd=str(out),
        )
    finally:
        done.set()
        cluster.stop()
    left = [" ".join(p.cmdline()) for p in cluster.processes()] + ([str(cluster.path)] if cluster.path.exists() else [])
    return ClusterRun(proc, out, seen, listening, alive_after, address_file, doctor, left)


def record_workers(cluster: LocalCluster, seen: dict[int, dict[str, int]]) -> None:
    """Add the worker processes running on each node of ``cluster`` now to ``seen``: node -> worker name -> the
    most processes of that name seen at once."""
    for node, names in cluster.workers_by_node().items():
        counts = seen.setdefault(node, {})
        for name in set(names):
            counts[name] = max(counts.get(name, 0), names.count(name))


def _listening(procs) -> set[str]:
    found = set()
    for proc in procs:
        try:
            found |= {
                f"{c.laddr.ip} {proc.name()}"
                for c in proc.net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN
            }
        except psutil.Error:
            continue
    return found


def _children(proc) -> list:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []
