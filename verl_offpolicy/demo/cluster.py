"""A Ray cluster of several nodes on this host, started before a run, as a user's cluster exists before
their job: ``verl-offpolicy cluster start|stop``.

Each node is its own raylet with its own fake GPUs and CPUs (and a custom resource ``vo_node_<i>``);
the first is the head (GCS). ``main_ppo`` joins with ``+ray_kwargs.ray_init.address=<address>`` (the
demo: ``--ray-address``), as on a real cluster, and verl's resource pools land on the nodes that have the
GPUs they ask for.

The nodes are made by Ray's own tool for several nodes on one host (``ray.cluster_utils.Cluster``) in a
server process (``python -m verl_offpolicy.demo.cluster serve DIR``) that holds them until SIGTERM:
``ray start --address`` would need ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` on, and then Ray binds its GCS,
raylets and agents to every interface and rewrites 127.0.0.1 to the machine's address. With it off
(:data:`verl_offpolicy.cpu.platform.LOOPBACK_ENV`), every process of every node listens on 127.0.0.1.

The cluster's dir (``/tmp/vo-cluster-*``, holding a ``vo-cluster`` marker file) records what :meth:`LocalCluster.stop`
ends: the server's pid and start time (``server.json``, written when it is spawned; ``cluster.json`` once every
node is up) and the Ray session, whose temp dir is the dir's ``ray`` subdir. ``stop`` resolves the dir it is given
to its real path, acts only on such a dir of this user's, and ends the recorded server, its descendants and this
user's processes of that Ray session (naming its temp dir in their command line, or holding a file under it open:
the agents Ray retitles ``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``), never another Ray cluster of the
machine (``ray stop`` would end them all), nor the process that runs ``stop`` or one of its ancestors (``timeout``
or a shell whose command line names the dir), nor a process that merely names the dir. The dir is removed only
once none of the cluster's processes lives. The cluster's Ray token is in that dir (mode 0600); a process that
joins needs :meth:`LocalCluster.env`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from verl_offpolicy.cpu.platform import LOOPBACK_ENV
from verl_offpolicy.demo.environment import ray_token_env
from verl_offpolicy.demo.process import (
    dir_processes,
    end_processes,
    make_owned_temp_dir,
    ray_dir_in,
    retry_ray_start,
)

CLUSTER_DIR_PREFIX = "vo-cluster-"
STATE_NAME = "cluster.json"  # in the cluster's dir, written by the server once every node is up
# In the cluster's dir from its creation: what `stop` requires before it ends a process or removes a file.
MARKER_NAME = "vo-cluster"
MARKER_TEXT = (
    "a Ray cluster of `verl-offpolicy cluster start`; `verl-offpolicy cluster stop --dir <this dir>` ends it\n"
)
LOG_NAME = "server.log"
# In the cluster's dir from the server's spawn: {"pid": ..., "started": <its create time>}, what `stop` ends first.
SERVER_NAME = "server.json"
START_TIMEOUT_S = 600.0  # every node up (about 20 s on an idle 2-core machine, minutes under load)
MODULE = "verl_offpolicy.demo.cluster"


class ClusterError(RuntimeError):
    """The cluster did not start (with the end of its server's log), or is not there."""


@dataclass
class NodeSpec:
    """One node: its fake GPUs and logical CPUs, and environment variables of its raylet and workers."""

    gpus: int = 1
    cpus: int = 8
    env: dict[str, str] = field(default_factory=dict)


def join_overrides(address: str) -> list[str]:
    """The ``main_ppo`` overrides that join the Ray cluster at ``address`` instead of starting one (the CPU
    configs size a cluster of their own: on an existing one its nodes' resources decide)."""
    return [
        f"+ray_kwargs.ray_init.address={address}",
        "ray_kwargs.ray_init.num_cpus=null",
        "ray_kwargs.ray_init.num_gpus=null",
    ]


# What a demo run's workers need from its environment (where verl's file logger writes; no download):
# on a cluster the run starts, its workers inherit the driver's environment; on an existing one, only
# what the job's runtime_env gives them.
WORKER_ENV = ("VERL_FILE_LOGGER_PATH", "HF_HUB_OFFLINE", "VLLM_CACHE_ROOT")


def joins_cluster(command: list[str]) -> bool:
    """Whether a ``main_ppo`` command line joins an existing Ray cluster (:func:`join_overrides`)."""
    return any(arg.lstrip("+").startswith("ray_kwargs.ray_init.address=") for arg in command)


def worker_env_overrides(env: dict[str, str]) -> list[str]:
    """The :data:`WORKER_ENV` variables of ``env`` as ``runtime_env`` overrides, for a run joining a cluster."""
    quoted = {key: "'" + env[key].replace("\\", "\\\\").replace("'", "\\'") + "'" for key in WORKER_ENV if key in env}
    return [
        f"+ray_kwargs.ray_init.runtime_env.env_vars.{key}={value}" for key, value in quoted.items()
    ]  # strings, as Ray wants


def node_resource(index: int) -> str:
    """The custom resource node ``index`` has one of (to place a task on it, or to tell nodes apart)."""
    return f"vo_node_{index}"


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


class LocalCluster:
    """The cluster whose dir is ``path`` (``parent/vo-cluster-*``)."""

    def __init__(self, path: str | os.PathLike):
        # the real path: a relative dir given from another working directory, or a symlink to the dir, names the
        # same processes and files as the dir `start` printed
        self.path = Path(os.path.realpath(path))

    @classmethod
    def start(
        cls,
        nodes: list[NodeSpec],
        parent: str = "/tmp",
        timeout: float = START_TIMEOUT_S,
        log: Callable[[str], None] = print,
        base_env: Optional[dict[str, str]] = None,
    ) -> "LocalCluster":
        """Start the server holding ``nodes`` and wait until every node is up (or stop it and raise). The
        server and its nodes start from ``base_env`` (default: this process's environment).

        A node that misses Ray's fixed 30 s start-up wait (a loaded machine) makes the whole cluster start again
        (:func:`~verl_offpolicy.demo.process.retry_ray_start`)."""
        if not nodes:
            raise ClusterError("a cluster needs at least one node")
        base_env = dict(os.environ if base_env is None else base_env)
        return retry_ray_start(
            lambda _: cls._start_once(nodes, parent, timeout, log, base_env), ClusterError, log, "[cluster]"
        )

    @classmethod
    def _start_once(
        cls, nodes: list[NodeSpec], parent: str, timeout: float, log: Callable[[str], None], base_env: dict[str, str]
    ) -> "LocalCluster":
        cluster = cls(make_owned_temp_dir(CLUSTER_DIR_PREFIX, parent))
        (cluster.path / MARKER_NAME).write_text(MARKER_TEXT)
        (cluster.path / "nodes.json").write_text(json.dumps([asdict(n) for n in nodes]))
        env = {**base_env, **LOOPBACK_ENV, "RAY_USAGE_STATS_ENABLED": "0"}
        env.update(_token_env(cluster.path))
        log(f"[cluster] starting {len(nodes)} node(s) in {cluster.path} ...")
        with open(cluster.path / LOG_NAME, "w") as out:
            # its own session: a Ctrl-C of the terminal that started it does not end the cluster; in the cluster's
            # dir: `-m` puts the working directory first on sys.path, and the starting one may hold anything
            server = subprocess.Popen(
                [sys.executable, "-m", MODULE, "serve", str(cluster.path)],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=str(cluster.path),
            )
        _write_json(cluster.path / SERVER_NAME, {"pid": server.pid, "started": _create_time(server.pid)})
        deadline = time.monotonic() + timeout
        while not (cluster.path / STATE_NAME).exists():
            if server.poll() is not None or time.monotonic() > deadline:
                why = (
                    f"exited with {server.returncode}" if server.poll() is not None else f"not up within {timeout:g} s"
                )
                message = f"the cluster {why}; end of {cluster.path / LOG_NAME}:\n{_tail(cluster.path / LOG_NAME)}"
                cluster.stop()
                raise ClusterError(message)
            time.sleep(0.5)
        log(f"[cluster] up: {cluster.address}")
        return cluster

    @property
    def state(self) -> dict:
        try:
            return json.loads((self.path / STATE_NAME).read_text())
        except (OSError, ValueError) as exc:
            raise ClusterError(f"{self.path} holds no running cluster ({STATE_NAME} missing)") from exc

    @property
    def address(self) -> str:
        return self.state["address"]

    def env(self) -> dict[str, str]:
        """What a process joining the cluster needs in its environment: the cluster's Ray token."""
        return _token_env(self.path)

    @property
    def ray_dir(self) -> Path:
        """The cluster's Ray temp dir (its sessions, sockets, logs): the dir's ``ray`` subdir."""
        return Path(ray_dir_in(self.path))

    def server(self):
        """The server process the dir recorded (``server.json``, else ``cluster.json``), as a psutil process, if it
        still runs: the same pid with the same start time (a pid reused by another process is not the server)."""
        import psutil

        for name, pid_key, started_key in (
            (SERVER_NAME, "pid", "started"),
            (STATE_NAME, "server_pid", "server_started"),
        ):
            try:
                record = json.loads((self.path / name).read_text())
                pid, started = int(record[pid_key]), record.get(started_key)
                proc = psutil.Process(pid)
                if started is None or abs(proc.create_time() - float(started)) < 1.0:
                    return proc
            except (OSError, ValueError, KeyError, TypeError, psutil.Error):
                continue
        return None

    def processes(self, extra: list = ()) -> list:
        """This user's live processes of the cluster: the recorded server and its descendants, and the processes of
        its Ray session (:func:`~verl_offpolicy.demo.process.dir_processes` of :attr:`ray_dir`: naming it, or
        holding a file under it open), with ``extra``; never this process nor one of its ancestors."""
        import psutil

        tree = list(extra)
        server = self.server()
        if server is not None:
            tree.append(server)
            with contextlib.suppress(psutil.Error):
                tree += server.children(recursive=True)
        return dir_processes(str(self.ray_dir), extra=tree)

    def check_ours(self) -> None:
        """Raise :class:`ClusterError` naming what is there unless ``path`` is a cluster dir ``cluster start``
        made for this user: a ``vo-cluster-*`` dir, owned by this user, holding the marker file."""
        path = self.path
        if not path.exists():
            raise ClusterError(f"{path} does not exist: no cluster to stop (give the dir `cluster start` printed)")
        if not path.is_dir() or path.is_symlink():
            raise ClusterError(f"{path} is not a directory: not a cluster dir; nothing was stopped")
        if not path.name.startswith(CLUSTER_DIR_PREFIX):
            raise ClusterError(
                f"{path} is not a cluster dir (its name does not start with {CLUSTER_DIR_PREFIX!r}); "
                "nothing was stopped or removed"
            )
        if path.stat().st_uid != os.getuid():
            raise ClusterError(f"{path} belongs to another user (uid {path.stat().st_uid}); nothing was stopped")
        if not (path / MARKER_NAME).is_file():
            raise ClusterError(
                f"{path} has no {MARKER_NAME} file, so `cluster start` did not make it; nothing was "
                f"stopped or removed (its entries: {', '.join(sorted(p.name for p in path.iterdir())[:8]) or 'none'})"
            )

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the recorded server (it shuts its nodes down), end whatever of the cluster is left
        (:meth:`processes`), and remove the dir once none of them lives.

        Only a dir :meth:`check_ours` accepts. Raises :class:`ClusterError` naming the processes, and keeps the
        dir (its token, state and logs), if one of the cluster's processes is still alive."""
        import shutil

        import psutil

        self.check_ours()
        server = self.server()
        tree = []
        if server is not None:
            with contextlib.suppress(psutil.Error):
                tree = [server, *server.children(recursive=True)]  # found before the server ends: orphans then
            # first the server alone (it shuts its nodes down), as processes() lists it: never this process or
            # an ancestor
            end_processes([p for p in self.processes() if p.pid == server.pid], grace_s)
        end_processes(self.processes(tree), 10.0)
        alive = self.processes(tree)
        if alive:
            names = ", ".join(f"{p.pid} ({_name(p)})" for p in alive[:8])
            raise ClusterError(
                f"{len(alive)} process(es) of the cluster still run after SIGKILL: {names}; "
                f"{self.path} is kept (its token, state and logs)"
            )
        shutil.rmtree(self.path, ignore_errors=True)

    def workers_by_node(self) -> dict[int, list[str]]:
        """Node index -> the names of the Ray worker processes running on it now (``ray::WorkerDict``, ...):
        each is a child of its node's raylet, whose resources name the node (:func:`node_resource`). A process that
        ends while it is read is left out."""
        import psutil

        found: dict[int, list[str]] = {}
        for raylet in (p for p in self.processes() if _name(p) == "raylet"):
            try:
                line = " ".join(raylet.cmdline())
                index = next(i for i in range(len(self.state["nodes"])) if f"{node_resource(i)}," in line)
                found[index] = sorted(n for n in map(_name, raylet.children()) if n.startswith("ray::"))
            except (psutil.Error, StopIteration):
                continue
        return found


def _name(proc) -> str:
    import psutil

    try:
        return proc.name()
    except psutil.Error:
        return "?"


def _create_time(pid: int) -> Optional[float]:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _write_json(path: Path, data: dict) -> None:
    """``data`` to ``path`` whole or not at all (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.rename(path)


def _token_env(path: Path) -> dict[str, str]:
    """The cluster's token (created once, mode 0600); the head turns token authentication on by itself, and a
    joining process sends the token only in mode "token"."""
    token = path / "auth_token"
    env = {"RAY_AUTH_TOKEN_PATH": str(token), "RAY_AUTH_MODE": "token"}
    if not token.exists():
        ray_token_env(path, {})
    return env


def serve(path: Path) -> int:
    """The server: start the nodes of ``path/nodes.json``, write the state, hold them until SIGTERM."""
    from ray.cluster_utils import Cluster

    specs = [NodeSpec(**n) for n in json.loads((path / "nodes.json").read_text())]
    # Ray's Cluster writes the head's address to <Ray's default temp dir>/ray_current_cluster whatever temp_dir
    # says, and fails on a machine where /tmp/ray does not exist yet: keep that file in the cluster's own dir
    # (a `ray.init(address="auto")` elsewhere on the machine must not find this cluster either).
    os.environ["RAY_TMPDIR"] = str(path)
    (path / "ray").mkdir(exist_ok=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    cluster = None
    try:
        for index, spec in enumerate(specs):
            args = {
                "num_cpus": spec.cpus,
                "num_gpus": spec.gpus,
                "resources": {node_resource(index): 1},
                "include_dashboard": False,
                "env_vars": spec.env or None,
                "node_ip_address": "127.0.0.1",
            }
            if cluster is None:
                # Ray's temp dir (mode 0777) inside the cluster's private dir
                cluster = Cluster(initialize_head=True, head_node_args={**args, "temp_dir": ray_dir_in(path)})
            else:
                cluster.add_node(**args)
            print(f"node {index} up", flush=True)
        cluster.wait_for_nodes()
        state = {
            "address": cluster.address,
            "nodes": [{"index": i, **asdict(s)} for i, s in enumerate(specs)],
            "server_pid": os.getpid(),
            "server_started": _create_time(os.getpid()),
            "ray_dir": ray_dir_in(path),
        }
        _write_json(path / STATE_NAME, state)
        while not stop:
            time.sleep(0.5)
    finally:
        if cluster is not None:
            cluster.shutdown()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["serve"] or len(sys.argv) != 3:
        print(f"usage: python -m {MODULE} serve DIR", file=sys.stderr)
        sys.exit(2)
    sys.exit(serve(Path(sys.argv[2])))
