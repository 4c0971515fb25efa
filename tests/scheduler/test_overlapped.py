"""The scheduler's overlapped mode (``trainer.v1.trainer_mode=offpolicy`` + ``hybrid_engine=false``).

Fast tier: the observed-version check on verl's trajectory tags (including the negative control: a
batch the rollout reports at another version fails the run), and the startup validation of the mode.
End to end (e2e, slow): overlapped vs colocated runs of the CPU demo at the same seed train the same
samples with the same versions at every step (each run's trained samples from verl's rollout dumps), at
(1, 0), (1, 1), (2, 1) and (4, 1) (the colocated runs are shared with tests/scheduler/test_scheduler_e2e.py; the
overlapped (2, 1) run is the cluster run of tests/scenario_cluster.py, on three Ray nodes); an
overlapped run resumed from its step-2 checkpoint trains the batches of the uninterrupted run; and a
real overlapped run whose weight pushes are deliberately mislabelled stops at its first step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hydra_utils import VALID_SIZES, compose_and_check, compose_main_ppo
from tests.jobs import queued_at_start
from tests.scenario_cluster import SAVE_FREQ, cluster_job
from tests.scenario_runs import (
    PAIR,
    PAIR_TEST_FREQ,
    PRIMARY_CONFIG,
    SCHEDULED_STEPS,
    SHARED_RUN_TIMEOUT,
    check_stopped_before_training_on_a_wrong_version,
    dumped_batches,
    opmd_overrides,
    opmd_run,
    opmd_timeout,
    start_resumed,
)
from tests.scenario_schedule import OVERLAPPED
from verl_offpolicy.glue.scheduler.rollout import (
    PUSH_VERSION_FAULT_ENV,
    ObservedVersionError,
    check_observed_version,
    observed_versions,
)
from verl_offpolicy.glue.validation import OffPolicyConfigError, validate_offpolicy_config

# ------------------------------------------------------------------------------ observed version


def _tags(*versions):
    """Trajectory tags as verl's AgentLoopWorkerTQ writes them (min/max_global_steps from the server)."""
    return [
        {"status": "success", "global_steps": 9, "min_global_steps": lo, "max_global_steps": hi} for lo, hi in versions
    ]


def test_observed_versions_are_read_from_the_rollouts_tags():
    assert observed_versions(_tags((4, 4), (4, 5), (3, 4))) == (3, 5)
    assert observed_versions([{"status": "success"}]) == (None, None)


def test_a_batch_at_the_scheduled_version_passes():
    assert check_observed_version(step=6, scheduled=4, tags=_tags((4, 4), (4, 4))) == (4, 4)


@pytest.mark.parametrize(
    "versions",
    [((5, 5), (5, 5)), ((4, 4), (4, 5)), ((3, 4),)],
    ids=["whole batch at another version", "one trajectory spans two versions", "older weights"],
)
def test_negative_control_a_wrong_observed_version_fails_loudly(versions):
    with pytest.raises(ObservedVersionError, match="step 6 is scheduled to train on a batch generated at version 4"):
        check_observed_version(step=6, scheduled=4, tags=_tags(*versions))


def test_a_rollout_that_reports_no_version_is_not_checked_but_a_partial_report_fails():
    # verl 0.9.1's sglang server returns no global_steps: nothing to check (the trainer warns once).
    assert check_observed_version(step=1, scheduled=0, tags=[{"status": "success"}] * 2) is None
    with pytest.raises(ObservedVersionError, match="for 1 of the 2 trajectories of step 1 only"):
        check_observed_version(step=1, scheduled=0, tags=[{"status": "success"}, *_tags((0, 0))])
    with pytest.raises(ObservedVersionError, match="no trajectory of step 1"):
        check_observed_version(step=1, scheduled=0, tags=[])


# ------------------------------------------------------------------------------ startup validation


def _validate(preset, extra):
    validate_offpolicy_config(compose_main_ppo("ppo_trainer", [f"+algorithm={preset}", *VALID_SIZES, *extra]))


@pytest.mark.slow
def test_overlapped_mode_validation():
    _validate("opmd", OVERLAPPED + ["algorithm.offpolicy.sync_offset=1"])
    with pytest.raises(OffPolicyConfigError, match="cannot provide algorithm.offpolicy.ratio_anchor=behaviour"):
        _validate("rec_oneside_nois", OVERLAPPED)
    _validate(
        "rec_oneside_nois",
        OVERLAPPED + ["algorithm.offpolicy.ratio_anchor=rollout", "actor_rollout_ref.rollout.calculate_log_probs=true"],
    )
    with pytest.raises(OffPolicyConfigError, match="naive only serves a colocated rollout"):
        _validate("opmd", OVERLAPPED[:-1])
    with pytest.raises(OffPolicyConfigError, match=r"set actor_rollout_ref.rollout.nnodes >= 1 \(got 0\)"):
        _validate("opmd", [OVERLAPPED[0], OVERLAPPED[-1]])


