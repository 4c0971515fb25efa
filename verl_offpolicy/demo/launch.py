"""Running ``main_ppo`` as a subprocess: its own process group, its output streamed to the log and a
callback line by line, a timeout, and its Ray session ended after any exit (:mod:`.process`)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from verl_offpolicy.demo.errors import DemoError
from verl_offpolicy.demo.process import (
    SharedMemoryWatch,
    held_shared_memory,
    kill_process_tree,
    listening_addresses,
    orphaned_since,
    remove_leftover_files,
    shared_memory_listing,
    spawn,
)
from verl_offpolicy.demo.progress import STEP_LINE


def run_subprocess(
    command: Sequence[str],
    *,
    env: dict[str, str],
    log_path: str | os.PathLike,
    timeout: float,
    ray_marker: Optional[str] = None,
    on_line: Optional[Callable[[str], None]] = None,
    cwd: Optional[str] = None,
    listening: Optional[list[str]] = None,
    pass_fds: Sequence[int] = (),
    shared_memory: Optional[dict[str, list[str]]] = None,
    log_banner: str = "",
) -> tuple[int, float, dict[str, float]]:
    """Run ``command`` in its own process group with a timeout; log to ``log_path``.

    Returns (return code, wall seconds, {first_step_line: seconds after launch}). If ``listening``
    is a list, it receives the addresses the run listens on at its first training step. If
    ``shared_memory`` is a dict, ``held`` receives the ``/dev/shm`` files the run's processes have mapped at
    that step and ``removed`` those of them the run left behind, which are unlinked once its processes are
    gone (vLLM's engine queues and semaphores: their creators never shut down, see docs/vllm_cpu.md), plus the
    files the run's processes mapped (polled while it runs) and left unmapped
    (:func:`~verl_offpolicy.demo.process.orphaned_since`; never another run's). On timeout
    the process tree is killed and :class:`DemoError` is raised with the log's tail. After any exit,
    processes of the run's Ray session that are still alive are ended. ``pass_fds`` stay open in the
    subprocess (the output directory's lock). ``log_banner``: if not empty, ``log_path`` is appended to,
    after this line (a re-run in the same directory); else it is written anew.
    """
    start = time.monotonic()
    marks: dict[str, float] = {}
    held: list[str] = []
    before = shared_memory_listing() if shared_memory is not None else set()
    log_path = Path(log_path)
    log = open(log_path, "a" if log_banner else "w", buffering=1)
    try:
        try:
            log.write(log_banner)
        except OSError as exc:
            raise DemoError(
                f"cannot write the run's log {log_path}: {exc.strerror or exc} ({_free_space(log_path)})"
            ) from None
        proc = spawn(command, env, cwd, pass_fds)

        def on_first_step() -> None:
            marks["first_step"] = time.monotonic() - start
            if listening is not None:
                listening.extend(listening_addresses(proc, ray_marker))
            if shared_memory is not None:
                held.extend(held_shared_memory(proc, ray_marker))

        output_failed: list[OSError] = []
        reader = threading.Thread(target=_pump, args=(proc, log, on_first_step, on_line, output_failed), daemon=True)
        reader.start()
        watch, stop_watch = SharedMemoryWatch(), threading.Event()
        if shared_memory is not None:
            threading.Thread(
                target=_watch_shared_memory, args=(watch, stop_watch, proc, ray_marker), daemon=True
            ).start()
        try:
            returncode = _wait(proc, reader, timeout, ray_marker, log_path, output_failed)
        finally:
            stop_watch.set()
            if shared_memory is not None:
                left = sorted(set(held) | set(orphaned_since(before, owned=watch.inodes)))
                shared_memory.update(held=sorted(held), removed=remove_leftover_files(left))
    finally:
        with contextlib.suppress(OSError):  # a full disk: the failure is already raised, naming the path
            log.close()
    return returncode, time.monotonic() - start, marks


SHM_POLL_S = 1.0  # how often the run's /dev/shm mappings are recorded (SharedMemoryWatch)


def _watch_shared_memory(
    watch: SharedMemoryWatch, stop: threading.Event, proc: subprocess.Popen, ray_marker: Optional[str]
) -> None:
    while not stop.is_set() and proc.poll() is None:
        try:
            watch.poll(proc, ray_marker)
        except Exception:  # noqa: BLE001 - a process ending mid-read; the next poll sees the rest
            pass
        stop.wait(SHM_POLL_S)


def _free_space(path: Path) -> str:
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return "unknown free space"
    return f"{st.f_bavail * st.f_frsize / 2**20:.1f} MiB free on its file system"


def _wait_or_output_failure(
    proc: subprocess.Popen, timeout: float, output_failed: list[OSError], log_path: Path
) -> int:
    """``proc.wait(timeout)``, cut short by a failed write of the run's log (raised as :class:`DemoError`)."""
    deadline = time.monotonic() + timeout
    while True:
        if output_failed:
            exc = output_failed[0]
            raise DemoError(
                f"cannot write the run's log {log_path}: {exc.strerror or exc} ({_free_space(log_path)}); the run was "
                "ended. Free space there or choose another --output-dir."
            )
        try:
            return proc.wait(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise


def _wait(
    proc: subprocess.Popen,
    reader: threading.Thread,
    timeout: float,
    ray_marker: Optional[str],
    log_path: Path,
    output_failed: list[OSError],
) -> int:
    """The run's exit code; on timeout, a failed write of its log or any interruption its process tree is killed
    (and a timeout or an output failure raises :class:`DemoError`). After a clean exit, what a failed run left of
    its Ray session is ended."""
    try:
        returncode = _wait_or_output_failure(proc, timeout, output_failed, log_path)
    except subprocess.TimeoutExpired:
        kill_process_tree(proc, ray_marker)
        reader.join(timeout=5)
        raise DemoError(
            f"the CPU demo did not finish within {timeout:.0f}s and was killed (process group and its Ray "
            f"session); end of {log_path}:\n{tail(log_path)}"
        ) from None
    except BaseException:
        kill_process_tree(proc, ray_marker)
        raise
    reader.join(timeout=30)
    # A clean exit shuts Ray down itself; this catches anything a failed run left behind.
    kill_process_tree(proc, ray_marker)
    return returncode


def _pump(
    proc: subprocess.Popen,
    log,
    on_first_step: Callable[[], None],
    on_line: Optional[Callable[[str], None]],
    output_failed: list[OSError],
) -> None:
    """Copy the run's output to ``log`` line by line; call ``on_first_step`` at verl's ``step:1`` line
    and ``on_line`` for every line (its errors are swallowed: the pipe must keep draining or the child blocks).
    A failed write of the log (a full disk, an I/O error) is put in ``output_failed`` for the waiting thread,
    which ends the run; the pipe is drained on until then."""
    assert proc.stdout is not None
    first_step_seen = False
    for raw in proc.stdout:
        line = raw.rstrip("\n")
        if output_failed:
            continue
        try:
            log.write(raw)
        except OSError as exc:
            output_failed.append(exc)
            continue
        if not first_step_seen:
            match = STEP_LINE.search(line)
            if match and match.group(1) == "1":
                first_step_seen = True
                on_first_step()
        if on_line is not None:
            try:
                on_line(line)
            except Exception:  # noqa: BLE001 - the pipe must keep draining or the child blocks
                pass


def dead_actor(log: str) -> str | None:
    """One line naming the Ray actor whose death ended the run, from the last ``ActorDiedError`` report in
    ``log`` (Ray's ``class_name``/``name``/``pid`` lines and the worker's exit detail), or None if there is none."""
    start = log.rfind("The actor died")
    if start < 0:
        return None
    report = log[start : start + 2000]
    fields = dict(re.findall(r"^\s+(class_name|name|pid|ip): (\S+)$", report, flags=re.MULTILINE))
    detail = re.search(r"Worker exit detail: ([^.]*\.)", report)
    who = fields.get("name") or fields.get("class_name") or "a Ray actor"
    kind = f" ({fields['class_name']}, pid {fields.get('pid', '?')})" if "class_name" in fields else ""
    why = detail.group(1) if detail else "its worker process died"
    return (
        f"the Ray actor {who}{kind} died: {why} Its process was killed (SIGKILL, the kernel's OOM killer: see "
        "`dmesg`) or crashed; every request to it then fails with the same ActorDiedError"
    )


def failure_message(returncode: int, log_path: str | os.PathLike) -> str:
    """Why main_ppo ended with ``returncode``: the dead actor in one line if an actor's death ended it (the
    traceback stays in the log), else the end of the log."""
    try:
        cause = dead_actor(Path(log_path).read_text(errors="replace"))
    except OSError:
        cause = None
    if cause:
        return f"main_ppo exited with status {returncode}: {cause}. The full traceback: {log_path}"
    return f"main_ppo exited with status {returncode}; end of {log_path}:\n{tail(log_path)}"


def tail(path: str | os.PathLike, lines: int = 60) -> str:
    """The last ``lines`` lines of the file at ``path`` (``<no log>`` if it cannot be read)."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"
