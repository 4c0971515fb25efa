"""``verl-offpolicy doctor``: what a fresh process, a fresh Ray worker (or every node of an existing cluster) and
verl's Hydra search path see, each probe in a child process with a timeout that ends it and its Ray session.

The child side of the probes is :mod:`verl_offpolicy.glue.diagnose`; this module starts them and reports.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import threading
from importlib import metadata

from verl_offpolicy.configs import preset_names

# Generous: a fresh process imports torch and verl, a Ray worker also starts a cluster; a busy CI
# machine needs minutes for that (a fixed two-minute limit failed there).
DEFAULT_PROBE_TIMEOUT = 600.0


class ProbeError(RuntimeError):
    """A fresh process (or Ray worker) could not report what it sees; the message is the finding."""


def check_probe_timeout(timeout: float) -> None:
    """``--timeout``: seconds > 0, at most ``threading.TIMEOUT_MAX`` (the longest wait this platform's timers hold;
    above it the wait for the probe raised OverflowError)."""
    if not (math.isfinite(timeout) and 0 < timeout <= threading.TIMEOUT_MAX):
        raise ProbeError(
            f"--timeout must be a number of seconds > 0 and at most {threading.TIMEOUT_MAX:.0f} (the longest wait "
            f"this platform's timers hold), got {timeout:g}"
        )


def _probe_failure(output: str, rc: int | None) -> str:
    """The last error line of a probe's output (its exception), else its exit status."""
    errors = [line.strip() for line in output.splitlines() if ("Error" in line or "Exception" in line) and ":" in line]
    return errors[-1] if errors else f"exit status {rc}"


def fresh_process_state(env: dict[str, str], timeout: float) -> dict:
    """What a process started with ``env`` sees after ``import verl`` alone (``glue/diagnose.py``)."""
    from verl_offpolicy.glue.diagnose import parse_report

    check_probe_timeout(timeout)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "verl_offpolicy.glue.diagnose"],
            env=env,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise ProbeError(
            f"a fresh process did not report within {timeout:g} s: the machine may be overloaded; "
            "rerun with a larger --timeout"
        ) from exc
    report = parse_report(proc.stdout)
    if report is None:
        raise ProbeError(
            f"a fresh `import verl` process failed: {_probe_failure(proc.stdout + proc.stderr, proc.returncode)}"
        )
    return report


def ray_probe_env(env: dict[str, str], temp_dir: str) -> dict[str, str]:
    """The environment of doctor's Ray probe: loopback only, no usage stats, and Ray's session token in the
    probe's own temp dir (0600, removed with it; Ray would write ``~/.ray/auth_token`` world-readable)."""
    from verl_offpolicy.cpu.platform import LOOPBACK_ENV
    from verl_offpolicy.demo.environment import ray_token_env

    env = {**env, **LOOPBACK_ENV, "RAY_USAGE_STATS_ENABLED": "0"}
    return {**env, **ray_token_env(temp_dir, env)}


def _diagnose_in_child(
    args: list[str], env: dict[str, str], timeout: float, ray_marker: str | None, too_slow: str, failed: str
) -> dict:
    """The report of ``python -m verl_offpolicy.glue.diagnose ARGS`` run with ``env``, ended (with the Ray
    session named by ``ray_marker``, if any) within ``timeout`` seconds; ``too_slow`` + the advice and
    ``failed`` + the cause are the :class:`ProbeError` messages of a timeout and of a run without a report."""
    from verl_offpolicy.demo.process import kill_process_tree, spawn
    from verl_offpolicy.glue.diagnose import parse_report

    check_probe_timeout(timeout)
    proc = spawn([sys.executable, "-m", "verl_offpolicy.glue.diagnose", *args], env, None)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise ProbeError(f"{too_slow}; rerun with a larger --timeout (e.g. --timeout {2 * timeout:g})") from exc
    finally:
        kill_process_tree(proc, ray_marker)
    report = parse_report(output)
    if report is None:
        raise ProbeError(f"{failed}: {_probe_failure(output, proc.returncode)}")
    return report


