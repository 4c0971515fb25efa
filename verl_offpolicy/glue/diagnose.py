"""What a verl process sees of verl-offpolicy after ``import verl`` alone (for ``check`` and ``doctor``).

A Ray worker of ``main_ppo`` gets verl-offpolicy only through verl's ``verl.plugins`` entry point,
loaded by ``import verl``. :func:`plugin_state` reports, without registering anything itself, whether
that happened in this process, what is registered and, if something is missing, why and how to fix
it (``VERL_USE_EXTERNAL_PLUGINS``, a broken entry point, a module that cannot import). The checks
run it in a *fresh* process with the workers' environment (``python -m verl_offpolicy.glue.diagnose``)
and, for ``doctor``, in a fresh Ray worker: the checking process itself has registered everything on
its own and would say "ok" where the workers fail.

Only the standard library is imported at module level: the report must work from a broken install.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from verl_offpolicy.glue.plugin_setting import (  # noqa: F401 - re-exported: the names the report uses
    ENTRY_POINT_GROUP,
    ENTRY_POINT_NAME,
    MODULES_ENV,
    PLUGIN_MODULE,
    PLUGINS_ENV,
    REGISTER_MODULE,
    plugin_setting_problem,
)

REPORT_PREFIX = "VERL_OFFPOLICY_STATE "


def _entry_point():
    from importlib.metadata import entry_points

    return next((ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == ENTRY_POINT_NAME), None)


def _why_not_loaded() -> str:
    """Why ``import verl`` did not import our plugin module in this process, with the fix."""
    problem = plugin_setting_problem(os.environ)
    if problem:
        return problem
    try:
        entry_point = _entry_point()
    except Exception as exc:  # noqa: BLE001 - broken metadata is a finding
        return f"reading the installed entry points failed ({type(exc).__name__}: {exc}); reinstall verl-offpolicy"
    if entry_point is None:
        return (
            f"no '{ENTRY_POINT_NAME}' entry point in the '{ENTRY_POINT_GROUP}' group of the installed packages "
            "(verl-offpolicy's metadata is missing or stale); reinstall it (pip install -e . from a checkout, or "
            "its built wheel)"
        )
    try:
        entry_point.load()  # what verl did, but verl logged the error at DEBUG level only
    except Exception as exc:  # noqa: BLE001 - the cause is the finding
        return (
            f"verl's entry point {ENTRY_POINT_NAME} = {entry_point.value} failed to load: {type(exc).__name__}: {exc}; "
            "reinstall verl-offpolicy (pip install -e . from a checkout, or its built wheel)"
        )
    return (
        f"`import verl` did not load the entry point {ENTRY_POINT_NAME} = {entry_point.value}; reinstall verl-offpolicy"
    )


# The distributions whose versions a node must share with the driver (doctor --address).
VERSIONED = ("verl-offpolicy", "verl")


def installed_versions() -> dict[str, str | None]:
    """The installed version of each of :data:`VERSIONED` in this process's environment (None: not installed)."""
    from importlib import metadata

    found: dict[str, str | None] = {}
    for dist in VERSIONED:
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    return found


