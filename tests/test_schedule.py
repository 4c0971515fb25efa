"""The staleness schedule of SCHEDULER.md: v(t), staleness, rollout calls and FIFO bound."""

import pytest

from verl_offpolicy.core.schedule import (
    check_schedule,
    generation_steps,
    schedule_table,
    staleness_of_step,
    version_of_step,
)

# The table of SCHEDULER.md, steps 1..12, written out from the spec (not computed).
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
    assert [version_of_step(t, s, d) for t in range(1, 13)] == SPEC_VERSIONS[(s, d)]
    assert [staleness_of_step(t, s, d) for t in range(1, 13)] == SPEC_STALENESS[(s, d)]


@pytest.mark.parametrize("s,d", [(1, 0), (1, 1), (2, 0), (4, 1), (10, 0), (3, 5), (8, 0)])
def test_each_step_is_generated_exactly_once_at_its_version(s, d):
    steps = 60
    produced = {}
    for version in range(steps):
        for t in generation_steps(version, s, d):
            assert t not in produced, f"step {t} generated twice"
            produced[t] = version
    assert all(produced[t] == version_of_step(t, s, d) for t in range(1, steps + 1))
    # the batch of step t is generated before step t trains: at version v(t) <= t - 1
    assert all(produced[t] <= t - 1 for t in range(1, steps + 1))


@pytest.mark.parametrize("s,d", [(1, 0), (1, 1), (2, 0), (4, 1), (10, 0), (3, 5)])
def test_fifo_never_exceeds_s_plus_d_and_rollout_calls_every_s_steps(s, d):
    rows = schedule_table(s, d, 50)
    assert max(r.queue_len for r in rows) == s + d
    calls = [r.step for r in rows if r.generates]
    assert calls[0] == 1 and rows[0].generates == s + d
    assert all(b - a == s for a, b in zip(calls, calls[1:]))
    assert all(r.generates == s for r in rows[1:] if r.generates)
    # steady state: staleness cycles through d .. d + s - 1
    assert {r.staleness for r in rows[s + d :]} == set(range(d, d + s))


@pytest.mark.parametrize(
    "s,d,key", [(0, 0, "sync_interval"), (1, -1, "sync_offset"), (1.5, 0, "sync_interval"), (True, 0, "sync_interval"), (2, "1", "sync_offset")]
)
def test_invalid_schedule_names_the_key(s, d, key):
    with pytest.raises(ValueError, match=f"algorithm.offpolicy.{key} must be an integer"):
        check_schedule(s, d)
