"""The overlapped mode's background dispatch (verl_offpolicy/glue/scheduler/dispatch.py).

The manager here is a recorder standing in for verl's AgentLoopManagerTQ, whose generate_sequences blocks until
the Ray agent-loop workers took the batch: the tests control when it returns (an Event), which real workers do
not allow. The real manager behind BackgroundDispatch runs in every overlapped e2e run
(tests/scheduler/test_overlapped.py:
the same samples, versions and rewards as colocated).
"""

from __future__ import annotations

import threading

import pytest

from verl_offpolicy.glue.scheduler.dispatch import BackgroundDispatch


class _Manager:
    def __init__(self, fail_on=None):
        self.release = threading.Event()
        self.taken: list[tuple[str, str]] = []  # (batch, thread name), in the order the calls ran
        self.fail_on = fail_on
        self.other = "verl's attribute"

    def generate_sequences(self, batch):
        self.release.wait(timeout=60)
        if batch == self.fail_on:
            raise ValueError(f"worker rejected {batch}")
        self.taken.append((batch, threading.current_thread().name))


def test_the_trainer_does_not_wait_and_the_batches_are_taken_in_order_on_one_thread():
    manager = _Manager()
    dispatch = BackgroundDispatch(manager)
    for batch in ("B3", "B4", "B5"):
        dispatch.generate_sequences(batch)  # returns while the manager's call blocks
    assert manager.taken == []
    manager.release.set()
    dispatch.drain(timeout_s=60)
    assert [b for b, _ in manager.taken] == ["B3", "B4", "B5"]
    assert len({t for _, t in manager.taken}) == 1 and manager.taken[0][1] != threading.current_thread().name
    assert dispatch.other == "verl's attribute"  # everything else is the manager's


def test_a_failed_dispatch_is_raised_in_the_trainer_not_lost():
    manager = _Manager(fail_on="B4")
    dispatch = BackgroundDispatch(manager)
    dispatch.generate_sequences("B4")
    manager.release.set()
    with pytest.raises(ValueError, match="worker rejected B4"):
        dispatch.drain(timeout_s=60)


def test_a_dispatch_that_hangs_becomes_an_error_naming_what_hung():
    manager = _Manager()
    dispatch = BackgroundDispatch(manager)
    dispatch.generate_sequences("B3")
    with pytest.raises(RuntimeError, match=r"1 batch\(es\) not taken by verl's agent-loop workers within 0 s"):
        dispatch.drain(timeout_s=0.2)
    manager.release.set()
    dispatch.drain(timeout_s=60)
