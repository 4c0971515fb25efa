"""Process management of the demo tooling: spawn a command in its own session (a killable process
group), run it with a timeout, end it with its Ray session, find what it listens on, one holder per
lock, and SIGINT/SIGTERM turned into an exception the caller can clean up after.

Used by the demo (:mod:`verl_offpolicy.demo.run`), ``verl-offpolicy doctor``'s Ray probe and the tests.
Standard library and psutil only (psutil imported where used); nothing of verl. Whether an address is
loopback is the CPU platform's rule (:func:`verl_offpolicy.cpu.platform.is_loopback`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TypeVar

T = TypeVar("T")


# What Ray says when a new node's raylet misses the fixed 30 s it is given to register with the GCS
# (ray/_private/node.py): a loaded machine, nothing trained yet; starting Ray again is the remedy.
RAY_START_TIMED_OUT = "The current node timed out during startup"
RAY_START_ATTEMPTS = 3


def retry_ray_start(start: Callable[[int], T], errors: type[Exception], say: Callable[[str], None], prefix: str) -> T:
    """``start(attempt)`` (attempt 1, 2, ...), again while it raises one of ``errors`` saying
    :data:`RAY_START_TIMED_OUT`, :data:`RAY_START_ATTEMPTS` times in all; any other error, or the last
    attempt's, is raised. ``say`` gets one line per retry, after ``prefix``."""
    for attempt in range(1, RAY_START_ATTEMPTS):
        try:
            return start(attempt)
        except errors as exc:
            if RAY_START_TIMED_OUT not in str(exc):
                raise
            say(
                f"{prefix} Ray's raylet missed the fixed 30 s Ray gives it to start (a loaded machine; nothing ran "
                f"yet): starting again, attempt {attempt + 1} of {RAY_START_ATTEMPTS}"
            )
    return start(RAY_START_ATTEMPTS)


def names_path(cmdline: Sequence[str], path: str) -> bool:
    """Whether a command line names ``path`` or a path under it as an argument or an option's value
    (``/d``, ``--temp-dir=/d``, ``/d/session_1/sockets/raylet``), not merely a longer name that starts with it
    (``/d-other-run``)."""
    pattern = re.compile(r"(?:^|[=\s,:'\"])" + re.escape(path.rstrip("/")) + r"(?:$|[/\s,:'\"])")
    return any(pattern.search(arg) for arg in cmdline)


def _own_processes(matches: Callable[[list[str]], bool]) -> list:
    """This user's processes, other than this one, whose command line (its arguments) ``matches``."""
    import psutil

    found = []
    me, uid = os.getpid(), os.getuid()
    for proc in psutil.process_iter(["pid", "cmdline", "uids"]):
        try:
            cmdline, uids = proc.info["cmdline"] or [], proc.info["uids"]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if proc.info["pid"] != me and uids is not None and uids.real == uid and matches(cmdline):
            found.append(proc)
    return found


def session_processes(marker: str) -> list:
    """This user's processes whose command line names the path ``marker`` (our unique Ray temp dir, or a
    cluster's dir; :func:`names_path`), other than this one."""
    return _own_processes(lambda cmdline: names_path(cmdline, marker))


def _self_and_ancestors() -> set[int]:
    """This process and every process above it (its parent, a ``timeout`` or shell wrapping it, ...): never
    signalled by a sweep, whatever their command lines name."""
    import psutil

    found = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        found |= {p.pid for p in psutil.Process().parents()}
    return found


def _holds_file_under(pid: int, path: str) -> bool:
    """Whether process ``pid`` has a file under ``path`` open (``/proc/<pid>/fd``): Ray's agents and workers keep
    their logs (``<temp dir>/session_*/logs/*``) open as stdout, stderr and log file. False if it ended or is not
    ours to read."""
    prefix = path.rstrip("/") + "/"
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(prefix):
            return True
    return False


def dir_processes(path: str, extra: Sequence = ()) -> list:
    """This user's processes of the Ray session (or cluster) whose private dir is ``path``: those whose command line
    names it (:func:`names_path`) and those that hold a file under it open, which finds the processes Ray retitles
    (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``, ``ray::IDLE``: their command line is the title alone) after
    their raylet is gone and they are orphans of init. ``extra`` (psutil processes, e.g. the descendants of a
    recorded pid) is added. Never this process nor one of its ancestors (a ``timeout``, shell or CI step wrapping
    it, whose own command line may name ``path``)."""
    import psutil

    path = os.path.realpath(path)
    spared, uid = _self_and_ancestors(), os.getuid()
    found: dict[int, Any] = {}
    for proc in psutil.process_iter(["pid", "cmdline", "uids"]):
        try:
            cmdline, uids = proc.info["cmdline"] or [], proc.info["uids"]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if proc.info["pid"] in spared or uids is None or uids.real != uid:
            continue
        if names_path(cmdline, path) or _holds_file_under(proc.info["pid"], path):
            found[proc.pid] = proc
    for proc in extra:
        if proc.pid not in spared and _alive(proc):
            found.setdefault(proc.pid, proc)
    return list(found.values())


