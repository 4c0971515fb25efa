"""The staleness schedule of docs/scheduler.md: v(t), staleness, rollout calls and FIFO bound."""

import pytest

from verl_offpolicy.core.schedule import Schedule, check_schedule

# The table of docs/scheduler.md ("Vocabulary"), steps 1..12, written out from the spec (not computed).
SPEC_VERSIONS = {
    (1, 0): [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
    (1, 1): [0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
    (2, 0): [0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10],
    (4, 1): [0, 0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8],
    (10, 0): [0] * 10 + [10, 10],
}
SPEC_STALENESS = {
    (1, 0): [0] * 12,
    (1, 1): [0] + [1] * 11,
    (2, 0): [0, 1] * 6,
    (4, 1): [0, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3],
    (10, 0): list(range(10)) + [0, 1],
}


@pytest.mark.parametrize("s,d", sorted(SPEC_VERSIONS))
def test_versions_and_staleness_match_spec_table(s, d):
    assert [Schedule(s, d).version(t) for t in range(1, 13)] == SPEC_VERSIONS[(s, d)]
    assert [Schedule(s, d).staleness(t) for t in range(1, 13)] == SPEC_STALENESS[(s, d)]


@pytest.mark.parametrize("s,d", [(1, 0), (1, 1), (2, 0), (4, 1), (10, 0), (3, 5), (8, 0)])
def test_each_step_is_generated_exactly_once_at_its_version(s, d):
    steps = 60
    produced = {}
    for version in range(steps):
        for t in Schedule(s, d).generation_steps(version):
            assert t not in produced, f"step {t} generated twice"
            produced[t] = version
    assert all(produced[t] == Schedule(s, d).version(t) for t in range(1, steps + 1))
    # the batch of step t is generated before step t trains: at version v(t) <= t - 1
    assert all(produced[t] <= t - 1 for t in range(1, steps + 1))


@pytest.mark.parametrize("s,d", [(1, 0), (1, 1), (2, 0), (4, 1), (10, 0), (3, 5)])
def test_fifo_never_exceeds_s_plus_d_and_rollout_calls_every_s_steps(s, d):
    rows = Schedule(s, d).table(50)
    assert max(r.queue_len for r in rows) == s + d == Schedule(s, d).capacity
    calls = [r.step for r in rows if r.generates]
    assert calls[0] == 1 and rows[0].generates == s + d
    assert all(b - a == s for a, b in zip(calls, calls[1:]))
    # every later call generates s batches, except that nothing is generated past the run's last step
    assert all(r.generates == min(s, 50 - (r.step + d) + 1) for r in rows[1:] if r.generates)
    # steady state: staleness cycles through d .. d + s - 1
    assert {r.staleness for r in rows[s + d :]} == set(range(d, d + s))


@pytest.mark.parametrize(
    "s,d,key",
    [
        (0, 0, "sync_interval"),
        (1, -1, "sync_offset"),
        (1.5, 0, "sync_interval"),
        (True, 0, "sync_interval"),
        (2, "1", "sync_offset"),
    ],
)
def test_invalid_schedule_names_the_key(s, d, key):
    with pytest.raises(ValueError, match=f"algorithm.offpolicy.{key} must be an integer"):
        check_schedule(s, d)
    with pytest.raises(ValueError, match=f"algorithm.offpolicy.{key} must be an integer"):
        Schedule(s, d)  # validated once, when the value is made


@pytest.mark.timeout(60)
@pytest.mark.parametrize("s,d", [(10**12, 0), (1, 10**12), (10**12, 10**12)])
def test_huge_interval_or_offset_costs_only_the_runs_steps(s, d):
    """s or d far beyond the run's N steps: generation is bounded by N in O(1), never a loop up to s."""
    n = 7
    assert Schedule(s, d).generation_steps(0, total_steps=n) == range(1, n + 1)
    assert len(Schedule(s, d).generation_steps(s, total_steps=n)) == 0
    rows = Schedule(s, d).table(n)
    assert [r.generates for r in rows] == [n] + [0] * (n - 1)
    assert [r.queue_len for r in rows] == list(range(n, 0, -1))


@pytest.mark.timeout(60)
def test_trainer_generation_is_bounded_by_total_steps():
    """The scheduler trainer's step selection (its public helper: no Ray, no workers, no half-built trainer)."""
    from verl_offpolicy.glue.config import OffPolicyConfig
    from verl_offpolicy.glue.scheduler.trainer import steps_to_generate

    schedule = OffPolicyConfig(sync_interval=10**12, sync_offset=3).schedule
    assert steps_to_generate(schedule, 0, total_steps=5) == [1, 2, 3, 4, 5]
    assert steps_to_generate(schedule, 0, total_steps=5, queued={1, 2}) == [3, 4, 5]
    # generates after version 0, nothing after version 10**12 within the run's 5 steps
    assert steps_to_generate(schedule, 0, total_steps=5) and not steps_to_generate(schedule, 10**12, total_steps=5)


@pytest.mark.parametrize("steps", [0, -3, 2.5, True])
def test_schedule_table_rejects_a_run_without_steps(steps):
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        Schedule(2, 0).table(steps)


@pytest.mark.parametrize("step", [0, -1, 1.5, True])
def test_version_rejects_a_step_that_is_not_one_indexed(step):
    with pytest.raises(ValueError, match="1-indexed"):
        Schedule(2, 1).version(step)


# ------------------------------------------------------------------------------ extending a run from its checkpoint


def _queued_at_checkpoint(schedule: Schedule, saved: int, run_steps: int) -> set[int]:
    """The FIFO in the checkpoint of step ``saved`` of a run of ``run_steps`` steps that saves checkpoints: the
    batches generated at versions 0 .. saved - 1 (the versions that generate before that checkpoint, in both
    modes) for steps after ``saved``, as the trainer selects them (``generation_steps(..., past_end=True)``)."""
    return {
        t for v in range(saved) for t in schedule.generation_steps(v, total_steps=run_steps, past_end=True) if t > saved
    }


@pytest.mark.parametrize("s,d", [(1, 0), (1, 1), (2, 0), (2, 1), (4, 1), (3, 5), (1, 3)])
@pytest.mark.parametrize("run_steps", [1, 3, 8])
def test_a_checkpointing_run_can_be_extended_at_the_scheduled_versions(s, d, run_steps):
    """A run of N steps saves its last checkpoint at N; a run resumed from it with more steps must
    find every batch the schedule generates at a version before N in that checkpoint (those weights are gone).
    Wherever s + d <= N the checkpoint holds them, for any number of steps of the resumed run."""
    schedule = Schedule(s, d)
    queued = _queued_at_checkpoint(schedule, run_steps, run_steps)
    for more in range(run_steps + 1, run_steps + 3 * (s + d) + 3):
        lost = schedule.steps_lost_at_resume(run_steps, more, queued)
        if s + d <= run_steps:
            assert lost == [], (more, sorted(queued))
        # whatever it holds is what the schedule gives those versions: step t at v(t) < N
        assert all(schedule.version(t) < run_steps for t in queued)
    # an intermediate checkpoint too (the run goes on past it; the extended run has more steps)
    for saved in range(1, run_steps):
        assert (
            schedule.steps_lost_at_resume(saved, run_steps + 5, _queued_at_checkpoint(schedule, saved, run_steps)) == []
            or s + d > run_steps
        )


def test_past_end_generation_is_the_schedules_and_bounded():
    """(1, 1): version 2 generates step 4. A run of 3 steps generates it only if it saves checkpoints; version
    3 (the last checkpoint's weights) generates nothing in that run: the resumed run does it."""
    s11 = Schedule(1, 1)
    assert list(s11.generation_steps(2, total_steps=3)) == []
    assert list(s11.generation_steps(2, total_steps=3, past_end=True)) == [4]
    assert list(s11.generation_steps(3, total_steps=3, past_end=True)) == []
    assert list(s11.generation_steps(0, total_steps=1, past_end=True)) == [1, 2]
    # (4, 1), 6 steps: version 4 generates steps 6..9 (3 past the end)
    assert list(Schedule(4, 1).generation_steps(4, total_steps=6, past_end=True)) == [6, 7, 8, 9]
    # never more than min(s + d, N) steps past the end, whatever s and d
    assert Schedule(10**12, 0).generation_steps(0, total_steps=7, past_end=True) == range(1, 15)
    assert Schedule(1, 10**12).generation_steps(0, total_steps=7, past_end=True) == range(1, 15)


def test_steps_lost_at_resume_names_the_steps_whose_weights_are_gone():
    """The issue's case: (1, 1), a checkpoint at step 3 of a 3-step run that generated nothing past step 3,
    resumed to 5 steps: step 4 is scheduled at version 2, whose weights are gone; step 5 (version 3, the
    checkpoint's) is generated by the resumed run."""
    s11 = Schedule(1, 1)
    assert s11.steps_lost_at_resume(3, 5, queued=()) == [4]
    assert s11.steps_lost_at_resume(3, 5, queued={4}) == []
    assert s11.steps_lost_at_resume(3, 3, queued=()) == []
    assert Schedule(2, 2).steps_lost_at_resume(4, 9, queued={5}) == [6]  # v(5) = v(6) = 2; v(7) = 4
    assert Schedule(1, 10**12).steps_lost_at_resume(3, 6, queued={4}) == [5, 6]  # bounded by N, all at version 0


def test_resuming_without_the_batches_says_why_and_what_to_do():
    s11 = Schedule(1, 1)
    s11.check_resume(3, 5, queued={4: 2})
    with pytest.raises(RuntimeError) as failure:
        s11.check_resume(3, 5, queued={})
    message = str(failure.value)
    for part in (
        "resuming from the checkpoint of step 3 with trainer.total_training_steps=5",
        "steps [4] train on batches generated at versions [2]",
        "sync_interval=1, sync_offset=1",
        "those versions' weights are gone",
        "resume from an earlier checkpoint (one of step 2 or before)",
        "trainer.resume_mode=disable",
    ):
        assert part in message, message
    with pytest.raises(RuntimeError, match=r"train to step 4 at most from this one \(trainer.total_training_steps=4\)"):
        Schedule(1, 2).check_resume(3, 6, queued={4: 1})  # v(5) = 2: lost; step 4 is queued
    # a checkpoint saved with another schedule: its queued batches are at other versions
    with pytest.raises(
        RuntimeError,
        match=r"\(step, version\) \[\(4, 2\)\] were scheduled with another "
        r"algorithm.offpolicy.sync_interval/sync_offset",
    ):
        Schedule(1, 0).check_resume(3, 6, queued={4: 2})  # (1, 0): v(4) = 3


def test_is_stale_is_false_only_for_the_on_policy_schedule():
    """(s, d) = (1, 0) trains every batch at its generating weights; any other schedule has a stale batch."""
    from verl_offpolicy.core.schedule import Schedule

    assert [Schedule(s, d).is_stale for s, d in ((1, 0), (2, 0), (1, 1), (4, 1))] == [False, True, True, True]
