"""verl's own asynchronous trainers (``colocate_async``, ``separate_async``) with our presets.

Fast tier: every preset composed on stock ``main_ppo``'s config with each mode is either accepted by
the startup validation or rejected with the reason (expected outcome per preset: the literal table
below, read off the preset files by hand). End to end (e2e): ``rec_oneside_nois`` (bypass mode) trains
under ``separate_async`` on the CPU path (``verl-offpolicy demo``), the rollout on its own pool
(``+cpu_rollout=standalone``: the ``cpu_mailbox`` weight transport); in the extended tier, ``opmd`` under
``colocate_async``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hydra_utils import VALID_SIZES, compose_main_ppo
from tests.jobs import queued_at_start
from tests.scenario_runs import SMALL_DEMO
from verl_offpolicy.configs import preset_names
from verl_offpolicy.glue.validation import OffPolicyConfigError, validate_offpolicy_config

MODES = ("colocate_async", "separate_async")
# Presets whose files set ratio_anchor: behaviour (directly or through offpolicy_shared/rec.yaml).
BEHAVIOUR_ANCHOR = {
    "grpo",
    "opmd_kimi",
    "pmd_mean",
    "pmd_partition",
    "rec_gspo_is",
    "rec_gspo_nois",
    "rec_oneside_is",
    "rec_oneside_nois",
    "rec_oneside_nois_wide",
    "rec_ring_nois",
    "rec_twoside_is",
    "rec_twoside_nois",
    "m2po",
    "topr",
    "topr_group_mean",
    "rec_ring_is",
    "rec_oneside_is_wide",
    "oapl",
}
ON_POLICY = {"agro_onpolicy"}
ACCEPTED = {"agro", "asymre", "grpo_proximal", "opmd", "red_drop", "red_weight", "reinforce", "pairwise_opmd"}
MODE_OVERRIDES = {
    "colocate_async": ["trainer.v1.trainer_mode=colocate_async"],
    "separate_async": [
        "trainer.v1.trainer_mode=separate_async",
        "actor_rollout_ref.hybrid_engine=false",
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        # verl's own preconditions of separate_async (checked at startup): batch = sync step x mini-batch, a
        # checkpoint engine other than naive.
        "trainer.v1.separate_async.parameter_sync_step=1",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
    ],
}


def _config(preset: str, mode: str, extra=()):
    return compose_main_ppo("ppo_trainer", [f"+algorithm={preset}", *VALID_SIZES, *MODE_OVERRIDES[mode], *extra])


def test_the_table_covers_every_preset():
    assert BEHAVIOUR_ANCHOR | ON_POLICY | ACCEPTED == set(preset_names())


# Each preset under one of the two modes, alternating (the check does not depend on the mode beyond its
# name in the message; composing all 2 x 19 takes minutes on 2 cores).
PRESET_MODES = [(p, MODES[i % 2]) for i, p in enumerate(sorted(BEHAVIOUR_ANCHOR | ON_POLICY | ACCEPTED))]


@pytest.mark.slow
@pytest.mark.parametrize("preset, mode", PRESET_MODES)
def test_every_preset_is_accepted_or_rejected_with_the_reason(preset, mode):
    cfg = _config(preset, mode)
    if preset in ACCEPTED:
        validate_offpolicy_config(cfg)
        return
    with pytest.raises(OffPolicyConfigError) as err:
        validate_offpolicy_config(cfg)
    message = str(err.value)
    assert f"trainer.v1.trainer_mode={mode}" in message
    if preset in BEHAVIOUR_ANCHOR:
        assert "cannot provide algorithm.offpolicy.ratio_anchor=behaviour" in message
        assert "ratio_anchor=rollout with algorithm.rollout_correction.bypass_mode=true" in message
    else:
        assert "on_policy=true" in message


@pytest.mark.parametrize("mode", MODES)
def test_behaviour_presets_run_with_the_rollout_or_proximal_anchor(mode):
    rollout = [
        "algorithm.offpolicy.ratio_anchor=rollout",
        "algorithm.rollout_correction.bypass_mode=true",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
    ]
    validate_offpolicy_config(_config("rec_oneside_nois", mode, rollout))
    validate_offpolicy_config(_config("rec_oneside_nois", mode, ["algorithm.offpolicy.ratio_anchor=proximal"]))
    with pytest.raises(OffPolicyConfigError, match="exactly when algorithm.rollout_correction.bypass_mode=true"):
        validate_offpolicy_config(_config("rec_oneside_nois", mode, rollout[:1] + rollout[2:]))
    with pytest.raises(OffPolicyConfigError, match="max_off_policy_threshold"):
        validate_offpolicy_config(_config("opmd", mode, ["algorithm.offpolicy.sync_offset=1"]))


# ------------------------------------------------------------------------------ end to end

STEPS = 3
TIMEOUT = 600
SMALL = SMALL_DEMO  # 4 prompts x 4 samples per step, no validation
DEMO_MODE = {
    "colocate_async": ["trainer.v1.trainer_mode=colocate_async"],
    "separate_async": ["trainer.v1.trainer_mode=separate_async", "+cpu_rollout=standalone"],
}
# rec_oneside_nois keeps its behaviour policy as the rollout's own log-probs (verl's bypass mode).
PRESET_FIX = {
    "opmd": [],
    "rec_oneside_nois": ["algorithm.offpolicy.ratio_anchor=rollout", "algorithm.rollout_correction.bypass_mode=true"],
}
# Each mode once and each preset once (a full 2 x 2 costs two more minute-long runs): the bypass-mode REC
# run on its own rollout worker (the weight push through cpu_mailbox), in the default tier; opmd colocated,
# in the extended tier (verl's other async trainer, the same "our preset under verl's async trainer" claim).
DEFAULT_CASE, EXTENDED_CASE = ("rec_oneside_nois", "separate_async"), ("opmd", "colocate_async")


def _start(demo_runs, preset, mode):
    return demo_runs.start(
        preset, STEPS, SMALL + DEMO_MODE[mode] + PRESET_FIX[preset], "ppo_trainer", TIMEOUT, name=mode
    )


@queued_at_start(scope="module")
def async_run(demo_runs):
    """The run of :data:`DEFAULT_CASE`."""
    return _start(demo_runs, *DEFAULT_CASE)


@queued_at_start(scope="module")
def extended_async_run(demo_runs):
    """The run of :data:`EXTENDED_CASE` (queued only in a session that selects its test)."""
    return _start(demo_runs, *EXTENDED_CASE)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_preset_trains_under_verls_async_trainer_on_the_cpu(async_run):
    """A short CPU demo run under verl's own trainer mode: it finishes, logs every step, and the rollout
    generated with weights pushed during the run (verl's trajectory-staleness metrics come from the
    version the rollout reports; with separate_async that push went through the cpu_mailbox engine)."""
    _check_async_run(async_run.result(), DEFAULT_CASE[1])


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(1200)
def test_preset_trains_under_verls_colocate_async_trainer_on_the_cpu(extended_async_run):
    """The same claim for opmd under verl's ``colocate_async``."""
    _check_async_run(extended_async_run.result(), EXTENDED_CASE[1])


def _check_async_run(result, mode):
    assert [m["step"] for m in result.metrics] == list(range(1, STEPS + 1))
    assert "offpolicy/version" not in result.metrics[0]  # verl's trainer, not ours
    last = result.metrics[-1]
    newest_version = (last["step"] - 1) - last["training/off_policy/trajectory_staleness/min"]
    assert newest_version >= 1, last  # weights of a trained version reached the rollout
    assert all(m["critic/score/mean"] == m["critic/score/mean"] for m in result.metrics)  # not NaN
    log = Path(result.log_path).read_text(errors="replace")
    if mode == "separate_async":
        assert "standalone replicas only" in log  # verl's line that raised TypeError before the CPU fix
