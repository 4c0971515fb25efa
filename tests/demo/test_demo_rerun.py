"""Re-running ``verl-offpolicy demo`` in the same output directory, end to end.

One chain of three runs of the installed command's module (``python -m verl_offpolicy.cli demo``), ``opmd`` at
(s, d) = (1, 1) with a checkpoint after every step (``trainer.save_freq=1``), 4 prompts x 4 samples:

1. ``--steps 1``: ends at its step-1 checkpoint. Step 2 is scheduled at version 0 (v(2) = 0), whose weights
   are gone once step 1 trained: the run generates it past its last step so the checkpoint holds it.
2. ``--steps 5``, the same directory: resumes from step 1 (item 1: it trains step 2 at version 0; before the
   fix it stopped with "no batch is scheduled for step 2"); Ctrl-C (SIGINT) once its step-2 checkpoint is
   complete (a step takes seconds: it may have saved step 3 or 4 before it stops).
3. ``--steps 5`` again: resumes from the latest checkpoint k and ends with every step 1..5 in ``metrics.jsonl``
   (item 2: before the fix the re-run deleted the earlier runs' metrics.jsonl and train.log, then failed
   "metrics.jsonl has 5 - k training steps, expected 5"); every earlier record is still there, each restart
   marked.

The chain is a shared job (tests/jobs.py), queued at the session's start; each run has a timeout and is
killed with its process group (and Ray session) if it overruns.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.jobs import queued_at_start
from tests.scenario_runs import SMALL_DEMO, demo_command
from verl_offpolicy.demo.process import kill_process_tree, spawn
from verl_offpolicy.demo.records import PART_NAME, RESTART_KEY
from verl_offpolicy.demo.results import read_metrics, training_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3600)]

STEPS = 5
RUN_TIMEOUT = 1200  # one run, start-up included (start-up alone took 200-300 s on a loaded 2-core machine)
OVERRIDES = [*SMALL_DEMO, "algorithm.offpolicy.sync_offset=1", "trainer.save_freq=1"]
TRACKER = "latest_checkpointed_iteration.txt"


def _command(out: Path, steps: int) -> list[str]:
    return demo_command(out, steps, *OVERRIDES)


def _env(base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")) if p
    )
    return env


def _checkpointed(out: Path) -> int:
    try:
        return int((out / "checkpoints" / TRACKER).read_text().strip())
    except (OSError, ValueError):
        return 0


def _run(
    out: Path, steps: int, env: dict[str, str], interrupt_at_checkpoint: int | None = None
) -> tuple[int, str, float]:
    """One demo run to its end (or SIGINT to its process group once the checkpoint of that step is complete);
    (exit code, its output, seconds). Killed with its process tree if it overruns :data:`RUN_TIMEOUT`."""
    start = time.monotonic()
    proc = spawn(_command(out, steps), env, None)
    try:
        if interrupt_at_checkpoint is not None:
            while proc.poll() is None and _checkpointed(out) < interrupt_at_checkpoint:
                assert time.monotonic() - start < RUN_TIMEOUT, (
                    f"no step-{interrupt_at_checkpoint} checkpoint within {RUN_TIMEOUT}s"
                )
                time.sleep(0.5)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C
        output, _ = proc.communicate(timeout=max(60.0, RUN_TIMEOUT - (time.monotonic() - start)))
    finally:
        if proc.poll() is None:
            kill_process_tree(proc, str(out))
            proc.wait(timeout=60)
    return proc.returncode, output, time.monotonic() - start


def _chain(out: Path, env: dict[str, str]) -> dict:
    """Runs 1-3 of the module docstring; each run's (exit code, output, seconds) and the checkpoint run 2 left."""
    env = _env(env)
    runs = {"out": out, "first": _run(out, 1, env)}
    if runs["first"][0] == 0:
        runs["interrupted"] = _run(out, STEPS, env, interrupt_at_checkpoint=2)
        runs["interrupted_at"] = _checkpointed(out)
        runs["rerun"] = _run(out, STEPS, env)
    return runs


