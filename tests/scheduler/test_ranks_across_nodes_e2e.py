"""Training ranks on two Ray nodes: ``trainer.nnodes=2`` on an existing cluster.

A cluster of two nodes on 127.0.0.1 with one fake GPU each (``verl_offpolicy.demo.cluster.LocalCluster``), started
before the run; the demo joins it with the colocated (2, 1) pair run's configuration (tests/scenario_runs.py:
``PAIR``), except that its two training ranks are ``trainer.nnodes=2 x n_gpus_per_node=1``: one FSDP2 process on
each node, their gloo group crossing the nodes, each with its colocated ``hf`` replica. It must train exactly
the samples, versions and rewards of the same configuration on one node (``n_gpus_per_node=2``): the data
split, the global token aggregation and the weight syncs do not depend on where the ranks run.

Extended tier (``-m extended``): a cluster start and a ``main_ppo`` run beyond the default run's 30 minutes. The
default run keeps two ranks on one node (the pair) and the weights crossing nodes (the cluster run: trainer on
one node, rollout replicas on the other).
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.jobs import queued_at_start
from tests.scenario_cluster import record_workers
from tests.scenario_runs import (
    PAIR,
    PAIR_RANKS,
    SMALL_DEMO,
    demo_command,
    dumped_batches,
    opmd_run,
    opmd_timeout,
    ranks,
    schedule,
)
from verl_offpolicy.demo.cluster import LocalCluster, NodeSpec, node_resource
from verl_offpolicy.demo.results import read_metrics, training_metrics
from verl_offpolicy.doctor import STORAGE_NODE_KEY

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.extended, pytest.mark.timeout(3600)]

NODES = [NodeSpec(gpus=1, cpus=12), NodeSpec(gpus=1, cpus=12)]
TRAINER = "ray::WorkerDict"
STEPS = 6
# the pair's two ranks (same micro-batches), one per node; TransferQueue's storage unit on node 0
ACROSS_NODES = [*SMALL_DEMO, *schedule(*PAIR), *ranks(1, micro_batch=8), "trainer.nnodes=2"]
assert set(PAIR_RANKS) - {"trainer.n_gpus_per_node=2"} <= set(ACROSS_NODES)  # the pair's micro-batches


def _run_across_nodes(out: Path, environ: dict[str, str]):
    """Start the cluster, run the demo on it while recording the worker names per node, stop the cluster."""
    cluster = LocalCluster.start(NODES, base_env=environ)
    seen: dict[int, dict[str, int]] = {}
    done = threading.Event()

    def watch():
        while not done.is_set():
            record_workers(cluster, seen)
            time.sleep(1.0)

    out.mkdir(parents=True, exist_ok=True)
    command = demo_command(
        out,
        STEPS,
        "--ray-address",
        cluster.address,
        *ACROSS_NODES,
        f"trainer.rollout_data_dir={out / 'rollouts'}",
        f"+{STORAGE_NODE_KEY}={node_resource(0)}",
    )
    env = {**environ, **cluster.env(), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        proc = subprocess.run(
            command,
            env=env,
            capture_output=True,
            text=True,
            timeout=2 * opmd_timeout(*PAIR),
            stdin=subprocess.DEVNULL,
            cwd=str(out),
        )
    finally:
        done.set()
        watcher.join(timeout=60)
        cluster.stop()
    return proc, seen


@queued_at_start(scope="module")
def runs(demo_runs):
    """The run across two nodes and the pair's colocated run on one node (the overlapped tests' too)."""
    across = demo_runs.submit(
        ("ranks_across_nodes",), lambda: _run_across_nodes(demo_runs.tmp_dir("across") / "out", demo_runs.environ)
    )
    return across, opmd_run(demo_runs, *PAIR, mode="colocated")


def test_two_ranks_on_two_nodes_train_what_two_ranks_on_one_node_train(runs):
    across, one_node = runs
    (proc, seen), reference = across.result(), one_node.result()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = Path(proc.args[proc.args.index("--output-dir") + 1])
    # one training process on each node
    assert sorted(counts.get(TRAINER, 0) for counts in seen.values()) == [1, 1], seen
    metrics = training_metrics(read_metrics(out / "metrics.jsonl"))
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert [int(m["offpolicy/version"]) for m in metrics] == [int(m["offpolicy/version"]) for m in reference.metrics]
    steps = range(1, STEPS + 1)
    assert dumped_batches(out / "rollouts", steps) == dumped_batches(Path(reference.output_dir) / "rollouts", steps)
    assert [m["critic/score/mean"] for m in metrics] == [m["critic/score/mean"] for m in reference.metrics]
    # the same updates: the loss and gradient norm of every step, as the two ranks all-reduced them
    for a, b in zip(metrics, reference.metrics):
        assert a["actor/pg_loss"] == pytest.approx(b["actor/pg_loss"], rel=1e-5, abs=1e-7), a["step"]
        assert a["actor/grad_norm"] == pytest.approx(b["actor/grad_norm"], rel=1e-5), a["step"]
