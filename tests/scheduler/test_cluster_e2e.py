"""A Ray cluster of three nodes that exists before the run, and verl's ``main_ppo`` joining it.

``verl_offpolicy.demo.cluster.LocalCluster``: raylets on 127.0.0.1 (Ray's ``cluster_utils``), started before the
run as a user's cluster is. The demo joins it (``--ray-address``) in the overlapped mode at (s, d) = (2, 1): the
training workers' pool (two ranks) takes one node's two GPUs, the standalone rollout's pool (two replicas) the
other's, so the trainer and the rollout run on different nodes, and the weights cross from the two ranks on one
node to the two replicas on the other. Checked: the run
trains the scheduled versions, which node ran what (each worker process is a child of its node's raylet),
every socket of the cluster on loopback, the cluster still up after the run (a user's cluster outlives their
job), and nothing left once it is stopped. The run is a shared job (tests/scenario_cluster.py), and the
overlapped mode's (2, 1) run of tests/scheduler/test_overlapped.py: the same samples as the colocated run on one node.

The third node has neither CPUs nor GPUs (so no job lands on it) and workers that cannot see the plugin:
after the run, ``verl-offpolicy doctor --address`` must name that node, and only that one (its plugin, and its
lack of a CPU where TransferQueue may deal a storage unit: the run pins that unit to the trainer's node).
"""

from __future__ import annotations

import pytest

from tests.jobs import queued_at_start
from tests.scenario_cluster import BLIND, NODES, STEPS, cluster_job
from verl_offpolicy.cpu.platform import is_loopback_host
from verl_offpolicy.demo.cluster import node_resource
from verl_offpolicy.doctor import STORAGE_UNITS_KEY
from verl_offpolicy.glue.plugin_setting import PLUGINS_ENV

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]

VERSIONS = [0, 0, 0, 2, 2, 4]  # (2, 1): v(t) = 2·max(0, ⌊(t − 2)/2⌋), t = 1..6 (docs/scheduler.md)
TRAINER, ROLLOUT = "ray::WorkerDict", "ray::HFRolloutServer"


@queued_at_start(scope="module")
def cluster(demo_runs):
    """The cluster job (tests/scenario_cluster.py); tests read its ``ClusterRun`` with ``.result()``."""
    return cluster_job(demo_runs)


@pytest.fixture(scope="module")
def cluster_run(cluster):
    return cluster.result()


def test_a_run_joins_an_existing_two_node_cluster_and_trains_the_scheduled_versions(cluster_run):
    proc = cluster_run.proc
    ours = [
        line
        for line in (proc.stdout + proc.stderr).splitlines()
        if "cpu-demo]" in line or "verl-offpolicy demo:" in line
    ]
    assert proc.returncode == 0, "\n".join(ours[-40:]) + "\n" + proc.stderr[-3000:]
    metrics = cluster_run.metrics
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert [int(m["offpolicy/version"]) for m in metrics] == VERSIONS
    assert [int(m["offpolicy/observed_version/max"]) for m in metrics] == VERSIONS


def test_the_trainer_and_the_rollout_ran_on_different_nodes(cluster_run):
    """Two training ranks on one node, two rollout replicas on the other (each a worker process of its node)."""
    seen = cluster_run.seen
    trainer_nodes = {n for n, names in seen.items() if TRAINER in names}
    rollout_nodes = {n for n, names in seen.items() if ROLLOUT in names}
    assert len(trainer_nodes) == 1 and len(rollout_nodes) == 1, seen
    assert trainer_nodes != rollout_nodes, seen
    assert seen[trainer_nodes.pop()][TRAINER] == 2 and seen[rollout_nodes.pop()][ROLLOUT] == 2, seen


def test_doctor_checks_every_node_of_the_cluster_and_names_the_one_without_the_plugin(cluster_run):
    doctor = cluster_run.doctor
    out = doctor.stdout
    assert doctor.returncode == 1, out + doctor.stderr[-3000:]
    sections = {}  # node index -> its section of doctor's report (from its header to the next blank line)
    for block in out.split("\n\n"):
        header = block.strip().splitlines()[0] if block.strip() else ""
        if header.startswith("[Ray worker on node "):
            index = next(i for i in range(len(NODES)) if f"({node_resource(i)})" in header)
            sections[index] = block
    assert sorted(sections) == list(range(len(NODES))), out
    for index, block in sections.items():
        assert block.strip().splitlines()[0].endswith(f"of {len(NODES)})]"), block
        if index == BLIND:
            assert f"FAILED: {PLUGINS_ENV}=none disables verl's plugins" in block, block
            assert "MISSING" in block and " ok " not in block, block
            assert f"no CPU, and verl's TransferQueue deals its storage units ({STORAGE_UNITS_KEY}" in block, block
        else:
            assert "FAILED" not in block and "MISSING" not in block and "COLLISION" not in block, block
            assert block.count("\n  ok ") >= 10, block  # every name of ours, registered in that node's worker
    summary = out[out.index("verl-offpolicy doctor found problems:") :]
    assert node_resource(BLIND) in summary and PLUGINS_ENV in summary, summary
    assert all(node_resource(i) not in summary for i in range(len(NODES)) if i != BLIND), summary
    assert "Traceback" not in out


def test_the_cluster_listens_on_loopback_outlives_the_run_and_stops_clean(cluster_run):
    listening = cluster_run.listening
    assert listening, "no listening socket seen"
    assert [a for a in listening if not is_loopback_host(a.split(" ")[0])] == [], sorted(listening)
    assert cluster_run.alive_after, "the cluster ended with the run"
    # Ray's Cluster writes the head's address to <Ray's default temp dir>/ray_current_cluster: on a machine
    # without /tmp/ray it failed to start; the cluster keeps that file in its own dir (RAY_TMPDIR)
    assert cluster_run.address_file
    assert cluster_run.left_after_stop == []


def test_a_run_joining_a_cluster_stops_at_startup_naming_a_node_without_the_plugin(monkeypatch):
    """A node with resources whose workers cannot load the plugin (its raylet's VERL_USE_EXTERNAL_PLUGINS=none) let
    the run start and fail ~20 s later with verl's "Unknown platform 'cpu'" and no node named. The startup check
    (the Hydra callback, also `check`) now probes every node as `doctor --address` does and names that node."""
    from omegaconf import OmegaConf

    from verl_offpolicy.demo.cluster import LocalCluster, NodeSpec
    from verl_offpolicy.startup import check_cluster_nodes

    # in /tmp (the default): Ray's unix sockets live under the cluster's dir, whose path must stay short
    started = LocalCluster.start([NodeSpec(gpus=1, cpus=2), NodeSpec(gpus=1, cpus=2, env={PLUGINS_ENV: "none"})])
    try:
        # Ray makes its temp dir 0777; the cluster's own dir around it (token, marker) stays private
        assert started.path.stat().st_mode & 0o077 == 0, oct(started.path.stat().st_mode)
        for key, value in started.env().items():
            monkeypatch.setenv(key, value)
        cfg = OmegaConf.create(
            {"algorithm": {"adv_estimator": "opmd"}, "ray_kwargs": {"ray_init": {"address": started.address}}}
        )
        with pytest.raises(ValueError) as info:
            check_cluster_nodes(cfg)
        message = str(info.value)
        assert f"ray_kwargs.ray_init.address={started.address}: the Ray workers of these nodes" in message
        assert node_resource(1) in message and node_resource(0) not in message, message
        assert PLUGINS_ENV in message  # the cause, as doctor reports it
    finally:
        started.stop()