def plugin_state() -> dict[str, Any]:
    """After ``import verl`` alone: ``{"problem": str|None, "names": [[kind, name, registered], ...],
    "collisions": [registration.collisions() entries], "versions": installed_versions()}``.

    Never registers anything itself: a process that registered on its own (``check``, ``doctor``)
    must not report what its workers will not have.
    """
    import verl  # noqa: F401 - loads the verl.plugins entry points, as in every verl process

    plugin = sys.modules.get(PLUGIN_MODULE)
    problem = getattr(plugin, "LOAD_FAILURE", None) if plugin is not None else None
    names: list[list[Any]] = []
    try:
        from verl_offpolicy.glue import registration
    except Exception as exc:  # noqa: BLE001 - reported, with the cause
        from verl_offpolicy.glue.broken_install import import_failure_message

        problem = problem or import_failure_message("verl_offpolicy.glue.registration", exc)
        return {"problem": problem, "names": names, "versions": installed_versions()}
    for entry in registration.expected_names():
        try:
            # The lookup imports verl's registry module, which runs our deferred registration into it,
            # if (and only if) the plugin installed it.
            present = bool(entry.lookup(entry.name))
        except Exception as exc:  # noqa: BLE001 - a lookup that raises counts as missing, with why
            present = False
            problem = problem or f"looking up {entry.kind} '{entry.name}' raised {type(exc).__name__}: {exc}"
        names.append([entry.kind, entry.name, present])
    if plugin is None:
        problem = _why_not_loaded()
    elif problem is None and registration._failure is not None:
        problem = f"verl-offpolicy failed to register its names: {registration._failure}"
    if problem is None and not all(present for _, _, present in names):
        problem = "some names are missing from verl's registries although registration reported no error"
    found: list[dict] = []
    if plugin is not None:
        try:
            found = registration.collisions()
        except Exception as exc:  # noqa: BLE001 - reported, with the cause
            problem = problem or f"checking name collisions raised {type(exc).__name__}: {exc}"
    return {"problem": problem, "names": names, "collisions": found, "versions": installed_versions()}


def parse_report(output: str) -> dict[str, Any] | None:
    """The report a ``python -m verl_offpolicy.glue.diagnose`` run printed, or None."""
    for line in reversed(output.splitlines()):
        if line.startswith(REPORT_PREFIX):
            return json.loads(line[len(REPORT_PREFIX) :])
    return None


def _ray_worker_state(temp_dir: str) -> dict[str, Any]:
    """:func:`plugin_state` in a fresh Ray worker of a private Ray cluster on 127.0.0.1 (the caller
    bounds the time and sets ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, which Ray reads at import)."""
    import ray

    ray.init(
        num_cpus=1,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _node_ip_address="127.0.0.1",
        _temp_dir=os.path.join(temp_dir, "ray"),  # Ray makes its dir 0777: inside the probe's private one
    )
    # Imported by name, so that the worker imports this module (a function of __main__ would be pickled by value).
    from verl_offpolicy.glue.diagnose import plugin_state as worker_state

    try:
        return ray.get(ray.remote(worker_state).remote())
    finally:
        ray.shutdown()


PROBE_ENV_VARS = "VERL_OFFPOLICY_PROBE_ENV_VARS"  # JSON: the runtime_env variables of the job being checked


def _cluster_state(address: str) -> dict[str, Any]:
    """:func:`plugin_state` in a fresh Ray worker on every alive node of the existing cluster at ``address``
    (a task pinned to the node, needing no CPU, so a node busy with a job or without CPUs still answers):
    ``{"nodes": [{"node_id", "ip", "resources", "state"}, ...]}``. Joins as a driver; starts nothing else."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from verl_offpolicy.glue.diagnose import plugin_state as worker_state

    # The job's runtime_env variables (the startup check of a run joining the cluster): its workers see them too.
    env_vars = json.loads(os.environ.get(PROBE_ENV_VARS, "{}"))
    ray.init(
        address=address,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": env_vars} if env_vars else None,
    )
    try:
        nodes = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: n["NodeID"])
        probe = ray.remote(worker_state)
        refs = [
            probe.options(
                num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ).remote()
            for n in nodes
        ]
        states = ray.get(refs)
        return {
            "nodes": [
                {
                    "node_id": n["NodeID"],
                    "ip": n.get("NodeManagerAddress"),
                    "resources": n.get("Resources", {}),
                    "state": state,
                }
                for n, state in zip(nodes, states)
            ]
        }
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    """``python -m verl_offpolicy.glue.diagnose [--ray TEMP_DIR | --cluster ADDRESS]``: print the state as one
    JSON line."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--ray"]:
        state = _ray_worker_state(argv[1])
    elif argv[:1] == ["--cluster"]:
        state = _cluster_state(argv[1])
    else:
        state = plugin_state()
    print(REPORT_PREFIX + json.dumps(state), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