@queued_at_start()
def rerun_chain(demo_runs):
    """The chain of the module docstring, a shared job queued at the session's start (its output dir: ``["out"]``)."""
    return demo_runs.submit(
        ("demo_rerun_chain",), lambda: _chain(demo_runs.tmp_dir("rerun") / "out", demo_runs.environ)
    )


def test_a_rerun_continues_at_the_scheduled_versions_and_keeps_every_record(rerun_chain):
    runs = rerun_chain.result()
    out = runs["out"]
    durations = {name: round(run[2]) for name, run in runs.items() if isinstance(run, tuple)}
    print(f"run seconds: {durations}")
    code, output, _ = runs["first"]
    assert code == 0, output[-3000:]
    code, output, _ = runs["interrupted"]
    assert code == 128 + signal.SIGINT, output[-3000:]
    assert "[cpu-demo] resuming from the checkpoint of step 1 " in output, output[-3000:]
    resumed = runs["interrupted_at"]
    assert 2 <= resumed < STEPS, resumed  # interrupted after its step-2 checkpoint, before its end
    code, output, _ = runs["rerun"]
    assert code == 0, output[-3000:]
    assert f"[cpu-demo] resuming from the checkpoint of step {resumed} " in output
    assert f"[cpu-demo] finished {STEPS} training steps (steps 1..{resumed} by the earlier run(s)" in output, output[
        -3000:
    ]

    # metrics.jsonl: every record of every run, in order, the restarts marked; read back: steps 1..3, each
    # trained at the version the schedule gives it ((1, 1): v(t) = max(0, t - 2)), step 2 by the resumed run 2
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    marks = [r["data"][RESTART_KEY] for r in lines if RESTART_KEY in r["data"]]
    assert marks == [1, resumed], marks
    first_run = lines[: next(i for i, r in enumerate(lines) if RESTART_KEY in r["data"])]
    assert [r["step"] for r in first_run if "critic/score/mean" in r["data"]] == [1]  # run 1's record kept
    # verl saves step k's checkpoint before it logs step k: a Ctrl-C between the two (this test interrupts
    # right after a checkpoint) leaves step k = resumed without a record; the re-run must say so, and only so
    summary = json.loads((out / "summary.json").read_text())
    unlogged = summary["unlogged_steps"]
    assert unlogged in ([], [resumed]), unlogged
    assert ("[cpu-demo] note: no metrics record of step(s)" in output) == bool(unlogged), output[-3000:]
    metrics = training_metrics(read_metrics(out / "metrics.jsonl"))
    assert [m["step"] for m in metrics] == [s for s in range(1, STEPS + 1) if s not in unlogged]
    version = {1: 0, 2: 0, 3: 1, 4: 2, 5: 3}  # (1, 1): v(t) = max(0, t - 2)
    assert {m["step"]: int(m["offpolicy/version"]) for m in metrics} == {
        s: version[s] for s in version if s not in unlogged
    }
    # verl's own staleness (from the rollout's version tags) agrees: (t − 1) − v(t), 0 1 1 1 1
    staleness = {1: 0, 2: 1, 3: 1, 4: 1, 5: 1}
    assert {m["step"]: int(m["training/off_policy/trajectory_staleness/max"]) for m in metrics} == {
        s: staleness[s] for s in staleness if s not in unlogged
    }
    assert not (out / PART_NAME).exists()

    # train.log: run 1's lines first, then a banner per re-run
    log = (out / "train.log").read_text(errors="replace")
    banner = log.index(f"a new run in this directory, resumed from the checkpoint of step 1: steps 2..{STEPS}")
    assert "step:1 - " in log[:banner]
    assert (
        log.index(
            f"a new run in this directory, resumed from the checkpoint of step {resumed}: steps {resumed + 1}..{STEPS}"
        )
        > banner
    )
