"""The session's long jobs (tests/jobs.py): the scheduler's gating, ``after=`` chains and close, and which
jobs conftest queues at the session's start (``queued_at_start`` fixtures of the selected tests only)."""

import textwrap
from pathlib import Path

import pytest

from tests.jobs import SharedJobs

REPO_ROOT = Path(__file__).resolve().parents[1]


class _Jobs:
    """Jobs that report when they start and run until released, counting how many run at once."""

    def __init__(self):
        import threading

        self.lock, self.running, self.most = threading.Lock(), 0, 0
        self.started = {i: threading.Event() for i in range(10)}
        self.release = threading.Event()

    def __call__(self, i: int) -> int:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        self.started[i].set()
        assert self.release.wait(timeout=120)
        with self.lock:
            self.running -= 1
        return i


def test_shared_jobs_run_one_at_a_time_beside_the_tests_and_two_while_a_test_waits(tmp_path_factory):
    """The test process keeps one core busy while it runs tests: one job at a time then; a test waiting
    for a job gives its share to the jobs: two at a time. A job queued ``after`` others starts once they
    are done; jobs not started when the session ends never start."""
    import threading

    runs, jobs = SharedJobs(tmp_path_factory), _Jobs()
    queued = [runs.submit(i, jobs, i) for i in range(3)]
    assert runs.submit(0, jobs, 0) is queued[0]  # once per key
    assert jobs.started[0].wait(timeout=60)
    assert not jobs.started[1].wait(timeout=1.0) and jobs.most == 1  # the test process is busy: one job
    waiter = threading.Thread(target=queued[2].result)
    waiter.start()  # a test waits: a second job starts
    assert jobs.started[1].wait(timeout=60) and jobs.most == 2
    follow_up = runs.submit("after", jobs, 3, after=[queued[0], queued[1]])
    assert not jobs.started[3].wait(timeout=0.5)
    jobs.release.set()
    waiter.join(timeout=60)
    assert [job.result() for job in queued] == [0, 1, 2] and follow_up.result() == 3
    assert jobs.most == 2
    jobs.release.clear()
    late = [runs.submit(("late", i), jobs, 4 + i) for i in range(2)]
    assert jobs.started[4].wait(timeout=60)
    closing = threading.Thread(target=runs.close)
    closing.start()
    jobs.release.set()
    closing.join(timeout=60)
    assert late[0].result() == 4
    assert not jobs.started[5].is_set() and (late[1].future.cancelled() or late[1].future.exception() is not None)


# ------------------------------------------------------------------ what conftest queues at the session's start

# A test module with two queued_at_start fixtures; the log (fixture bodies and tests, in order) is written
# to log.json at the end of every test, so the last test's write is the session's whole log.
QUEUEING_MODULE = """
    import json
    from pathlib import Path

    import pytest

    from tests.jobs import queued_at_start

    LOG = []


    @queued_at_start()
    def first(demo_runs):
        LOG.append("first")
        return demo_runs.submit("first", str, "first job")


    @queued_at_start(scope="module")
    def second(demo_runs):
        LOG.append("second")
        return demo_runs.submit("second", str, "second job")


    @pytest.mark.e2e
    def test_first(first):
        assert first.result() == "first job"
        LOG.append("test_first")
        Path(__file__).with_name("log.json").write_text(json.dumps(LOG))


    def test_second(second):
        assert second.result() == "second job"
        LOG.append("test_second")
        Path(__file__).with_name("log.json").write_text(json.dumps(LOG))
"""


def _session_log(pytester, monkeypatch, *args: str) -> list[str]:
    """Run the queueing module in a fresh pytest process under the suite's own conftest hooks and fixtures
    (in-process, its modules would be dropped after the run and re-imported by the next one, which numpy
    refuses); the session's log."""
    import json
    import os

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))  # our `tests`
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\nmarkers =\n    e2e: end to end\n")
    pytester.makeconftest(
        "from tests.conftest import _queue_long_jobs, _restore_environment, demo_runs, "
        "pytest_collection_modifyitems  # noqa: F401\n"
    )
    pytester.makepyfile(test_queueing=textwrap.dedent(QUEUEING_MODULE))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=300)
    result.assert_outcomes(passed=2 if not args else 1, deselected=0 if not args else 1)
    return json.loads((pytester.path / "log.json").read_text())


@pytest.mark.slow
def test_shared_jobs_start_in_the_order_they_were_queued(tmp_path_factory):
    """First come, first started: a thread that has just finished a job must not start the job it picks up
    next ahead of a job that was already waiting for a slot (the learning run, queued second, once started
    last of 21)."""
    import time

    runs, order = SharedJobs(tmp_path_factory), []

    def job(i: int) -> int:
        order.append(i)
        time.sleep(0.05)
        return i

    jobs = [runs.submit(("fifo", i), job, i) for i in range(8)]
    assert [j.future.result(timeout=120) for j in jobs] == list(range(8))
    runs.close()
    assert order == list(range(8))


def test_the_session_queues_every_selected_tests_jobs_at_its_start_and_runs_e2e_tests_last(pytester, monkeypatch):
    """Both fixtures' bodies run before the first test, in the order of the tests (e2e last), then again
    as fixtures (returning the same jobs)."""
    assert _session_log(pytester, monkeypatch) == ["second", "first", "second", "test_second", "first", "test_first"]


@pytest.mark.slow
def test_a_test_selected_alone_queues_only_its_own_fixtures_jobs(pytester, monkeypatch):
    assert _session_log(pytester, monkeypatch, "-k", "test_first") == ["first", "first", "test_first"]