def processes_mentioning(text: str) -> list:
    """This user's processes whose command line contains ``text`` anywhere (a broad check that nothing of a
    kind is left, e.g. ``vo-doctor-``); to act on a session use :func:`session_processes`."""
    return _own_processes(lambda cmdline: text in " ".join(cmdline))


def listening_addresses(proc: subprocess.Popen, ray_marker: Optional[str]) -> list[str]:
    """``ip:port (process name)`` of every TCP socket the run listens on: its process group and Ray session."""
    import psutil

    found = set()
    for p in _run_processes(proc, ray_marker):
        try:
            name = p.name()
            conns = p.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found |= {f"{c.laddr.ip}:{c.laddr.port} ({name})" for c in conns if c.status == psutil.CONN_LISTEN}
    return sorted(found)


SHM_DIR = "/dev/shm"


def _run_processes(proc: subprocess.Popen, ray_marker: Optional[str]) -> list:
    """The run's live processes: ``proc``, its descendants and its Ray session's (by ``ray_marker``)."""
    import psutil

    procs = []
    try:
        procs = [psutil.Process(proc.pid), *_descendants([proc.pid])]
    except psutil.NoSuchProcess:
        pass
    if ray_marker:
        procs += session_processes(ray_marker)
    return list({p.pid: p for p in procs}.values())


def _mapped_shared_memory(pid: int | str) -> set[str]:
    """The ``/dev/shm`` files process ``pid`` has mapped (``/proc/<pid>/maps``; unlinked ones left out: nothing is
    left behind of those); empty if it ended meanwhile or is not ours to read."""
    mapped = set()
    try:
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").partition(f" {SHM_DIR}/")[2]
                if path and not path.endswith(" (deleted)"):
                    mapped.add(f"{SHM_DIR}/{path}")
    except OSError:
        pass
    return mapped


def held_shared_memory(proc: subprocess.Popen, ray_marker: Optional[str]) -> list[str]:
    """Files under ``/dev/shm`` that the run's processes have mapped (``/proc/<pid>/maps``): POSIX shared
    memory (``psm_*``, ``verl_weights_*``) and named semaphores (``sem.*``)."""
    return sorted(set().union(*(_mapped_shared_memory(p.pid) for p in _run_processes(proc, ray_marker))))


# Names of the /dev/shm files a run's processes create: Python multiprocessing's named semaphores (vLLM's
# spawned engine), vLLM's engine queues, verl's weight buffers (cpu/vllm_shims.py, docs/vllm_cpu.md).
RUN_SHM_PREFIXES = ("sem.mp-", "psm_", "verl_weights_")


def shared_memory_listing() -> set[str]:
    """The files under ``/dev/shm`` now."""
    try:
        return {f"{SHM_DIR}/{name}" for name in os.listdir(SHM_DIR)}
    except OSError:
        return set()


def _mapped_inodes(pid: int | str) -> set[tuple[str, int]]:
    """(device, inode) of every ``/dev/shm`` file process ``pid`` maps, unlinked names included: glibc maps a named
    semaphore under a temporary name (``/dev/shm/sem.XXXXXX (deleted)``) before linking it as ``sem.<name>``, so
    only the inode ties a semaphore in use to its holder. Empty if the process ended or is not ours to read."""
    found = set()
    try:
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith(f"{SHM_DIR}/"):
                    found.add((fields[3], int(fields[4])))
    except (OSError, ValueError):
        pass
    return found


