"""Shared pytest setup."""

import os

import pytest

from tests.jobs import queue_at_start, timings_report

pytest_plugins = ("pytester",)  # tests/test_jobs.py runs sessions of its own under these hooks


def pytest_collection_modifyitems(items):
    """End-to-end tests run last (in their order): until then the test process runs the rest of the suite
    while the session's long jobs, queued at its start (:func:`_queue_long_jobs`), run beside it."""
    items.sort(key=lambda item: item.get_closest_marker("e2e") is not None)


@pytest.fixture(scope="session")
def demo_runs(tmp_path_factory):
    """The session's long jobs, shared across test modules (``tests.scenario_runs.DemoRuns``: one at a time
    beside the tests, two while a test waits for one); e.g. the scheduler's and the overlapped mode's
    tests ask for the same colocated runs."""
    from tests.scenario_runs import DemoRuns

    runs = DemoRuns(tmp_path_factory)
    yield runs
    runs.close()


@pytest.fixture(scope="session", autouse=True)
def _queue_long_jobs(request):
    """At the session's start, queue the long jobs of every fixture that a selected test uses, in the order
    the tests will ask for them: they run in the background from the first test on. Such a fixture is
    declared with ``tests.jobs.queued_at_start``; its body only queues (queueing twice returns the same
    jobs)."""
    queue_at_start(request)


@pytest.fixture(autouse=True)
def _restore_environment():
    """Every test leaves ``os.environ`` as it found it.

    Some code under test changes the environment of its own process on purpose (``check`` runs the
    CPU path's start-up callback in-process, which sets ``VERL_PLATFORM=cpu`` as ``main_ppo``'s driver
    would); without this, a later test's subprocesses would inherit it.
    """
    saved = dict(os.environ)
    yield
    for key in set(os.environ) - set(saved):  # key by key: never an empty environment in between
        os.environ.pop(key, None)  # a shared job's thread may have removed it meanwhile
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def pytest_terminal_summary(terminalreporter):
    """Where the session's long jobs spent their time (tests/jobs.py), beside ``--durations``."""
    lines = timings_report()
    if lines:
        terminalreporter.section("shared jobs")
        for line in lines:
            terminalreporter.write_line(line)