# ------------------------------------------------------------------------------ end to end

STEPS = SCHEDULED_STEPS
TIMEOUT = SHARED_RUN_TIMEOUT
# v(t) for t = 1..6 written out by hand from docs/scheduler.md (v(t) = s·max(0, ⌊(t − d − 1)/s⌋));
# a run has one step per entry.
SPEC_VERSIONS = {
    (1, 0): [0, 1, 2, 3, 4, 5],
    (1, 1): [0, 0, 1, 2, 3, 4],
    (2, 1): [0, 0, 0, 2, 2, 4],
    (4, 1): [0, 0, 0, 0, 0, 4],
}
# Weight pushes of an overlapped run: one per version that has batches to generate, the initial push of
# version 0 included ((1, 0): versions 0..5 generate steps 1..6; (1, 1): versions 0..4 generate steps
# 1-2, 3, 4, 5, 6; (2, 1): versions 0, 2, 4 generate steps 1-3, 4-5, 6; (4, 1): versions 0, 4 generate
# steps 1-5, 6).
SPEC_PUSHES = {(1, 0): 6, (1, 1): 5, (2, 1): 3, (4, 1): 2}
# The overlapped (2, 1) run is the cluster run (tests/scenario_cluster.py: the same overrides, on an existing
# three-node cluster, trainer and rollout on different nodes); it saves a checkpoint after step 2: the resume
# test starts from it, on a Ray of its own.
RESUMED, RESUME_STEP = (2, 1), SAVE_FREQ


def _start(demo_runs, mode, s, d):
    if (mode, (s, d)) == ("overlapped", RESUMED):
        return cluster_job(demo_runs)
    return opmd_run(demo_runs, s, d, mode)


# The setting whose comparison runs in the default tier: (2, 1), a stale setting where a version's several
# batches stream ahead of training ((2, 1) and (4, 1) in the default tier). (4, 1), (1, 0) (cannot
# overlap) and (1, 1) are in the extended tier (-m extended): the same code path at other (s, d), outside the
# default run's 30-minute budget; the (4, 1) submission order is also a fast test below, and the (4, 1)
# schedule runs in the default tier colocated (test_scheduler_e2e.py) and with two ranks (test_ranks_e2e.py).
DEFAULT_TIER = [(2, 1)]
EXTENDED_TIER = sorted(set(SPEC_VERSIONS) - set(DEFAULT_TIER))


@queued_at_start(scope="module")
def runs(demo_runs):
    """The result of the shared opmd run of a mode at a setting of :data:`DEFAULT_TIER` (the colocated ones
    are the scheduler tests' too), queued at the session's start a colocated and an overlapped run at a time."""
    jobs = {
        (mode, s, d): _start(demo_runs, mode, s, d) for s, d in DEFAULT_TIER for mode in ("colocated", "overlapped")
    }
    return lambda mode, s, d: jobs[(mode, s, d)].result()


@queued_at_start(scope="module")
def extended_runs(demo_runs):
    """As :func:`runs`, for :data:`EXTENDED_TIER` (queued only in a session that selects its test; the
    colocated (1, 1) run is the scheduler tests' one)."""
    jobs = {
        (mode, s, d): _start(demo_runs, mode, s, d) for s, d in EXTENDED_TIER for mode in ("colocated", "overlapped")
    }
    return lambda mode, s, d: jobs[(mode, s, d)].result()


@queued_at_start()
def resumed_run(demo_runs):
    """The overlapped (2, 1) run and, once it is done, the same run resumed from its step-2 checkpoint."""
    uninterrupted = _start(demo_runs, "overlapped", *RESUMED)
    resumed = start_resumed(
        demo_runs,
        uninterrupted,
        RESUME_STEP,
        preset="opmd",
        steps=STEPS,
        overrides=opmd_overrides(*RESUMED, "overlapped"),
        config_name=PRIMARY_CONFIG,
        timeout=opmd_timeout(*RESUMED),
        name="overlapped_resumed",
    )
    return uninterrupted, resumed


