"""The test session's long jobs: a small scheduler that runs them beside the tests.

- :class:`SharedJobs`: jobs queued once per key in a thread pool, started only while the test process
  leaves room for them (one at a time while it runs tests, two while a test waits for one), with
  ``after=`` chains; :class:`SharedJob`: a queued job and its future.
- :func:`queued_at_start`: declares a fixture whose body only queues jobs; conftest calls it at the
  session's start for the selected tests that use it (:func:`queue_at_start`), so the jobs run in
  the background from the first test on.

Nothing here knows what a job does (tests/scenario_runs.py: demo runs).
"""

from __future__ import annotations

import inspect
import itertools
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest

# (job key, start in seconds after the session began, wall seconds, "ok" | error type) of every job that
# ran: conftest prints them at the end of the session, so a CI log shows where the suite's time went.
TIMINGS: list[tuple[str, float, float, str]] = []
_SESSION_START = time.monotonic()  # conftest imports this module as the session starts


class SharedJobs:
    """The session's long jobs, shared by the end-to-end tests of every module (:meth:`submit`; e.g. doctor,
    a resumed run; tests/scenario_runs.py's ``DemoRuns`` adds demo runs). conftest queues the jobs that the
    selected tests will ask for at the session's start (:func:`queued_at_start`), and runs the end-to-end
    tests last: the jobs run in the background while the rest of the suite runs in the test process. A
    run keeps about one of two cores busy (its start-up is a chain of processes importing verl one after
    the other), and so does the test process: while it runs tests, ``parallel - 1`` jobs go at once;
    while it waits for a job (:meth:`SharedJob.result`), ``parallel``. A job that failed raises the same
    error for every test that asks for it, without being run twice.

    Every job starts from the environment of the session's start (:attr:`environ`) plus what it names
    itself, never from ``os.environ`` of the moment: tests change it (``monkeypatch.setenv``) while jobs run.
    """

    def __init__(self, tmp_path_factory, parallel: int = 2):
        from concurrent.futures import ThreadPoolExecutor

        self.environ = dict(os.environ)
        self._tmp = tmp_path_factory
        self._pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="shared-job")
        self._jobs: dict[Any, Any] = {}
        self._lock = threading.Lock()
        self._parallel = parallel
        self._slots = threading.Condition()
        self._running = 0  # jobs under way
        self._waiting = 0  # test-process threads waiting for a job
        self._closing = False
        self._line: list[int] = []  # tickets of the jobs waiting to start, in the order they came to the gate
        self._tickets = itertools.count()

    def _gated(self, fn: Callable[..., Any], key: Any = None) -> Callable[..., Any]:
        """``fn`` that starts only while fewer jobs run than the test process leaves room for, after the jobs that
        came to that gate before it (its wall time recorded in :data:`TIMINGS` under ``key``). First come, first
        started: without the line, the thread that had just finished a job took the next free slot for the job it
        picked up next, and a job queued early (the 20-step learning run) waited behind all later ones."""

        def run(*args: Any, **kwargs: Any) -> Any:
            with self._slots:
                ticket = next(self._tickets)
                self._line.append(ticket)
                self._slots.wait_for(
                    lambda: (
                        self._closing
                        or (
                            self._line[0] == ticket
                            and self._running < (self._parallel if self._waiting else max(1, self._parallel - 1))
                        )
                    )
                )
                self._line.remove(ticket)
                self._slots.notify_all()  # the next in line may start too (two slots while a test waits)
                if self._closing:
                    raise RuntimeError("the test session ended before this shared job started")
                self._running += 1
            start, outcome = time.monotonic(), "ok"
            try:
                return fn(*args, **kwargs)
            except BaseException as error:
                outcome = type(error).__name__
                raise
            finally:
                TIMINGS.append((_describe(key), start - _SESSION_START, time.monotonic() - start, outcome))
                with self._slots:
                    self._running -= 1
                    self._slots.notify_all()

        return run

    def wait(self, future: Any) -> Any:
        """``future.result()``; while it waits, the test process's share of the machine goes to the jobs."""
        if future.done():
            return future.result()
        with self._slots:
            self._waiting += 1
            self._slots.notify_all()
        try:
            return future.result()
        finally:
            with self._slots:
                self._waiting -= 1

    def submit(self, key: Any, fn: Callable[..., Any], *args: Any, after: Sequence[Any] = (), **kwargs: Any):
        """Queue ``fn(*args, **kwargs)`` once per ``key``; returns its :class:`SharedJob`. A job with
        ``after`` (other jobs) enters the queue once they are all done, so it never holds a slot waiting."""
        from concurrent.futures import Future

        fn = self._gated(fn, key)
        with self._lock:
            if key in self._jobs:
                return self._jobs[key]
            if not after:
                self._jobs[key] = SharedJob(self, self._pool.submit(fn, *args, **kwargs))
                return self._jobs[key]
            outer: Future = Future()
            self._jobs[key] = SharedJob(self, outer)
        pending = [getattr(dep, "future", dep) for dep in after]
        remaining = [len(pending)]

        def forward(inner) -> None:
            if inner.cancelled():
                outer.cancel()
            elif inner.exception() is not None:
                outer.set_exception(inner.exception())
            else:
                outer.set_result(inner.result())

        def one_done(_) -> None:
            with self._lock:
                remaining[0] -= 1
                if remaining[0]:
                    return
            try:
                inner = self._pool.submit(fn, *args, **kwargs)
            except RuntimeError:  # the pool is shut down (the session ends)
                outer.cancel()
                return
            inner.add_done_callback(forward)

        for dep in pending:
            dep.add_done_callback(one_done)
        return self._jobs[key]

    def once(self, key: Any, create: Callable[[], Any]) -> Any:
        """The entry stored under ``key``, made by ``create()`` the first time (a subclass's kind of job)."""
        with self._lock:
            if key in self._jobs:
                return self._jobs[key]
        made = create()
        with self._lock:
            return self._jobs.setdefault(key, made)

    def tmp_dir(self, name: str) -> Path:
        """A new directory of the session's temp dir for a job's files."""
        return self._tmp.mktemp(name)

    def close(self) -> None:
        """Drop the jobs not started yet and wait for those under way (each ends within its timeout)."""
        with self._slots:
            self._closing = True
            self._slots.notify_all()
        self._pool.shutdown(wait=True, cancel_futures=True)