def ray_worker_state(env: dict[str, str], timeout: float) -> dict:
    """What a fresh Ray worker sees, from a private Ray cluster that listens on 127.0.0.1 only.

    Ray runs in a child process with its own temp dir, which also holds its session token: the whole
    session (driver, GCS, raylet, workers) is ended and its directory removed whatever happens, within
    ``timeout`` seconds.
    """
    import shutil
    import tempfile

    # Short (Ray puts unix sockets under it) and unique (its processes are found by it).
    temp_dir = tempfile.mkdtemp(prefix="vo-doctor-", dir="/tmp")
    try:
        return _diagnose_in_child(
            ["--ray", temp_dir],
            ray_probe_env(env, temp_dir),
            timeout,
            temp_dir,
            too_slow=f"the fresh Ray worker did not answer within {timeout:g} s (starting Ray and a worker that "
            "imports "
            "verl): the machine may be overloaded by other jobs",
            failed="Ray could not start a worker",
        )
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


CONNECT_TIMEOUT_S = 10.0  # a TCP connect to the cluster's GCS: answered at once by a live machine, even a loaded one
TOKEN_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")


def check_cluster_reachable(address: str, env: dict[str, str], timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Raise :class:`ProbeError` within seconds if nothing listens at ``address`` (``HOST:PORT``, the cluster's GCS):
    "no cluster at this address" is told apart from a slow cluster before any worker is asked."""
    host, _, port = address.rpartition(":")
    if not port.isdigit() or "://" in address:  # "auto", ray://...: Ray resolves it, nothing to connect to here
        return
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout) as connection:
            answer = None if env.get("RAY_USE_TLS", "0") not in ("", "0") else _first_bytes(connection, timeout)
    except OSError as exc:
        raise ProbeError(
            f"no Ray cluster at {address}: {exc.strerror or exc} (nothing listens there; is the address the one "
            "`cluster start` or `ray start --head` printed?)"
        ) from None
    if answer is not None and not _is_http2_settings(answer):
        said = answer.splitlines()[0][:60].decode("latin-1") if answer.strip() else "nothing"
        raise ProbeError(
            f"not a Ray cluster at {address}: the server there answered {said!r}, not the gRPC (HTTP/2) of a Ray GCS; "
            "is the address the one `cluster start` or `ray start --head` printed (the GCS port, 6379 by default)?"
        )


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HTTP2_SETTINGS = 0x04  # the frame type a gRPC server sends first (RFC 9113, 3.4: the server connection preface)


def _first_bytes(connection: socket.socket, timeout: float) -> bytes:
    """The first bytes the server at ``connection`` answers to an HTTP/2 client preface (``b""`` if it closes or
    says nothing within ``timeout``)."""
    connection.settimeout(timeout)
    try:
        connection.sendall(HTTP2_PREFACE)
        return connection.recv(64)
    except OSError:
        return b""


def _is_http2_settings(data: bytes) -> bool:
    """Whether ``data`` opens with an HTTP/2 SETTINGS frame header (9 bytes: length, type, flags, stream 0)."""
    return len(data) >= 9 and data[3] == HTTP2_SETTINGS and data[5:9] == b"\x00\x00\x00\x00"


def cluster_run_problems(address: str, env: dict[str, str], env_vars: dict[str, str], timeout: float) -> list[str]:
    """What keeps a run joining the cluster at ``address`` from running, per node: a node whose fresh worker
    (with the job's runtime_env variables ``env_vars``) lacks verl-offpolicy, named as ``ray status`` shows it.
    A node with neither CPUs nor GPUs hosts none of verl's workers (each asks for a CPU or a GPU) and is left to
    ``doctor --address``."""
    from verl_offpolicy.glue.diagnose import PROBE_ENV_VARS

    nodes = cluster_worker_states({**env, PROBE_ENV_VARS: json.dumps(env_vars)}, address, timeout)
    problems = []
    for node in nodes:
        if not node["resources"].get("CPU") and not node["resources"].get("GPU"):
            continue
        state = node["state"]
        missing = [f"{kind} '{name}'" for kind, name, ok in state.get("names", []) if not ok]
        why = state.get("problem") or (f"missing {', '.join(missing)}" if missing else None)
        if why:
            problems.append(f"{node_label(node)}: {why}")
    return problems


def _token_hint(env: dict[str, str]) -> str:
    missing = [name for name in TOKEN_VARIABLES if not env.get(name)]
    if not missing:
        return ""
    return (
        f"; this environment lacks {', '.join(missing)}: a cluster with token authentication (every "
        "`verl-offpolicy cluster start` cluster) refuses a driver without them, so export the values `cluster "
        "start` printed"
    )


def cluster_worker_states(env: dict[str, str], address: str, timeout: float) -> list[dict]:
    """What a fresh Ray worker on each node of the existing cluster at ``address`` sees
    (``diagnose._cluster_state``), from a driver process that joins it with ``env`` (the user's Ray token
    settings, as for ``demo --ray-address``) and is ended, alone, after ``timeout`` seconds: the cluster is
    the user's and is left running."""
    from verl_offpolicy.cpu.platform import LOOPBACK_ENV

    check_cluster_reachable(address, env)
    hint = _token_hint(env)
    report = _diagnose_in_child(
        ["--cluster", address],
        {**env, **LOOPBACK_ENV, "RAY_USAGE_STATS_ENABLED": "0"},
        timeout,
        None,
        too_slow=f"the Ray workers of the cluster at {address} did not all answer within {timeout:g} s (a worker on "
        f"each node imports verl): a node may be overloaded{hint}",
        failed=f"could not probe the Ray cluster at {address}{hint}",
    )
    return report["nodes"]


_STANDARD_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def node_label(node: dict) -> str:
    """A node as a user finds it in ``ray status``: its id (start), address and custom resources."""
    custom = sorted(
        k
        for k in node["resources"]
        if k not in _STANDARD_RESOURCES and not k.startswith(("node:", "accelerator_type:"))
    )
    return f"node {node['node_id'][:12]} at {node['ip']}" + (f" ({', '.join(custom)})" if custom else "")


def version_problems(label: str, versions: dict, here: dict) -> list[str]:
    """``label``: a version of :data:`~verl_offpolicy.glue.diagnose.VERSIONED` on the node that differs from
    the one installed ``here`` (where doctor runs, hence where the job is submitted from)."""
    return [
        f"{label}: {dist} {versions.get(dist) or 'not installed'} on the node, {here[dist] or 'not installed'} here; "
        "install the same version on every node"
        for dist in here
        if versions.get(dist) != here[dist]
    ]


STORAGE_UNITS_KEY = "transfer_queue.backend.SimpleStorage.num_data_storage_units"
STORAGE_NODE_KEY = "transfer_queue.backend.SimpleStorage.required_node_resource"


def storage_placement_problems(label: str, resources: dict) -> list[str]:
    """``label``: a node without a CPU, where verl's TransferQueue may place a storage unit it can never start.

    TransferQueue's SimpleStorage (``transfer_queue.utils.common.get_node_round_robin_scheduling_strategies``)
    deals its storage units round-robin over every alive node, by node id, with hard node affinity, and each
    unit is an actor needing 1 CPU: a unit dealt to a node with no CPU (a head node started with
    ``--num-cpus=0``, say) stops the run at start-up with ``ActorUnschedulableError``, on some runs and not others.
    """
    if resources.get("CPU", 0) >= 1:
        return []
    return [
        f"{label}: no CPU, and verl's TransferQueue deals its storage units ({STORAGE_UNITS_KEY}, 1 CPU each) "
        "round-robin over every alive node with hard node affinity, so a unit dealt to this node never starts "
        "(ActorUnschedulableError at start-up); give every node a CPU, or add "
        f"+{STORAGE_NODE_KEY}=<a custom resource that only nodes with CPUs have> to the run"
    ]


def _cluster_problems(address: str, timeout: float) -> list[str]:
    """Print and return the findings of every node of the cluster at ``address``."""
    from verl_offpolicy.glue.diagnose import installed_versions

    here, problems = installed_versions(), []
    nodes = cluster_worker_states(dict(os.environ), address, timeout)
    for index, node in enumerate(nodes):
        label = node_label(node)
        problems += _print_registry(f"Ray worker on {label} ({index + 1} of {len(nodes)})", node["state"])
        versions = node["state"].get("versions", {})
        print("  versions: " + ", ".join(f"{d} {versions.get(d) or 'not installed'}" for d in here))
        problems += version_problems(label, versions, here)
        for problem in storage_placement_problems(label, node["resources"]):
            print(f"  FAILED: {problem}")
            problems.append(problem)
    return problems


def _print_registry(where: str, report: dict) -> list[str]:
    problems = []
    print(f"\n[{where}]")
    if report["problem"]:
        print(f"  FAILED: {report['problem']}")
        problems.append(f"{where}: {report['problem']}")
    for kind, name, ok in report["names"]:
        print(f"  {'ok ' if ok else 'MISSING'} {kind:14s} {name}")
    for found in report.get("collisions", []):  # every one is a finding: two packages claim one name
        print(f"  COLLISION {found['kind']:14s} {found['name']}: {found['message']}")
        problems.append(f"{where}: {found['message']}")
    return problems


def doctor(args: argparse.Namespace) -> int:
    problems: list[str] = []
    print("versions:")
    for dist in ("verl-offpolicy", "verl", "torch", "ray", "hydra-core", "transformers", "TransferQueue"):
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            version = "not installed"
            if dist in ("verl", "torch", "ray", "hydra-core"):
                problems.append(f"{dist} is not installed")
        print(f"  {dist:16s} {version}")
    print(f"  {'python':16s} {sys.version.split()[0]}")
    from verl_offpolicy.verl_pin import STRICT_ENV, TESTED_VERL, strict, untested_verl

    untested = untested_verl()
    if untested and strict():
        problems.append(f"{untested} ({STRICT_ENV}=1)")
    print(f"  tested on verl {TESTED_VERL}" + (f"; WARNING: {untested}" if untested else ": installed"))

    # Both in fresh processes with this environment: this process would register everything itself.
    # With --address, a worker on every node of that cluster instead of a private one.
    fresh = "fresh process (`import verl` alone, as every verl process starts)"
    probes = [(fresh, lambda: _print_registry(fresh, fresh_process_state(dict(os.environ), args.timeout)))]
    if args.address:
        probes.append((f"Ray cluster at {args.address}", lambda: _cluster_problems(args.address, args.timeout)))
    else:
        probes.append(
            (
                "fresh Ray worker",
                lambda: _print_registry("fresh Ray worker", ray_worker_state(dict(os.environ), args.timeout)),
            )
        )
    for where, probe in probes:
        try:
            problems += probe()
        except Exception as exc:  # noqa: BLE001 - reported as a doctor finding
            message = str(exc) if isinstance(exc, ProbeError) else f"{type(exc).__name__}: {exc}"
            print(f"\n[{where}]\n  FAILED: {message}")
            problems.append(f"{where}: {message}")

    from verl_offpolicy.glue.compose import compose_preset

    print("\n[Hydra search path of verl.trainer.main_ppo]")
    for config_name in ("ppo_trainer", "offpolicy_trainer"):
        for name in preset_names():
            try:
                cfg = compose_preset(name, config_name)
                line = f"{cfg.algorithm.adv_estimator} + {cfg.actor_rollout_ref.actor.policy_loss.loss_mode}"
                ok = True
            except Exception as exc:  # noqa: BLE001 - reported as a doctor finding
                line, ok = f"{type(exc).__name__}: {exc}".splitlines()[0], False
                problems.append(f"preset {name} does not compose with {config_name}: {line}")
            if args.verbose or not ok:
                print(f"  {'ok ' if ok else 'FAILED'} {config_name} {name}: {line}")
        print(f"  {config_name}: {len(preset_names())} presets checked")

    if problems:
        print("\nverl-offpolicy doctor found problems:")
        for p in problems:
            print(f"  - {p}")
        return 1
    print("\nverl-offpolicy doctor: everything is registered and visible.")
    return 0