@queued_at_start()
def wrong_version_run(demo_runs):
    """An overlapped (1, 1) run whose weight pushes are tagged one version ahead (the fault hook
    ``PUSH_VERSION_FAULT_ENV``, in the run's environment, which Ray passes to the trainer)."""
    overrides = opmd_overrides(1, 1, "overlapped")
    return demo_runs.start(
        "opmd", 2, overrides, PRIMARY_CONFIG, TIMEOUT, name="wrong_version", env={PUSH_VERSION_FAULT_ENV: "1"}
    )


def _content(result) -> dict[int, list[tuple]]:
    """Per step, the trained samples of a run (verl's rollout dumps)."""
    return dumped_batches(Path(result.output_dir) / "rollouts", [m["step"] for m in result.metrics])


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_overlapped_validates_the_weights_colocated_validates(runs):
    """verl validates after on_step_end; the overlapped rollout held the version last pushed, so a validation inside
    a version (step 3 at (2, 1): version 2) was that of older weights (0.3281 against 0.375 once). The pair validates
    at steps 3 and 6 (PAIR_TEST_FREQ): the same greedy validation at both, and one validation-only push (step 3)."""
    colocated, overlapped = runs("colocated", *PAIR), runs("overlapped", *PAIR)

    def validation(result):
        return {
            m["step"]: {k: v for k, v in m.items() if k.startswith("val-")}
            for m in result.metrics
            if any(k.startswith("val-") for k in m)
        }

    expected, got = validation(colocated), validation(overlapped)
    assert sorted(expected) == [PAIR_TEST_FREQ, 6] and sorted(got) == sorted(expected), (sorted(expected), sorted(got))
    for step in expected:
        assert expected[step] and got[step] == pytest.approx(expected[step], abs=1e-9), step
    last = {m["step"]: m for m in overlapped.metrics}
    assert last[6]["offpolicy/validation_pushes"] == 1.0  # step 3's; step 6's validation sees version 6 or pushes it
    assert last[6]["offpolicy/weight_pushes"] == SPEC_PUSHES[PAIR]


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("s, d", DEFAULT_TIER)
def test_overlapped_trains_the_batches_and_versions_of_colocated(runs, s, d):
    """Same seed, same (s, d): the same samples, versions and rewards at every step; the rollout reports
    the scheduled version for every trajectory; one weight push per generating version; the FIFO stays
    within s + d. Rewards are compared exactly: both modes sample each token from a generator seeded by
    (dataset row, sample, version) and the rollout runs fp32 with the same thread count."""
    _check_overlapped_matches_colocated(runs("colocated", s, d), runs("overlapped", s, d), s, d)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("s, d", EXTENDED_TIER)
def test_overlapped_trains_the_batches_and_versions_of_colocated_at_other_settings(extended_runs, s, d):
    """The same claim at (1, 0), (1, 1) and (4, 1). (1, 0) cannot overlap (B_t needs the weights of step
    t − 1) and must behave as colocated (1, 0)."""
    _check_overlapped_matches_colocated(extended_runs("colocated", s, d), extended_runs("overlapped", s, d), s, d)


