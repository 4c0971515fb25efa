"""The tiny tool task (``--model tiny-tool``: verl's multi-turn tool agent loop) through the scheduler, end to end.

At (2, 1), colocated and overlapped (the standalone ``hf`` rollout), 4 steps of 4 prompts x 4 samples: both
modes train the same samples with the same rewards at every step (seeded), the versions and every trajectory's
observed version (its first and last turn's) equal the schedule, and trajectories hold two model turns
(verl's ``training/num_turns/max`` is 4: the prompt, the call, the tool's reply, the answer). The negative
control (``-m extended``): the overlapped tool run whose weight pushes are tagged one version ahead stops at
its first step, before training. Also ``-m extended``: the same pair on verl's vLLM rollout (``tiny-tool-h32``).
The unit negative control of a trajectory whose turns span two versions is
``test_a_trajectory_whose_turns_span_two_versions_fails_the_check``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jobs import queued_at_start
from tests.markers import needs_vllm
from tests.scenario_runs import (
    PRIMARY_CONFIG,
    SMALL_DEMO,
    STANDALONE,
    check_stopped_before_training_on_a_wrong_version,
    dumped_batches,
    schedule,
)
from verl_offpolicy.glue.scheduler.rollout import PUSH_VERSION_FAULT_ENV, ObservedVersionError, check_observed_version

MODEL = "tiny-tool"
SETTING = (2, 1)
STEPS = 4
VERSIONS = [0, 0, 0, 2]  # (2, 1), steps 1..4, docs/scheduler.md's table
TIMEOUT = 900


VLLM_MODEL = "tiny-tool-h32"  # vLLM's CPU attention needs head_dim >= 32
VLLM_MODES = {"colocated": ["+cpu_rollout=vllm"], "overlapped": ["+cpu_rollout=[vllm,standalone]"]}


def _tool_run(demo_runs, mode: str, env=None, name=None, steps=STEPS, rollout="hf"):
    if rollout == "vllm":
        overlay, model = VLLM_MODES[mode], VLLM_MODEL
    else:
        overlay, model = (STANDALONE if mode == "overlapped" else []), MODEL
    overrides = SMALL_DEMO + schedule(*SETTING) + overlay
    return demo_runs.start(
        "opmd",
        steps,
        overrides,
        PRIMARY_CONFIG,
        TIMEOUT * (2 if rollout == "vllm" else 1),
        name=name or f"tool_{rollout}_{mode}",
        env=env,
        model=model,
    )


@queued_at_start(scope="module")
def tool_runs(demo_runs):
    jobs = {mode: _tool_run(demo_runs, mode) for mode in ("colocated", "overlapped")}
    return lambda mode: jobs[mode].result()


@queued_at_start(scope="module")
def vllm_tool_runs(demo_runs):
    jobs = {mode: _tool_run(demo_runs, mode, rollout="vllm") for mode in ("colocated", "overlapped")}
    return lambda mode: jobs[mode].result()


@queued_at_start()
def wrong_version_tool_run(demo_runs):
    return _tool_run(demo_runs, "overlapped", env={PUSH_VERSION_FAULT_ENV: "1"}, name="tool_wrong_version", steps=2)


def test_a_trajectory_whose_turns_span_two_versions_fails_the_check():
    """verl's tool agent loop tags a trajectory with its first turn's version (min) and its last turn's (max):
    one whose second turn was generated after a weight push is refused, as a single-turn one at a wrong version."""
    tags = [{"min_global_steps": 2, "max_global_steps": 2}, {"min_global_steps": 2, "max_global_steps": 3}]
    with pytest.raises(
        ObservedVersionError,
        match=r"scheduled to train on a batch generated at version 2, but the rollout reports versions 2..3",
    ):
        check_observed_version(5, 2, tags)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_tool_task_trains_the_same_samples_colocated_and_overlapped(tool_runs):
    _check_same_samples(tool_runs("colocated"), tool_runs("overlapped"))


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(3600)
@needs_vllm
def test_the_tool_task_on_verls_vllm_rollout_trains_the_same_samples_in_both_modes(vllm_tool_runs):
    """The same claim on verl's vLLM rollout (``+cpu_rollout=vllm``; overlapped: vLLM on its own pool): vLLM
    stops a turn at the call token (``stop_token_ids``), tags every turn with its weights version, and samples
    each turn from the request's seed."""
    _check_same_samples(vllm_tool_runs("colocated"), vllm_tool_runs("overlapped"))


def _check_same_samples(colocated, overlapped):
    versions = VERSIONS
    for result in (colocated, overlapped):
        steps = [m["step"] for m in result.metrics]
        assert steps == list(range(1, STEPS + 1))
        assert [int(m["offpolicy/version"]) for m in result.metrics] == versions
        assert [int(m["offpolicy/observed_version/min"]) for m in result.metrics] == versions
        assert [int(m["offpolicy/observed_version/max"]) for m in result.metrics] == versions
        assert all(m["training/num_turns/max"] == 4 for m in result.metrics)  # prompt, call, reply, answer
        assert all(m["training/num_turns/min"] >= 2 for m in result.metrics)
    batches = [dumped_batches(Path(r.output_dir) / "rollouts", range(1, STEPS + 1)) for r in (colocated, overlapped)]
    assert batches[0] == batches[1]
    called = [out for step in batches[0].values() for _, out, _ in step if "<|call|>" in out]
    assert called  # the trained samples include tool calls (the untrained model calls in about half its turns)
    rewards = [[m["critic/score/mean"] for m in r.metrics] for r in (colocated, overlapped)]
    assert rewards[0] == rewards[1]


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(2400)
def test_negative_control_a_tool_run_whose_rollout_reports_a_wrong_version_stops(wrong_version_tool_run):
    check_stopped_before_training_on_a_wrong_version(wrong_version_tool_run)