@dataclass(frozen=True)
class SharedJob:
    """A job queued in :class:`SharedJobs` and its future."""

    owner: SharedJobs
    future: Any

    def result(self):
        """Wait for the job (:meth:`SharedJobs.wait`); its result, or its error raised."""
        return self.owner.wait(self.future)


# (module, fixture name) -> the fixture's function: what conftest calls at the session's start
_QUEUED_AT_START: dict[tuple[str, str], Callable[..., Any]] = {}


def queued_at_start(scope: str = "function") -> Callable[[Callable[..., Any]], Any]:
    """Decorator: a pytest fixture of ``scope`` whose body queues jobs (:meth:`SharedJobs.submit`, which
    returns the same job for the same key) and returns their handles without waiting for them.

    conftest also calls the function once at the session's start for every selected test that uses the
    fixture, with the same arguments, which must be session-scoped fixtures (e.g. ``demo_runs``): the
    jobs are then under way long before the test asks for them, and a test run alone queues only its
    own fixtures' jobs.
    """

    def declare(fn: Callable[..., Any]) -> Any:
        _QUEUED_AT_START[(fn.__module__, fn.__name__)] = fn
        return pytest.fixture(scope=scope)(fn)

    return declare


def queue_at_start(request: Any) -> None:
    """Call every :func:`queued_at_start` fixture that a selected test of ``request``'s session uses, in
    the order of the tests (each once per module), its arguments from ``request.getfixturevalue``."""
    queues = {}
    for item in request.session.items:
        module = getattr(getattr(item, "module", None), "__name__", None)
        for name in getattr(item, "fixturenames", ()):
            fn = _QUEUED_AT_START.get((module, name))
            if fn is not None:
                queues.setdefault((module, name), fn)
    for fn in queues.values():
        fn(**{arg: request.getfixturevalue(arg) for arg in inspect.signature(fn).parameters})


def _describe(key: Any, width: int = 110) -> str:
    """A job's key as one short line (``("job", "run", preset, steps, overrides, ...)`` → ``run preset steps ...``)."""
    parts = [
        " ".join(map(str, p)) if isinstance(p, (tuple, list)) else str(p)
        for p in (key if isinstance(key, tuple) else (key,))
    ]
    text = " ".join(p for p in parts if p and p != "job")
    return text if len(text) <= width else text[: width - 1] + "…"


def timings_report() -> list[str]:
    """Lines for the end of the session: each shared job's start (s after the first), wall time and outcome."""
    if not TIMINGS:
        return []
    lines = [
        f"shared jobs: {len(TIMINGS)}, {sum(t[2] for t in TIMINGS):.0f} s of job wall time (start s after the "
        "session began, wall s, outcome, job)"
    ]
    lines += [
        f"{start:7.0f} {wall:6.0f}  {outcome:<8} {name}"
        for name, start, wall, outcome in sorted(TIMINGS, key=lambda t: t[1])
    ]
    return lines
