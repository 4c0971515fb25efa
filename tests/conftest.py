"""Shared pytest setup."""

import os

import pytest


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
