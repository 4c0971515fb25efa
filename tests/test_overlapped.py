"""The scheduler's overlapped mode (``trainer.v1.trainer_mode=offpolicy`` + ``hybrid_engine=false``).

Fast tier: the observed-version check on verl's trajectory tags (including the negative control: a
batch the rollout reports at another version fails the run), and the startup validation of the mode.
End to end (e2e, slow): overlapped vs colocated runs of the CPU demo at the same seed train the same
samples with the same versions at every step (each run's trained samples from verl's rollout dumps).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hydra_utils import VALID_SIZES, compose_main_ppo
from verl_offpolicy.glue.overlap import ObservedVersionError, check_observed_version, observed_versions
from verl_offpolicy.glue.validation import OffPolicyConfigError, validate_offpolicy_config

# ------------------------------------------------------------------------------ observed version


def _tags(*versions):
    """Trajectory tags as verl's AgentLoopWorkerTQ writes them (min/max_global_steps from the server)."""
    return [{"status": "success", "global_steps": 9, "min_global_steps": lo, "max_global_steps": hi} for lo, hi in versions]


def test_observed_versions_are_read_from_the_rollouts_tags():
    assert observed_versions(_tags((4, 4), (4, 5), (3, 4))) == (3, 5)
    assert observed_versions([{"status": "success"}]) == (None, None)


def test_a_batch_at_the_scheduled_version_passes():
    assert check_observed_version(step=6, scheduled=4, tags=_tags((4, 4), (4, 4))) == (4, 4)


@pytest.mark.parametrize(
    "versions",
    [((5, 5), (5, 5)), ((4, 4), (4, 5)), ((3, 4),)],
    ids=["whole batch at another version", "one trajectory spans two versions", "older weights"],
)
def test_negative_control_a_wrong_observed_version_fails_loudly(versions):
    with pytest.raises(ObservedVersionError, match="step 6 is scheduled to train on a batch generated at version 4"):
        check_observed_version(step=6, scheduled=4, tags=_tags(*versions))


def test_a_rollout_that_reports_no_version_fails():
    with pytest.raises(ObservedVersionError, match="reported no weights version"):
        check_observed_version(step=1, scheduled=0, tags=[{"status": "success"}])


# ------------------------------------------------------------------------------ startup validation

OVERLAPPED = [
    "actor_rollout_ref.hybrid_engine=false",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
]


def _validate(preset, extra):
    validate_offpolicy_config(compose_main_ppo("ppo_trainer", [f"+algorithm={preset}", *VALID_SIZES, *extra]))


@pytest.mark.slow
def test_overlapped_mode_validation():
    _validate("opmd", OVERLAPPED + ["algorithm.offpolicy.sync_offset=1"])
    with pytest.raises(OffPolicyConfigError, match="cannot provide algorithm.offpolicy.ratio_anchor=behaviour"):
        _validate("rec_oneside_nois", OVERLAPPED)
    _validate("rec_oneside_nois", OVERLAPPED + ["algorithm.offpolicy.ratio_anchor=rollout", "actor_rollout_ref.rollout.calculate_log_probs=true"])
    with pytest.raises(OffPolicyConfigError, match="naive only serves a colocated rollout"):
        _validate("opmd", OVERLAPPED[:-1])
    with pytest.raises(OffPolicyConfigError, match=r"set actor_rollout_ref.rollout.nnodes >= 1 \(got 0\)"):
        _validate("opmd", [OVERLAPPED[0], OVERLAPPED[-1]])