def _check_overlapped_matches_colocated(colocated, overlapped, s, d):
    """The claim of the two tests above, on the colocated and the overlapped run of (s, d)."""
    for result in (colocated, overlapped):
        assert [int(m["offpolicy/version"]) for m in result.metrics] == SPEC_VERSIONS[(s, d)]
        assert [int(m["offpolicy/observed_version/max"]) for m in result.metrics] == SPEC_VERSIONS[(s, d)]
        assert [int(m["offpolicy/observed_version/min"]) for m in result.metrics] == SPEC_VERSIONS[(s, d)]
        assert max(m["offpolicy/queue_len"] for m in result.metrics) <= s + d
    assert _content(overlapped) == _content(colocated)
    assert [m["critic/score/mean"] for m in overlapped.metrics] == [m["critic/score/mean"] for m in colocated.metrics]
    assert overlapped.metrics[-1]["offpolicy/weight_pushes"] == SPEC_PUSHES[(s, d)]
    assert all(m["offpolicy/wait_s"] >= 0 for m in overlapped.metrics)
    # busy time is counted when a generation batch ends, so one step's fraction can exceed 1 (a batch begun in
    # the previous step); it is never negative and never absent with the hf rollout.
    assert all(m["offpolicy/rollout_busy_fraction"] >= 0 for m in overlapped.metrics)
    # verl's own staleness metric (from the same tags): (t − 1) − version
    for m in overlapped.metrics:
        assert m["training/off_policy/trajectory_staleness/max"] == (m["step"] - 1) - m["offpolicy/version"]


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_overlapped_resume_trains_exactly_the_batches_of_an_uninterrupted_run(resumed_run):
    """Resume the overlapped (2, 1) run from its step-2 checkpoint (what an interruption right after step
    2 leaves: B_3 of version 0 queued, possibly in flight when the save started; the save waits for it):
    steps 3-6 train the same samples at the same versions as the uninterrupted run, and nothing is
    regenerated (B_3 comes back from the checkpoint)."""
    uninterrupted, resumed_job = resumed_run
    reference = _content(uninterrupted.result())
    resumed, log, metrics = resumed_job.result()
    assert "offpolicy scheduler: restored 1 queued batches for steps [3]" in log
    assert sorted(s for s in metrics if s >= 1) == [3, 4, 5, 6]
    assert [int(metrics[s]["offpolicy/version"]) for s in (3, 4, 5, 6)] == [0, 2, 2, 4]
    assert [int(metrics[s]["offpolicy/observed_version/max"]) for s in (3, 4, 5, 6)] == [0, 2, 2, 4]
    assert dumped_batches(resumed / "rollouts", (3, 4, 5, 6)) == {s: reference[s] for s in (3, 4, 5, 6)}


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(1200)
def test_negative_control_a_run_whose_rollout_reports_a_wrong_version_stops(wrong_version_run):
    """The observed-version check on a real overlapped run: the weight pushes are deliberately tagged one
    version ahead (the fault hook ``PUSH_VERSION_FAULT_ENV``, set in the run's environment, which Ray
    passes to the trainer), so the rollout reports version 1 for the batch of step 1 (scheduled: 0).
    The run must stop before training it, saying why, instead of logging a plausible version.

    Extended tier: in the default run the check's positive result is asserted on every trained batch of the
    overlapped runs (observed version = scheduled), and its raise by the unit negative control
    (``test_negative_control_a_wrong_observed_version_fails_loudly``)."""
    check_stopped_before_training_on_a_wrong_version(wrong_version_run)


# ------------------------------------------------------------------------------ streamed submission


def _submitted_batches(s, d, version, total_steps=12, prompts=2, agent_loop_workers=2):
    """What the overlapped trainer's submission hands the agent loop for ``version`` of a (s, d) run, through the
    functions it submits with (``submission_steps``, ``with_priority``): per batch, its step, its prompts, and the
    fields each agent-loop worker reads of each prompt (verl's AgentLoopWorkerTQ: a NonTensorData field is one
    value for every prompt of the chunk it was given)."""
    import numpy as np
    from tensordict import NonTensorData
    from verl.utils import tensordict_utils as tu

    from verl_offpolicy.core.schedule import Schedule
    from verl_offpolicy.glue.scheduler.overlapped import submission_steps, with_priority
    from verl_offpolicy.glue.scheduler.trainer import steps_to_generate

    schedule = Schedule(sync_interval=s, sync_offset=d)
    rows = iter(range(1000))
    steps = submission_steps(schedule, version, steps_to_generate(schedule, version, total_steps), queued_batches=0)
    submitted = []
    for step in steps:
        index = [next(rows) for _ in range(prompts)]
        chunk = tu.get_tensordict({"uid": np.array([f"u{i}" for i in index], dtype=object), "index": np.array(index)})
        fields = []
        for part in with_priority(chunk, step).chunk(agent_loop_workers):
            for i in range(len(part)):
                fields.append(
                    {k: v.data for k, v in part.items() if isinstance(v, NonTensorData)} | {"uid": part["uid"][i]}
                )
        submitted.append(fields)
    return steps, submitted


def test_a_submission_beyond_the_fifo_bound_is_refused():
    from verl_offpolicy.core.schedule import Schedule
    from verl_offpolicy.glue.scheduler.overlapped import submission_steps

    with pytest.raises(RuntimeError, match=r"submitting 4 batches of version 4 would hold 6 > s \+ d = 5 batches"):
        submission_steps(Schedule(4, 1), 4, [6, 7, 8, 9], queued_batches=2)


