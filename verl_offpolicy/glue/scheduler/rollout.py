"""The overlapped mode's rollout: a standalone replica pool fed through verl's checkpoint-engine API.

With ``actor_rollout_ref.hybrid_engine=false`` the ``offpolicy`` trainer (:mod:`.overlapped`) generates
on rollout replicas that have a resource pool of their own (verl's ``RolloutReplica.init_standalone``),
so batch B_t is generated while the trainer trains earlier steps. :class:`StandaloneRollout` owns
those replicas and the ``CheckpointEngineManager`` that pushes the trainer's weights to them with the
configured backend (verl's ``nccl``/``nixl``/... on GPUs; ``cpu_mailbox`` on the CPU path), and
measures the replicas' busy time where the backend's server reports it.

:func:`observed_versions` / :func:`check_observed_version` read the weights version the rollout
reports for every trajectory (verl stores the server's ``global_steps`` as the trajectory's
``min_global_steps``/``max_global_steps`` tags) and fail the run when it is not the scheduled one.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Iterable

import ray
from verl.checkpoint_engine import CheckpointEngineManager
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.rollout.llm_server import LLMServerManager

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))


# Fault injection for the negative-control test only (tests/scheduler/test_overlapped.py): when set in the
# trainer's environment, every weight push is tagged ``version + offset``, so the rollout reports
# versions the schedule does not expect and the run must stop at its first step with
# ObservedVersionError. Unset (the default) it changes nothing.
PUSH_VERSION_FAULT_ENV = "VERL_OFFPOLICY_FAULT_PUSH_VERSION_OFFSET"


def push_label(version: int) -> int:
    """The version a weight push tags the rollout with: ``version`` (unless the fault above is injected)."""
    return version + int(os.environ.get(PUSH_VERSION_FAULT_ENV, "0") or 0)


class ObservedVersionError(RuntimeError):
    """The rollout generated a batch at another weights version than the schedule says."""


def observed_versions(tags: Iterable[dict[str, Any]]) -> tuple[int | None, int | None]:
    """(min, max) over trajectories of the weights versions the rollout reported having generated with.

    Each trajectory's tag holds ``min_global_steps``/``max_global_steps``: the first and last version
    its tokens were sampled at (verl's ``LLMServerClient`` copies them from the server's output). A
    tag without them counts as unknown (``None`` is returned if no tag has them).
    """
    lows = [t["min_global_steps"] for t in tags if t.get("min_global_steps") is not None]
    highs = [t["max_global_steps"] for t in tags if t.get("max_global_steps") is not None]
    return (min(lows) if lows else None, max(highs) if highs else None)


def check_observed_version(step: int, scheduled: int, tags: list[dict[str, Any]]) -> tuple[int, int] | None:
    """Raise :class:`ObservedVersionError` unless every trajectory of step ``step`` was generated
    entirely at version ``scheduled``; return the observed (min, max), or None if the rollout backend
    reports no version at all (verl 0.9.1's sglang server does not; vllm, trtllm and hf do)."""
    if not tags:
        raise ObservedVersionError(f"offpolicy scheduler: no trajectory of step {step} to train on")
    reported = [t.get("min_global_steps") is not None and t.get("max_global_steps") is not None for t in tags]
    if not any(reported):
        return None
    if not all(reported):
        raise ObservedVersionError(
            f"offpolicy scheduler: the rollout reported a weights version for {sum(reported)} of the {len(tags)} "
            f"trajectories of step {step} only (expected version {scheduled} for all)"
        )
    low, high = observed_versions(tags)
    if low != scheduled or high != scheduled:
        raise ObservedVersionError(
            f"offpolicy scheduler: step {step} is scheduled to train on a batch generated at version {scheduled}, "
            f"but the rollout reports versions {low}..{high}: weights and schedule are out of step (a weight "
            "push was skipped, repeated or raced with generation); stopping instead of training on it"
        )
    return low, high


class StandaloneRollout:
    """The replicas on their own pool and the checkpoint-engine manager that pushes weights to them."""

    def __init__(self, config, actor_wg):
        self.server_manager: LLMServerManager = LLMServerManager.create(config=config, start_rank=0)
        ce_config = omega_conf_to_dataclass(config.actor_rollout_ref.rollout.checkpoint_engine)
        self.checkpoint_manager = CheckpointEngineManager(
            config=ce_config, actor_wg=actor_wg, replicas=self.server_manager.get_replicas()
        )
        self.version: int | None = None  # the version last pushed
        self.held: set[int] = set()  # every version pushed (what a token may have been sampled by)
        self.pushes = 0  # the schedule's pushes, one per generating version
        self.validation_pushes = 0  # pushes of a step's weights for verl's validation (between scheduled versions)
        self._busy_s = self._read_busy_s()
        self._busy_at = time.perf_counter()

    def client(self, client_cls=None):
        """verl's client of the replicas (``client_cls``: verl's default when None)."""
        return self.server_manager.get_client(client_cls=client_cls)

    def push(self, version: int, *, for_validation: bool = False) -> dict:
        """Push the trainer's current weights, tagged ``version``, to every replica (once per version); counted
        in :attr:`pushes`, or in :attr:`validation_pushes` for a push made only for verl's validation."""
        if self.version == version:
            raise ObservedVersionError(f"offpolicy scheduler: version {version} pushed twice")
        metrics = self.checkpoint_manager.update_weights(push_label(version)) or {}
        self.version = version
        self.held.add(version)
        if for_validation:
            self.validation_pushes += 1
        else:
            self.pushes += 1
        return metrics

    def _read_busy_s(self) -> float | None:
        """Seconds the replicas' servers spent generating (None if a server does not report it)."""
        total = 0.0
        for replica in self.server_manager.get_replicas():
            for server in replica.servers:
                if not hasattr(server, "get_stats"):
                    return None
                try:
                    stats = ray.get(server.get_stats.remote(), timeout=60)
                except Exception:  # noqa: BLE001 - a backend without the call: no metric
                    return None
                if "busy_s" not in stats:
                    return None
                total += float(stats["busy_s"])
        return total

    def busy_fraction(self) -> float | None:
        """Generation time of the replicas that ended since the last call, over the wall time since then (mean
        over replicas). A generation batch counts when it ends, so one interval can exceed 1."""
        busy, now = self._read_busy_s(), time.perf_counter()
        fraction = None
        if busy is not None and self._busy_s is not None and now > self._busy_at:
            replicas = max(1, len(self.server_manager.get_replicas()))
            fraction = (busy - self._busy_s) / (now - self._busy_at) / replicas
        self._busy_s, self._busy_at = busy, now
        return fraction
