"""Shared pytest setup."""

import os

import pytest


@pytest.fixture(scope="session")
def demo_runs(tmp_path_factory):
    """Demo runs shared across test modules, two at a time (``tests.cpu_harness.DemoRuns``): the
    scheduler's and the overlapped mode's tests ask for the same colocated runs."""
    from tests.cpu_harness import DemoRuns

    runs = DemoRuns(tmp_path_factory)
    yield runs
    runs.close()


@pytest.fixture(autouse=True)
def _restore_environment():
    """Every test leaves ``os.environ`` as it found it.

    Some code under test changes the environment of its own process on purpose (``check`` runs the
    CPU path's start-up callback in-process, which sets ``VERL_PLATFORM=cpu`` as ``main_ppo``'s driver
    would); without this, a later test's subprocesses would inherit it.
    """
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)