@pytest.mark.parametrize(
    "s, d, version, steps", [(4, 1, 0, [1, 2, 3, 4, 5]), (4, 1, 4, [6, 7, 8, 9]), (2, 1, 2, [4, 5]), (1, 1, 3, [5])]
)
def test_a_versions_batches_are_submitted_in_schedule_order_with_their_step_as_priority(s, d, version, steps):
    """Streaming: the rollout generates the lowest priority first, so every prompt of B_t must carry
    priority t (v(t) from docs/scheduler.md: (4, 1) version 4 generates steps 6-9), one call per batch in
    step order, and a version's batches never exceed the FIFO bound s + d."""
    queued, submitted = _submitted_batches(s, d, version)
    assert queued == steps
    assert len(submitted) == len(steps) <= s + d
    for step, prompts in zip(steps, submitted):
        assert {p["priority"] for p in prompts} == {step}, (step, prompts)


# ------------------------------------------------------------------------------ the agent loop's order


def _gate_events(priorities: list[int]) -> list[tuple[str, int]]:
    """Samples of ``priorities``, created in that order, each a task like verl's ``_run_agent_loop``: the gate's
    turn, a few event-loop turns of its own (the agent loop's ``run``: "run" event at its end), then a few more
    after it (verl's postprocess: the reward and TransferQueue write; "end" event at the task's end). The
    (start|run|end, priority) events in the order they happened."""
    import asyncio

    from verl_offpolicy.cpu.agent_loop import PriorityGate

    events: list[tuple[str, int]] = []

    async def sample(gate, priority):
        await gate.hold(priority)
        events.append(("start", priority))
        for _ in range(3):
            await asyncio.sleep(0)
        events.append(("run", priority))
        for _ in range(3):
            await asyncio.sleep(0)
        events.append(("end", priority))

    async def main():
        gate = PriorityGate()
        await asyncio.gather(*(asyncio.create_task(sample(gate, p)) for p in priorities))
        assert not gate.in_flight, gate.in_flight  # every slot released when its task ended

    asyncio.run(main())
    return events


def test_the_ordered_agent_loop_runs_one_priority_at_a_time_lowest_first():
    """A version's batches reach the agent-loop worker together (B_t's prompts first): step 1's two samples
    run, step 2's and step 3's wait until every sample of a lower step has ended (its postprocess included,
    not only its ``run``), then run together."""
    assert _gate_events([1, 1, 2, 3, 3, 2]) == [
        ("start", 1),
        ("start", 1),
        ("run", 1),
        ("run", 1),
        ("end", 1),
        ("end", 1),
        ("start", 2),
        ("start", 2),
        ("run", 2),
        ("run", 2),
        ("end", 2),
        ("end", 2),
        ("start", 3),
        ("start", 3),
        ("run", 3),
        ("run", 3),
        ("end", 3),
        ("end", 3),
    ]


def test_a_higher_priority_never_holds_a_lower_one_back():
    """Only a lower priority makes a sample wait: one that arrives after a higher one has started starts at
    once (the order is a preference for B_t, never a wait on a later batch: no deadlock)."""
    assert _gate_events([2, 1])[:2] == [("start", 2), ("start", 1)]


def test_a_failed_sample_releases_its_turn():
    """A sample whose task fails (or is cancelled) leaves the gate like one that ended: the next priority runs."""
    import asyncio

    from verl_offpolicy.cpu.agent_loop import PriorityGate

    async def main():
        gate = PriorityGate()

        async def failing():
            await gate.hold(1)
            raise ValueError("reward failed")

        async def later():
            await gate.hold(2)
            return "ran"

        results = await asyncio.wait_for(
            asyncio.gather(asyncio.create_task(failing()), asyncio.create_task(later()), return_exceptions=True), 60
        )
        assert isinstance(results[0], ValueError) and results[1] == "ran"
        assert not gate.in_flight

    asyncio.run(main())


def test_a_sample_away_at_its_tool_lets_the_next_priority_start_and_comes_back_on_its_turn():
    """A tool call (:meth:`PriorityGate.away`) gives the sample's turn up while the tool runs: step 2's sample
    starts at once; step 1's comes back without waiting (nothing lower is in flight), while step 2's second
    sample, back from its own tool while step 1 runs, waits until step 1 has ended."""
    import asyncio

    from verl_offpolicy.cpu.agent_loop import PriorityGate

    events: list[str] = []

    async def main():
        gate = PriorityGate()
        tool_1, tool_2 = asyncio.Event(), asyncio.Event()

        async def step_1():
            await gate.hold(1)
            events.append("1 generates")
            async with gate.away():
                events.append("1 at its tool")
                await tool_1.wait()
            events.append("1 back")
            tool_2.set()  # step 2's tool replies while step 1 still runs
            for _ in range(5):
                await asyncio.sleep(0)
            events.append("1 ends")

        async def step_2():
            await gate.hold(2)
            events.append("2 generates")
            async with gate.away():
                tool_1.set()
                await tool_2.wait()
            events.append("2 back")

        first = asyncio.create_task(step_1())
        await asyncio.sleep(0)
        second = asyncio.create_task(step_2())
        await asyncio.wait_for(asyncio.gather(first, second), 60)
        assert not gate.in_flight and not gate._held

    asyncio.run(main())
    assert events == ["1 generates", "1 at its tool", "2 generates", "1 back", "1 ends", "2 back"]