def _inode(path: str) -> Optional[tuple[str, int]]:
    """``path``'s (device as /proc/<pid>/maps writes it, inode), or None if it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}", st.st_ino


def mapped_anywhere() -> set[tuple[str, int]]:
    """The (device, inode) of every ``/dev/shm`` file some live process of this machine (that we may read) maps."""
    return set().union(*(_mapped_inodes(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()))


class SharedMemoryWatch:
    """The ``/dev/shm`` files a run's processes map, recorded while it runs (:meth:`poll`, from a thread): the
    only files :func:`orphaned_since` may hand to the run's clean-up, so another run's are never among them."""

    def __init__(self) -> None:
        self.inodes: set[tuple[str, int]] = set()

    def poll(self, proc: subprocess.Popen, ray_marker: Optional[str]) -> None:
        for p in _run_processes(proc, ray_marker):
            self.inodes |= _mapped_inodes(p.pid)


def orphaned_since(before: set[str], owned: Optional[set[tuple[str, int]]] = None) -> list[str]:
    """Files of :data:`RUN_SHM_PREFIXES` created under ``/dev/shm`` since ``before`` (a listing) that no live
    process maps (by inode: a semaphore in use is mapped by its holder under a temporary name): what a run
    left once its processes are gone. With ``owned`` (:attr:`SharedMemoryWatch.inodes`), only files the run's
    own processes mapped: another run's, even one it left itself, is never taken."""
    new = {p for p in shared_memory_listing() - before if os.path.basename(p).startswith(RUN_SHM_PREFIXES)}
    if not new:
        return []
    inodes = {p: _inode(p) for p in new}
    mapped = mapped_anywhere()
    return sorted(
        p for p, ino in inodes.items() if ino is not None and ino not in mapped and (owned is None or ino in owned)
    )


def remove_leftover_files(paths: Sequence[str]) -> list[str]:
    """Unlink those of ``paths`` that still exist (the run's shared memory once its processes are gone);
    returns the ones removed."""
    removed = []
    for path in paths:
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


def kill_process_tree(proc: subprocess.Popen, ray_marker: Optional[str], grace_s: float = 10.0) -> list[int]:
    """End the run: its process group and every process of its Ray session, together (SIGTERM, then SIGKILL).

    Ray's GCS/raylet/workers are found by the run's own temp dir in their command line, so other Ray
    clusters on the machine are untouched; their descendants too, found before anything is ended (vLLM's
    engine processes are children of a Ray worker, without the temp dir in their command line: once the
    worker is gone they would live on, orphaned, holding their ``/dev/shm`` segments). Returns the pids
    that had to be killed.
    """
    import psutil

    killed: list[int] = []
    session = session_processes(ray_marker) if ray_marker else []
    descendants = _descendants([proc.pid] + [p.pid for p in session])
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        # The Ray session at the same time, not after the driver: verl's trainer is a Ray actor outside the
        # driver's process group, and it went on training while the driver shut Ray down (a Ctrl-C'd demo
        # trained three more steps and saved their checkpoints).
        for child in session + descendants:
            with contextlib.suppress(psutil.Error):
                child.terminate()
                killed.append(child.pid)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=grace_s)
        killed.append(proc.pid)
    leftovers = session_processes(ray_marker) if ray_marker else []
    seen = {p.pid for p in leftovers}
    leftovers += [p for p in descendants if p.pid not in seen and _alive(p)]
    end_processes(leftovers, grace_s)
    killed += [p.pid for p in leftovers if p.pid not in killed]
    return killed


def _descendants(pids: Sequence[int]) -> list:
    """The live descendants of ``pids`` (psutil processes), found now."""
    import psutil

    found: dict[int, object] = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(pid).children(recursive=True):
                found.setdefault(child.pid, child)
    return [p for p in found.values() if p.pid not in pids]


def _alive(proc) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def end_processes(procs: Sequence, grace_s: float = 10.0) -> None:
    """SIGTERM each of ``procs`` (psutil processes), SIGKILL those still alive after ``grace_s``, and wait. A zombie
    (ended, not yet reaped by a parent that is not this process) counts as ended."""
    import psutil

    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    alive = _wait_ended(procs, grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    _wait_ended(alive, grace_s)


def _wait_ended(procs: Sequence, timeout: float) -> list:
    """Wait up to ``timeout`` until none of ``procs`` is alive (:func:`_alive`); the ones still alive."""
    import time

    import psutil

    deadline = time.monotonic() + timeout
    alive = list(procs)
    while alive:
        _, alive = psutil.wait_procs(alive, timeout=0.2)  # reaps this process's own children
        alive = [p for p in alive if _alive(p)]
        if time.monotonic() >= deadline:
            break
    return alive


def spawn(
    command: Sequence[str], env: dict[str, str], cwd: Optional[str], pass_fds: Sequence[int] = ()
) -> subprocess.Popen:
    """Start ``command`` in its own session (killable as a group), stdout+stderr merged into one pipe."""
    return subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        text=True,
        errors="replace",
        start_new_session=True,
        pass_fds=tuple(pass_fds),
    )


