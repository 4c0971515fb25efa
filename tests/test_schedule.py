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
    "s,d,key", [(0, 0, "sync_interval"), (1, -1, "sync_offset"), (1.5, 0, "sync_interval"), (True, 0, "sync_interval"), (2, "1", "sync_offset")]
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
