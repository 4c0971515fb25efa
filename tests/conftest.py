"""Shared pytest setup."""

import os

import pytest


def pytest_collection_modifyitems(items):
    """End-to-end tests run last (in their order): until then the test process runs the rest of the suite
    while the session's long jobs, queued at its start (:func:`_queue_long_jobs`), run beside it."""
    items.sort(key=lambda item: item.get_closest_marker("e2e") is not None)


@pytest.fixture(scope="session")
def demo_runs(tmp_path_factory):
    """The session's long jobs, shared across test modules (``tests.cpu_harness.DemoRuns``: one at a time
    beside the tests, two while a test waits for one); e.g. the scheduler's and the overlapped mode's
    tests ask for the same colocated runs."""
    from tests.cpu_harness import DemoRuns

    runs = DemoRuns(tmp_path_factory)
    yield runs
    runs.close()


@pytest.fixture(scope="session", autouse=True)
def _queue_long_jobs(request):
    """At the session's start, queue the long jobs of every fixture that a selected test uses, in the order
    the tests will ask for them: they run in the background from the first test on. A test module names
    them in ``SHARED_JOBS`` (fixture name -> function that queues that fixture's jobs in ``demo_runs``,
    the one its fixture calls too: queueing twice returns the same jobs)."""
    queues = {}
    for item in request.session.items:
        jobs = getattr(item.module, "SHARED_JOBS", {})
        for name in item.fixturenames:
            if name in jobs:
                queues.setdefault((item.module.__name__, name), jobs[name])
    if queues:
        demo_runs = request.getfixturevalue("demo_runs")
        for queue in queues.values():
            queue(demo_runs)


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
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value