def run_captured(
    command: Sequence[str], *, env: dict[str, str], timeout: float, cwd: Optional[str] = None
) -> tuple[Optional[int], str]:
    """Run ``command`` in its own session with stdout+stderr captured.

    Returns (exit code, output); on timeout the whole process group is killed and the exit code is
    None (the caller says what hung).
    """
    proc = spawn(command, env, cwd)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return None, output
    return proc.returncode, output


class LockHeld(RuntimeError):
    """The lock is held by a live process (``holder``: the PID its file names)."""

    def __init__(self, path: Path, holder: str):
        super().__init__(f"{path} is held by PID {holder}")
        self.path = path
        self.holder = holder


class ExclusiveLock:
    """An exclusive ``flock`` on ``path``, whose file names the holder's PID.

    The kernel drops the lock when its holders exit, so the lock of a dead process is taken over. A
    subprocess that inherits the locked file (``fd``, in ``pass_fds``) keeps it held while it lives.
    """

    def __init__(self, path: Path):
        self.path = path
        self.fd: Optional[int] = None

    def acquire(self) -> "ExclusiveLock":
        """Take the lock or raise :class:`LockHeld` (a live holder) or ``OSError`` (the file cannot be opened)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise LockHeld(self.path, holder) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # the file stays: the next run takes the unheld lock over
            self.fd = None


class Interrupt(BaseException):
    """SIGINT/SIGTERM in the main thread (a BaseException, like KeyboardInterrupt)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class InterruptSignals:
    """Turn the first SIGINT/SIGTERM into :class:`Interrupt` and ignore repeats while the run cleans up.

    Without it SIGTERM ends the caller at once and leaves its subprocess (in its own session) running. Only
    in the main thread (elsewhere Python cannot set signal handlers and the caller owns signals).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}
        self.received: Optional[int] = None

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is None:
            self.received = signum
            raise Interrupt(signum)

    def __enter__(self) -> "InterruptSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self.previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


# --------------------------------------------------------------- a run's temp dir and its owner

OWNER_NAME = "owner"  # in a run's temp dir: "<pid> <start time>" of the process that created it


def _start_time(pid: int) -> Optional[float]:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


# Ray makes its temp dir mode 0777 (shared between users); ours are private dirs that hold Ray's in this subdir,
# so another local user cannot reach a run's or a cluster's files (tokens, logs, sockets) through it.
RAY_SUBDIR = "ray"


def ray_dir_in(path: str | os.PathLike) -> str:
    """The dir Ray uses (``_temp_dir``) inside our private dir ``path`` (:data:`RAY_SUBDIR`)."""
    return str(Path(path) / RAY_SUBDIR)


def make_owned_temp_dir(prefix: str, parent: str = "/tmp") -> str:
    """A new temp dir (``mkdtemp``) with an :data:`OWNER_NAME` file naming this process (PID and start time)."""
    import tempfile

    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    Path(path, OWNER_NAME).write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
    return path


def owner_alive(path: str | os.PathLike) -> Optional[bool]:
    """Whether the process that created ``path`` (:func:`make_owned_temp_dir`) still runs; None if unknown
    (no readable owner file). A PID reused by another process counts as dead (its start time differs)."""
    try:
        pid_text, _, started = Path(path, OWNER_NAME).read_text().split("\n")[0].partition(" ")
        pid, started_at = int(pid_text), float(started)
    except (OSError, ValueError):
        return None
    now = _start_time(pid)
    return now is not None and abs(now - started_at) < 1.0


def remove_dead_owners_dirs(prefix: str, parent: str = "/tmp", grace_s: float = 10.0) -> list[str]:
    """Remove the temp dirs ``parent/prefix*`` of runs that were killed (SIGKILL leaves them): those whose
    owner process is dead. That run's orphans are ended first (SIGTERM, SIGKILL after ``grace_s``): the
    processes naming such a dir in their command line and those holding a file under it open
    (:func:`dir_processes`), i.e. Ray's ``DashboardAgent`` and ``RuntimeEnvAgent``, which Ray retitles and which
    outlive their raylet by minutes, reparented to init. The dir is removed only once none of them lives. A dir
    without an owner file, or not ours to remove, is left alone. Returns the dirs removed."""
    import shutil

    removed = []
    for path in sorted(Path(parent).glob(f"{prefix}*")):
        try:
            if not path.is_dir() or path.is_symlink() or path.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        if owner_alive(path) is not False:
            continue
        orphans = dir_processes(str(path))
        end_processes(orphans, grace_s)
        if any(_alive(p) for p in orphans):  # not ours to end after all: its files stay with it
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(str(path))
    return removed