def test_a_sample_cancelled_while_coming_back_from_its_tool_holds_nothing():
    """Cancelled while it waits for its turn back (a lower priority runs), a sample leaves the gate empty: its
    turn is neither released twice nor kept."""
    import asyncio

    from verl_offpolicy.cpu.agent_loop import PriorityGate

    async def main():
        gate = PriorityGate()
        low_runs, release_low = asyncio.Event(), asyncio.Event()

        async def high():
            await gate.hold(2)
            async with gate.away():
                await low_runs.wait()
            return "never"

        async def low():
            await gate.hold(1)
            low_runs.set()
            await release_low.wait()

        waiting, running = asyncio.create_task(high()), None
        await asyncio.sleep(0)
        running = asyncio.create_task(low())
        for _ in range(5):
            await asyncio.sleep(0)
        assert gate.in_flight == {1: 1}  # high is away and waits for low to end
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert gate.in_flight == {1: 1}
        release_low.set()
        await asyncio.wait_for(running, 60)
        assert not gate.in_flight and not gate._held

    asyncio.run(main())


@pytest.mark.parametrize("continuous", [False, True])
def test_the_ordered_loops_do_not_order_on_a_server_that_batches_continuously(continuous):
    """With ``engine_kwargs.hf.continuous_batching`` the hf server admits by priority itself (vLLM's way): a gate in the
    agent loop would keep the next batch's samples from joining the running one, so ``hold_turn`` takes no turn; by
    priority it takes the sample's. The rollout config is a DictConfig, as verl's agent loop holds it
    (``config.actor_rollout_ref.rollout``)."""
    import asyncio

    from omegaconf import OmegaConf

    from verl_offpolicy.cpu import agent_loop
    from verl_offpolicy.glue.registration import HF_ROLLOUT

    rollout = OmegaConf.create({"name": HF_ROLLOUT, "engine_kwargs": {HF_ROLLOUT: {"continuous_batching": continuous}}})

    async def main():
        await agent_loop.hold_turn({"priority": 3}, rollout)
        return dict(agent_loop._gate().in_flight)

    assert asyncio.run(main()) == ({} if continuous else {3: 1})


def test_the_standalone_overlay_selects_the_ordered_agent_loop(tmp_path):
    """``+cpu_rollout=standalone`` (the overlapped mode on the CPU) orders the agent loop; ``+cpu=demo`` alone keeps
    the unordered seeded loop (colocated generates a version in one call: nothing to order). Through every
    startup check, which also finds both names in verl's agent-loop registry."""
    from verl_offpolicy.glue.registration import ORDERED_AGENT_LOOP, SEEDED_AGENT_LOOP

    base = [
        "+cpu=demo",
        f"actor_rollout_ref.model.path={tmp_path}",
        "algorithm.offpolicy.sync_offset=1",
        "algorithm.offpolicy.ratio_anchor=rollout",
    ]
    assert (
        compose_and_check(PRIMARY_CONFIG, base).actor_rollout_ref.rollout.agent.default_agent_loop == SEEDED_AGENT_LOOP
    )
    cfg = compose_and_check(PRIMARY_CONFIG, [*base, "+cpu_rollout=standalone"])
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == ORDERED_AGENT_LOOP


def test_copies_of_a_row_are_numbered_as_v1_numbers_its_sessions():
    """verl's legacy agent loop passes no session id: the n copies of a row (sharing its prompt object) are numbered
    0..n-1 in the order they start, as V1's session ids; a new row object starts again at 0. Without it every copy
    got seed 0 and the legacy trainer's groups held n identical samples."""
    from verl_offpolicy.cpu.agent_loop import copy_number

    row, other = [{"role": "user", "content": "repeat a"}], [{"role": "user", "content": "repeat a"}]
    assert [copy_number(row) for _ in range(4)] == [0, 1, 2, 3]
    assert copy_number(other) == 0  # an equal but distinct row (another step's batch) is a new row
