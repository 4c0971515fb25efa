"""Every preset composes with verl's stock and our primary configs, converts to verl's dataclasses,
passes verl's validate_config and ours, and resolves to the settings of docs/algorithms.md."""

import re

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import omega_conf_to_dataclass, validate_config

from tests.hydra_utils import VALID_SIZES
from tests.scenario_presets import SPEC
from verl_offpolicy.cli import preset_header, preset_names
from verl_offpolicy.configs import PRIMARY_CONFIGS, STOCK_CONFIGS, preset_selector
from verl_offpolicy.glue.compose import compose_main_ppo, compose_preset
from verl_offpolicy.glue.config import OffPolicyAlgoConfig, OffPolicyLossConfig, offpolicy_section
from verl_offpolicy.glue.validation import validate_offpolicy_config

THRESHOLD = "trainer.v1.sampler.max_off_policy_threshold"  # verl's key, written out


def schedule_of(s: int, d: int) -> list[str]:
    return [f"algorithm.offpolicy.sync_interval={s}", f"algorithm.offpolicy.sync_offset={d}"]


def test_every_spec_preset_exists_and_nothing_else():
    assert set(preset_names()) == set(SPEC)


def _algorithm_group_files() -> list[str]:
    from importlib import resources

    return sorted(p.name for p in (resources.files("verl_offpolicy.configs") / "algorithm").iterdir() if p.is_file())


def test_every_file_of_the_algorithm_group_is_a_documented_preset():
    """Only presets are selectable as `algorithm=`: shared parts live outside the group."""
    files = _algorithm_group_files()
    assert files == sorted(f"{name}.yaml" for name in preset_names())
    for name in preset_names():
        assert any(line.startswith("Reproduces:") for line in preset_header(name)), f"{name}.yaml is not a preset"


def test_primary_configs_are_the_packages_top_level_configs():
    from importlib import resources

    files = sorted(p.name for p in resources.files("verl_offpolicy.configs").iterdir() if p.name.endswith(".yaml"))
    assert files == sorted(f"{name}.yaml" for name in PRIMARY_CONFIGS)


@pytest.mark.parametrize("config_name", STOCK_CONFIGS + PRIMARY_CONFIGS)
def test_cli_and_demo_select_a_preset_on_every_config(config_name):
    """`verl-offpolicy doctor`/`check` (compose_preset) and the demo select a preset by the one rule."""
    from verl_offpolicy.demo.command import preset_overrides

    assert compose_preset("asymre", config_name, VALID_SIZES).algorithm.adv_estimator == "asymre"
    demo = compose_main_ppo(config_name, [*preset_overrides("asymre", config_name), *VALID_SIZES])
    assert demo.algorithm.adv_estimator == "asymre"


@pytest.mark.parametrize("choice", ["_common", "_rec", "common"])
@pytest.mark.parametrize("config_name", STOCK_CONFIGS + PRIMARY_CONFIGS)
def test_shared_parts_are_not_selectable_as_algorithm(config_name, choice):
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException):
        compose_main_ppo(config_name, [preset_selector(choice, config_name), *VALID_SIZES])


@pytest.mark.parametrize("config_name", PRIMARY_CONFIGS)
def test_primary_config_installs_validation_whatever_the_algorithm_choice(config_name):
    cfg = compose_main_ppo(config_name, ["algorithm=rollout_correction"], return_hydra_config=True)
    assert cfg.hydra.callbacks.verl_offpolicy_validation._target_.endswith("StartupValidation")


def _check_against_spec(cfg, spec):
    algo, actor = cfg.algorithm, cfg.actor_rollout_ref.actor
    loss, off = actor.policy_loss, algo.offpolicy
    assert algo.adv_estimator == spec["adv"]
    assert loss.loss_mode == spec["loss"]
    checks = {
        "norm": algo.norm_adv_by_std_in_grpo,
        "agg": actor.loss_agg_mode,
        "anchor": off.ratio_anchor,
        "tau": loss.tau,
        "baseline": off.baseline,
        "clip": loss.clip_mode,
        "weight": loss.weight,
        "reg": loss.regularizer,
        "coef": loss.regularizer_coef,
        "shift": off.shift,
        "temperature": off.temperature,
        "beta": off.beta,
        "on_policy": off.on_policy,
        "eps": (actor.clip_ratio_low, actor.clip_ratio_high),
        "ring": (loss.ring_clip_ratio_low, loss.ring_clip_ratio_high),
        "m2": loss.m2po_threshold,
        "pool": loss.m2po_token_pool,
        "topr_c": off.topr_baseline,
        "topr_reward": off.topr_reward,
        "beta1": off.oapl_beta1,
        "beta2": loss.oapl_beta2,
    }
    for key, value in spec.items():
        if key in checks:
            assert checks[key] == pytest.approx(value) if isinstance(value, float | tuple) else checks[key] == value, (
                key
            )
    if spec.get("kl"):
        assert algo.use_kl_in_reward and algo.kl_penalty == "kl" and algo.kl_ctrl.type == "fixed"
        assert (
            algo.kl_ctrl.kl_coef == spec["beta"]
            if "beta" in spec
            else algo.kl_ctrl.kl_coef == off.tau == spec["tau_kl"]
        )
    else:
        assert not algo.use_kl_in_reward
    assert not actor.use_kl_loss
    # every preset runs through the scheduler trainer, on-policy by default
    assert cfg.trainer.v1.trainer_mode == "offpolicy" and off.sync_interval == 1 and off.sync_offset == 0


# Every preset on our primary config in the fast tier. verl's stock configs (`+algorithm=`) and the
# Megatron configs repeat the proof in the slow tier, each preset on one of the three in turn (and a preset
# that stops on Megatron on both Megatron configs); the rest of the cross product is in the extended tier
# (the selection rule itself is tested on all four configs above).
OTHER_CONFIGS = [name for name in STOCK_CONFIGS + PRIMARY_CONFIGS if name != "offpolicy_trainer"]


def _preset_config_cases():
    for index, preset in enumerate(sorted(SPEC)):
        yield pytest.param(preset, "offpolicy_trainer", id=f"{preset}-offpolicy_trainer")
        for config_name in OTHER_CONFIGS:
            sampled = config_name == OTHER_CONFIGS[index % len(OTHER_CONFIGS)] or (
                SPEC[preset].get("fsdp_only") and "megatron" in config_name
            )
            tier = pytest.mark.slow if sampled else pytest.mark.extended
            yield pytest.param(preset, config_name, marks=[pytest.mark.slow, tier], id=f"{preset}-{config_name}")


@pytest.mark.parametrize("preset, config_name", list(_preset_config_cases()))
def test_preset_composes_converts_and_validates(config_name, preset):
    cfg = compose_main_ppo(config_name, [preset_selector(preset, config_name), *VALID_SIZES])
    _check_against_spec(cfg, SPEC[preset])
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert isinstance(actor.policy_loss, OffPolicyLossConfig)
    assert isinstance(omega_conf_to_dataclass(cfg.algorithm), OffPolicyAlgoConfig)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    if SPEC[preset].get("fsdp_only") and "megatron" in config_name:
        # m2po's whole-mini-batch pre-pass exists for the FSDP engine only: startup says so
        with pytest.raises(ValueError, match="actor_rollout_ref.actor.strategy=megatron does not run"):
            validate_offpolicy_config(cfg)
    else:
        validate_offpolicy_config(cfg)
    assert need_reference_policy(cfg) == bool(SPEC[preset].get("kl"))
    assert not need_critic(cfg)
    expected_strategy = "megatron" if "megatron" in config_name else "fsdp"
    assert actor.strategy == expected_strategy


def test_primary_config_defaults_to_grpo_and_installs_validation():
    cfg = compose_main_ppo("offpolicy_trainer", [], return_hydra_config=True)
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.hydra.callbacks.verl_offpolicy_validation._target_.endswith("StartupValidation")


# ------------------------------------------------------------------------ overrides propagate


def _estimator_output(cfg, rewards, index):
    """Run the registered estimator the way verl's trainer calls it (config = the algorithm DictConfig)."""
    scores = torch.tensor(rewards, dtype=torch.float32)
    token_level_rewards = torch.zeros(len(rewards), 3)
    token_level_rewards[:, -1] = scores
    mask = torch.ones(len(rewards), 3)
    fn = get_adv_estimator_fn(cfg.algorithm.adv_estimator)
    adv, _ = fn(
        token_level_rewards=token_level_rewards, response_mask=mask, index=np.array(index), config=cfg.algorithm
    )
    return adv[:, 0]


def test_tau_override_reaches_loss_and_estimator():
    cfg = compose_main_ppo(
        "offpolicy_trainer", ["algorithm=pmd_partition", "algorithm.offpolicy.tau=0.5"] + VALID_SIZES
    )
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert actor.policy_loss.tau == 0.5 and offpolicy_section(cfg.algorithm).tau == 0.5
    rewards, tau = [1.0, 0.0, 0.5], 0.5
    adv = _estimator_output(cfg, rewards, ["a", "a", "a"])
    # pmd_partition: A_i = r_i − τ·log(mean_{j≠i} exp(r_j/τ)), computed here from the spec
    expected = [
        r - tau * np.log(np.mean([np.exp(q / tau) for j, q in enumerate(rewards) if j != i]))
        for i, r in enumerate(rewards)
    ]
    assert adv.tolist() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize(
    "preset,override,rewards,expected",
    [
        # asymre: A = r − (r̄ + shift), shift overridden to −0.3
        ("asymre", "algorithm.offpolicy.shift=-0.3", [1.0, 0.0], [1.0 - 0.2, 0.0 - 0.2]),
        # red_weight: A = (r − r̄)·exp((r − r̄)/T), T overridden to 0.5
        ("red_weight", "algorithm.offpolicy.temperature=0.5", [1.0, 0.0], [0.5 * np.exp(1.0), -0.5 * np.exp(-1.0)]),
        # opmd with the logavgexp baseline: b = τ·(logsumexp(r/τ) − log K), τ = 2
        (
            "opmd",
            "algorithm.offpolicy.baseline=logavgexp algorithm.offpolicy.tau=2.0",
            [1.0, 0.0],
            [1.0 - 2.0 * np.log((np.exp(0.5) + 1.0) / 2), 0.0 - 2.0 * np.log((np.exp(0.5) + 1.0) / 2)],
        ),
    ],
)
def test_estimator_hyperparameter_overrides_reach_the_estimator(preset, override, rewards, expected):
    cfg = compose_main_ppo("offpolicy_trainer", [f"algorithm={preset}", *override.split()] + VALID_SIZES)
    adv = _estimator_output(cfg, rewards, ["g"] * len(rewards))
    assert adv.tolist() == pytest.approx(expected, rel=1e-5)


def test_agro_beta_override_sets_the_kl_coefficient_in_one_place():
    cfg = compose_main_ppo("offpolicy_trainer", ["algorithm=agro", "algorithm.offpolicy.beta=0.5"] + VALID_SIZES)
    assert cfg.algorithm.kl_ctrl.kl_coef == 0.5
    validate_offpolicy_config(cfg)


@pytest.mark.parametrize(
    "override,attribute,value",
    [
        ("actor_rollout_ref.actor.policy_loss.clip_mode=two-side", "clip_mode", "two-side"),
        ("actor_rollout_ref.actor.policy_loss.weight=importance_sampling", "weight", "importance_sampling"),
        ("actor_rollout_ref.actor.policy_loss.regularizer=forward-kl", "regularizer", "forward-kl"),
        ("actor_rollout_ref.actor.policy_loss.regularizer_coef=0.3", "regularizer_coef", 0.3),
        ("actor_rollout_ref.actor.policy_loss.ring_clip_ratio_high=3.0", "ring_clip_ratio_high", 3.0),
    ],
)
def test_loss_hyperparameter_overrides_reach_the_actor_config(override, attribute, value):
    cfg = compose_main_ppo("offpolicy_trainer", ["algorithm=rec_ring_nois", override] + VALID_SIZES)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert getattr(actor.policy_loss, attribute) == value


def test_scheduler_overrides_reach_the_offpolicy_section():
    cfg = compose_main_ppo(
        "offpolicy_trainer",
        ["algorithm=rec_oneside_nois", "algorithm.offpolicy.sync_interval=4", "algorithm.offpolicy.sync_offset=1"]
        + VALID_SIZES,
    )
    section = offpolicy_section(cfg.algorithm)
    assert (section.sync_interval, section.sync_offset, section.ratio_anchor) == (4, 1, "behaviour")


# ------------------------------------------------------------------------ invalid combinations


LOGPROBS = ["actor_rollout_ref.rollout.calculate_log_probs=true"]
RC = "algorithm.rollout_correction"
NO_PRESET = "algorithm.offpolicy.preset=null"  # a config that does not claim to be its preset


@pytest.mark.parametrize(
    "preset, overrides",
    [
        ("rec_oneside_nois", [f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=2.0"]),  # REC one-side + token TIS
        (
            "opmd",
            [f"{RC}.rollout_is=sequence", f"{RC}.rollout_is_threshold=0.5_2.0"],
        ),  # OPMD + sequence MIS (IcePop bounds)
        ("m2po", [f"{RC}.rollout_rs=seq_mean_k1", f"{RC}.rollout_rs_threshold=0.999_1.001"]),  # Geo-RS
        (
            "topr",
            [
                f"{RC}.rollout_is=token",
                "algorithm.offpolicy.ratio_anchor=proximal",
                "algorithm.offpolicy.sync_interval=4",
            ],
        ),
        (
            "opmd",
            [f"{RC}.bypass_mode=true", "algorithm.offpolicy.ratio_anchor=rollout"],
        ),  # bypass: old = rollout log-probs
    ],
)
def test_rollout_correction_combinations_that_compose_pass_validation(preset, overrides):
    cfg = compose_main_ppo("offpolicy_trainer", [f"algorithm={preset}", *LOGPROBS, *overrides] + VALID_SIZES)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    validate_offpolicy_config(cfg)


@pytest.mark.parametrize(
    "preset,overrides,message",
    [
        ("agro", ["algorithm.use_kl_in_reward=false"], "algorithm.use_kl_in_reward=true"),
        ("agro", ["algorithm.kl_penalty=low_var_kl"], "algorithm.kl_penalty=kl"),
        ("agro", ["algorithm.kl_ctrl.type=adaptive"], "algorithm.kl_ctrl.type=fixed"),
        ("agro", ["algorithm.kl_ctrl.kl_coef=0.2"], "to equal algorithm.offpolicy.beta"),
        (
            "pmd_mean",
            ["algorithm.offpolicy.tau=0"],
            "algorithm.offpolicy.tau (read by loss_mode=pmd as actor_rollout_ref.actor.policy_loss.tau) must be > 0",
        ),
        ("pmd_partition", ["algorithm.offpolicy.tau=-1"], "must be > 0"),
        ("pmd_partition", ["actor_rollout_ref.actor.policy_loss.tau=0.5"], "τ is one hyperparameter"),
        ("pmd_mean", ["actor_rollout_ref.actor.policy_loss.tau=0.05"], "set algorithm.offpolicy.tau only"),
        ("rec_gspo_is", ["actor_rollout_ref.actor.loss_agg_mode=token-mean"], "must be sequence-level"),
        (
            "rec_oneside_nois",
            ["actor_rollout_ref.rollout.calculate_log_probs=false", "algorithm.offpolicy.ratio_anchor=rollout"],
            "set actor_rollout_ref.rollout.calculate_log_probs=true",
        ),
        # staleness needs the scheduler (on verl's V1 trainer): the message names the key and both ways out
        (
            "rec_oneside_nois",
            ["trainer.v1.trainer_mode=sync", "algorithm.offpolicy.sync_interval=2"],
            "trainer.v1.trainer_mode=offpolicy",
        ),
        (
            "rec_oneside_nois",
            ["trainer.use_v1=false", "algorithm.offpolicy.sync_offset=1"],
            "algorithm.offpolicy.sync_interval=1, sync_offset=1 needs verl-offpolicy's scheduler, which runs on "
            "verl's V1 "
            "trainer (got trainer.use_v1=False, trainer.v1.trainer_mode=offpolicy): set trainer.use_v1=true "
            "trainer.v1.trainer_mode=offpolicy, or set algorithm.offpolicy.sync_interval=1 "
            "algorithm.offpolicy.sync_offset=0 (on-policy)",
        ),
        (
            "grpo",
            [
                "trainer.use_v1=false",
                "algorithm.offpolicy.ratio_anchor=rollout",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
            ],
            "or set algorithm.offpolicy.ratio_anchor=proximal",
        ),
        ("rec_ring_nois", ["actor_rollout_ref.actor.policy_loss.ring_clip_ratio_low=0.1"], "ring ε′ ≥ ε"),
        ("rec_oneside_nois", ["actor_rollout_ref.actor.clip_ratio_low=-0.1"], "clip_ratio_low must be >= 0"),
        (
            "rec_oneside_nois",
            ["actor_rollout_ref.actor.policy_loss.clip_mode=sideways"],
            "allowed values: none, one-side",
        ),
        (
            "rec_oneside_nois",
            ["actor_rollout_ref.actor.policy_loss.weight=ppo"],
            "policy_loss.weight='ppo' is not valid",
        ),
        ("opmd_kimi", ["actor_rollout_ref.actor.policy_loss.regularizer=l2"], "policy_loss.regularizer='l2'"),
        (
            "m2po",
            ["actor_rollout_ref.actor.policy_loss.m2po_token_pool=harmful"],
            "actor_rollout_ref.actor.policy_loss.m2po_token_pool='harmful' is not valid; allowed values: "
            "trust_region, all",
        ),
        ("opmd", ["algorithm.offpolicy.baseline=median"], "allowed values: mean, logavgexp"),
        ("opmd", ["algorithm.offpolicy.ratio_anchor=old"], "allowed values: behaviour, rollout, proximal"),
        ("opmd", ["algorithm.offpolicy.sync_interval=0"], "sync_interval must be an integer >= 1"),
        ("opmd", ["algorithm.offpolicy.sync_offset=-2"], "sync_offset must be an integer >= 0"),
        ("opmd", ["+algorithm.offpolicy.sync_intervl=2"], "unknown key(s) ['sync_intervl']"),
        ("red_weight", ["algorithm.offpolicy.temperature=0"], "temperature must be > 0"),
        ("grpo", ["skip.rollout_tq.enable=true"], "set skip.rollout_tq.enable=false"),
        ("grpo", ["trainer.v1.sampler.custom_sampler.path=my.py"], "remove trainer.v1.sampler.custom_sampler"),
        # verl's version bound N admits staleness <= N - 1; (4, 1)'s worst is step 5 at version 0: 4 versions old
        (
            "opmd",
            [*schedule_of(4, 1), f"{THRESHOLD}=4"],
            f"up to 4 versions old (s + d - 1), spanning 5 versions, but {THRESHOLD}=4",
        ),
        ("opmd", [*schedule_of(20, 10), f"{THRESHOLD}=8"], f"set {THRESHOLD} >= 30"),
        ("opmd", [f"{THRESHOLD}=0"], f"{THRESHOLD} must be an integer >= 1 or null, got 0"),
        # overlapped mode needs a rollout pool of its own (tests/scheduler/test_overlapped.py covers the rest)
        ("grpo", ["actor_rollout_ref.hybrid_engine=false"], "set actor_rollout_ref.rollout.nnodes >= 1"),
        ("grpo", ["algorithm.rollout_correction.bypass_mode=true"], "set algorithm.offpolicy.ratio_anchor=rollout"),
        # a replaced loss stops as another preset's algorithm (tests/glue/test_user_scripts.py); without the preset's
        # name the pairing rule names the pair
        (
            "pairwise_opmd",
            ["actor_rollout_ref.actor.policy_loss.loss_mode=rec", NO_PRESET],
            "both set to pairwise_opmd",
        ),
        (
            "grpo",
            ["actor_rollout_ref.actor.policy_loss.loss_mode=pairwise_opmd", NO_PRESET],
            "algorithm.adv_estimator=grpo and",
        ),
        ("pairwise_opmd", ["algorithm.kl_ctrl.kl_coef=0.5"], "to equal algorithm.offpolicy.tau"),
        ("pairwise_opmd", ["actor_rollout_ref.actor.ppo_epochs=2"], "actor_rollout_ref.actor.ppo_epochs=1 (got 2)"),
        (
            "pairwise_opmd",
            ["algorithm.rollout_correction.bypass_mode=true"],
            "adv_estimator=pairwise_opmd computes its reward",
        ),
        # composition with verl's rollout correction (TIS/IcePop/MIS: rollout_is; Geo-RS: rollout_rs)
        (
            "opmd",
            [f"{RC}.rollout_is=token", "actor_rollout_ref.rollout.calculate_log_probs=false"],
            "need the inference engine's log-probs",
        ),
        (
            "opmd",
            [f"{RC}.rollout_is=token", *LOGPROBS, f"{RC}.bypass_mode=true", "algorithm.offpolicy.ratio_anchor=rollout"],
            "algorithm.rollout_correction.bypass_mode=true with algorithm.rollout_correction.rollout_is=token",
        ),
        (
            "opmd",
            [*LOGPROBS, f"{RC}.bypass_mode=true", "trainer.use_v1=false"],
            "replaces actor_rollout_ref.actor.policy_loss.loss_mode=opmd",
        ),
        (
            "topr",
            [
                *LOGPROBS,
                f"{RC}.bypass_mode=true",
                "algorithm.offpolicy.ratio_anchor=rollout",
                f"{RC}.loss_type=reinforce",
            ],
            "algorithm.rollout_correction.loss_type=reinforce selects verl's bypass_mode loss",
        ),
        (
            "pairwise_opmd",
            [*LOGPROBS, f"{RC}.rollout_rs=seq_mean_k1", f"{RC}.rollout_rs_threshold=0.999_1.001"],
            "algorithm.adv_estimator=pairwise_opmd with algorithm.rollout_correction.rollout_rs=seq_mean_k1",
        ),
        (
            "rec_oneside_nois",
            [*LOGPROBS, f"{RC}.rollout_is=token", "algorithm.offpolicy.ratio_anchor=rollout"],
            "corrected twice",
        ),
    ],
)
def test_invalid_combination_fails_with_what_to_change(preset, overrides, message):
    cfg = compose_main_ppo("offpolicy_trainer", [f"algorithm={preset}", *overrides] + VALID_SIZES)
    with pytest.raises(ValueError) as info:
        validate_offpolicy_config(cfg)
    assert message in str(info.value)


@pytest.mark.parametrize("preset", ["rec_oneside_nois", "grpo", "topr", "oapl"])
def test_a_behaviour_anchored_preset_takes_verls_corrections_on_stale_batches(preset):
    # under the behaviour anchor the weight is π_behaviour/π_rollout (the engines' mismatch), so sequence IS with an
    # IcePop bound and a geometric rejection mask compose at (4, 1); the trainer test checks the pair compared
    corrections = [
        f"{RC}.rollout_is=sequence",
        f"{RC}.rollout_is_threshold=0.5_2.0",
        f"{RC}.rollout_rs=seq_mean_k1",
        f"{RC}.rollout_rs_threshold=0.9_1.1",
    ]
    cfg = compose_main_ppo(
        "offpolicy_trainer", [f"algorithm={preset}", *LOGPROBS, *corrections, *schedule_of(4, 1), *VALID_SIZES]
    )
    validate_offpolicy_config(cfg)


@pytest.mark.parametrize("threshold", ["5", "null"])
def test_a_version_bound_the_schedule_stays_within_is_accepted(threshold):
    # (4, 1) trains batches at most 4 versions old (spanning 5): a bound of 5, or none, holds
    cfg = compose_main_ppo(
        "offpolicy_trainer", ["algorithm=opmd", *schedule_of(4, 1), f"{THRESHOLD}={threshold}", *VALID_SIZES]
    )
    validate_offpolicy_config(cfg)


@pytest.mark.parametrize("train_batch_size,mini_batch_size", [(256, 64), (96, 24), (16, 4), (6, 1), (3, 1)])
def test_m2po_preset_takes_four_optimizer_updates_per_batch(train_batch_size, mini_batch_size):
    # the paper's batch 256 / mini-batch 64; elsewhere the largest divisor of the batch giving ≥ 4 updates
    # (6 → 1: 6 updates, since 2 does not leave ≥ 4; 3 prompts → 1 each)
    sizes = [o for o in VALID_SIZES if "ppo_mini_batch_size" not in o]
    cfg = compose_main_ppo("offpolicy_trainer", ["algorithm=m2po", *sizes, f"data.train_batch_size={train_batch_size}"])
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == mini_batch_size
    assert cfg.actor_rollout_ref.actor.ppo_epochs == 1
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    validate_offpolicy_config(cfg)


@pytest.mark.parametrize(
    "overrides, warned",
    [
        ([], "at (s, d) = (1, 0) under algorithm.offpolicy.ratio_anchor=behaviour"),
        (
            [*schedule_of(4, 0), "algorithm.offpolicy.ratio_anchor=proximal"],
            "at algorithm.offpolicy.ratio_anchor=proximal",
        ),
        ([*schedule_of(4, 0)], None),  # stale batches: ratios against the generating weights differ from 1
        (["actor_rollout_ref.actor.ppo_mini_batch_size=4"], None),  # 16 prompts / 4: the later updates' ratios move
    ],
)
def test_m2po_with_one_update_on_fresh_ratios_is_warned_to_be_plain_ppo(caplog, overrides, warned):
    """One update per batch on ratios recomputed at the update's own weights: every ratio is 1, nothing is masked."""
    cfg = compose_main_ppo(
        "offpolicy_trainer", ["algorithm=m2po", *VALID_SIZES, *overrides]
    )  # 16 prompts, mini-batch 16
    with caplog.at_level("WARNING", logger="verl_offpolicy"):
        validate_offpolicy_config(cfg)
    if warned is None:
        assert "loss_mode=m2po with one optimizer update" not in caplog.text
    else:
        assert (
            "actor_rollout_ref.actor.policy_loss.loss_mode=m2po with one optimizer update per batch "
            f"(actor_rollout_ref.actor.ppo_mini_batch_size=16 = data.train_batch_size, ppo_epochs=1) {warned}: every "
            "ratio is 1 at the update, so M2PO masks nothing and is plain PPO"
        ) in caplog.text


def test_pairwise_opmd_rejects_several_updates_per_batch():
    # its group coefficients are exact at the first optimizer update of a batch only
    cfg = compose_main_ppo("offpolicy_trainer", ["algorithm=pairwise_opmd", *VALID_SIZES, "data.train_batch_size=32"])
    with pytest.raises(
        ValueError,
        match=r"set actor_rollout_ref.actor.ppo_mini_batch_size=32 \(= data.train_batch_size; got 16, i.e. 2 optimizer",
    ):
        validate_offpolicy_config(cfg)


@pytest.mark.parametrize("preset", ["reinforce", "rec_oneside_nois", "opmd_kimi"])
def test_on_a_fresh_batch_these_presets_take_reinforces_step(preset):
    """With one optimizer step per batch and a fresh batch, the ratio to the behaviour policy is 1: REC's one-side mask
    keeps every token (0.8 <= 1 <= 1.2) and the squared log-ratio's gradient 2c(log pi - log pi_old) is 0. Each of the
    three presets then takes plain group-mean REINFORCE's step: advantages r - mean(r), per-token gradient of the
    token-mean loss -A_i / (number of tokens). benchmarks/smollm2_study.py runs their on-policy setting once for
    this."""
    cfg = compose_main_ppo("offpolicy_trainer", [preset_selector(preset, "offpolicy_trainer"), *VALID_SIZES])
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    # verl's compute_advantage hands GRPO's estimator the std switch as an argument (not through the config)
    fn = get_adv_estimator_fn(cfg.algorithm.adv_estimator)
    scores = torch.zeros(6, 3)
    scores[:, -1] = torch.tensor(rewards)
    kwargs = (
        {"norm_adv_by_std_in_grpo": cfg.algorithm.norm_adv_by_std_in_grpo}
        if cfg.algorithm.adv_estimator == "grpo"
        else {}
    )
    adv, _ = fn(
        token_level_rewards=scores,
        response_mask=torch.ones(6, 3),
        index=np.array(list("aaabbb")),
        config=cfg.algorithm,
        **kwargs,
    )
    adv = adv[:, 0]
    assert adv.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0])  # r - group mean: no std normalisation
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    from tests.loss_helpers import call

    g = torch.Generator().manual_seed(0)
    old = -torch.rand(6, 4, generator=g)
    mask = torch.ones(6, 4)
    mask[1, 3] = 0
    advantages = adv[:, None].expand(6, 4).float()
    _, grad, _ = call(actor, old, old.clone(), advantages, mask, agg=actor.loss_agg_mode)
    assert actor.loss_agg_mode == "token-mean"
    assert torch.allclose(grad, -advantages * mask / mask.sum(), atol=1e-7)


# The fast tier checks a behaviour-anchored and a proximal preset; the slow tier every preset (a repeat on more
# configs).
ON_VERLS_TRAINERS = [
    p if p in ("rec_oneside_nois", "opmd") else pytest.param(p, marks=pytest.mark.slow) for p in preset_names()
]


@pytest.mark.parametrize("preset", ON_VERLS_TRAINERS)
@pytest.mark.parametrize("trainer", [["trainer.use_v1=false"], ["trainer.v1.trainer_mode=sync"]])
def test_every_preset_runs_on_verls_own_trainers_at_one_zero(preset, trainer):
    """The estimators and losses are verl registry entries: at (s, d) = (1, 0) nothing of the scheduler is needed,
    so every preset validates on verl's legacy RayPPOTrainer (use_v1=false) and on V1's own sync trainer; the
    behaviour anchor is the proximal policy there (each batch trains at the weights that generated it)."""
    validate_offpolicy_config(compose_main_ppo("offpolicy_trainer", [f"algorithm={preset}", *trainer, *VALID_SIZES]))


ROLLOUT_ANCHOR = [
    "algorithm=rec_oneside_nois",
    "algorithm.offpolicy.ratio_anchor=rollout",
    "actor_rollout_ref.rollout.calculate_log_probs=true",
]
MODE = "actor_rollout_ref.rollout.logprobs_mode"


def _rollout_anchor(*overrides):
    return compose_main_ppo("offpolicy_trainer", [*ROLLOUT_ANCHOR, *overrides, *VALID_SIZES])


@pytest.mark.parametrize("mode", ["raw_logits", "processed_logits"])
def test_the_rollout_anchor_refuses_the_logit_modes(mode):
    """vLLM returns logits, not log-probs, in the *_logits modes: the loss's π_old would be a logit."""
    with pytest.raises(
        ValueError,
        match=rf"ratio_anchor=rollout read the rollout's values as log π_rollout, but {MODE}={mode} makes vLLM "
        rf"return the logits.*, not log-probs: set {MODE}=processed_logprobs",
    ):
        validate_offpolicy_config(_rollout_anchor(f"{MODE}={mode}"))


@pytest.mark.parametrize(
    "reader", [[f"{RC}.rollout_is=token"], [f"{RC}.rollout_rs=seq_mean_k1", f"{RC}.rollout_rs_threshold=0.9_1.1"]]
)
def test_verls_rollout_correction_refuses_the_logit_modes(reader):
    # behaviour anchor: the logits would enter verl's weights or rejection masks as log π_rollout
    overrides = ["algorithm=rec_oneside_nois", *LOGPROBS, *reader, *VALID_SIZES]
    with pytest.raises(
        ValueError, match=rf"{re.escape(reader[0])} read the rollout's values as log π_rollout, but {MODE}=raw_logits"
    ):
        validate_offpolicy_config(compose_main_ppo("offpolicy_trainer", [*overrides, f"{MODE}=raw_logits"]))
    # nothing reads the rollout's values: any mode passes
    validate_offpolicy_config(
        compose_main_ppo("offpolicy_trainer", ["algorithm=rec_oneside_nois", *VALID_SIZES, f"{MODE}=raw_logits"])
    )


@pytest.mark.parametrize("mode", ["processed_logprobs", "raw_logprobs", "null"])
def test_the_rollout_anchor_takes_either_log_prob_mode_at_temperature_one(mode):
    validate_offpolicy_config(_rollout_anchor(f"{MODE}={mode}"))


def test_the_rollout_anchor_takes_a_temperature_under_processed_logprobs():
    """processed_logprobs are log_softmax(logits/T), what the trainer computes: T = 0.6 is no bias."""
    cfg = _rollout_anchor("actor_rollout_ref.rollout.temperature=0.6")
    assert cfg.actor_rollout_ref.rollout.logprobs_mode == "processed_logprobs"  # verl's default
    validate_offpolicy_config(cfg)


@pytest.mark.parametrize(
    "mode, shown", [("raw_logprobs", "raw_logprobs"), ("null", "null (vLLM's default, raw_logprobs)")]
)
def test_the_rollout_anchor_refuses_a_temperature_under_raw_logprobs(mode, shown):
    """raw_logprobs are at temperature 1, the trainer's at T (huggingface/trl#4159)."""
    with pytest.raises(
        ValueError,
        match=rf"temperature=0.6 with {re.escape(f'{MODE}={shown}')} returns log-probs at temperature 1, while the "
        rf"trainer computes log_softmax\(logits/0.6\).*trl#4159\). Set {MODE}=processed_logprobs",
    ):
        validate_offpolicy_config(_rollout_anchor("actor_rollout_ref.rollout.temperature=0.6", f"{MODE}={mode}"))


@pytest.mark.parametrize(
    "mode, reported",
    [
        ("processed_logprobs", "renormalised over the kept tokens: log π(y) − log S"),
        ("raw_logprobs", "those of the untruncated distribution"),
    ],
)
@pytest.mark.parametrize("sampling", ["actor_rollout_ref.rollout.top_p=0.9", "actor_rollout_ref.rollout.top_k=50"])
def test_the_rollout_anchor_refuses_a_truncated_sampling_distribution(sampling, mode, reported):
    """Truncated, the log-probs are those of the kept set (or of the untruncated π): every ratio biased
    (huggingface/trl#6789)."""
    overrides = [sampling, f"{MODE}={mode}"]
    with pytest.raises(
        ValueError,
        match=rf"ratio_anchor=rollout takes the rollout's log-probs as π_old, but {re.escape(sampling)} makes the "
        rf"rollout sample from a truncated distribution, and with {MODE}={mode} its log-probs are "
        rf"{re.escape(reported)}.*trl#6789",
    ):
        validate_offpolicy_config(_rollout_anchor(*overrides))
    # the anchors the trainer computes itself are not affected
    validate_offpolicy_config(
        compose_main_ppo(
            "offpolicy_trainer", [o for o in ROLLOUT_ANCHOR if "ratio_anchor" not in o] + overrides + VALID_SIZES
        )
    )


def test_a_correction_on_truncated_sampling_is_warned_about(caplog):
    """Under the behaviour anchor verl's weights compare π_behaviour with π_rollout: truncation adds log S to every
    log-weight, which a warning names (verl allows it); without truncation nothing is said."""
    base = ["algorithm=rec_oneside_nois", *LOGPROBS, f"{RC}.rollout_is=token", *VALID_SIZES]
    with caplog.at_level("WARNING", logger="verl_offpolicy"):
        validate_offpolicy_config(compose_main_ppo("offpolicy_trainer", base))
    assert "sampling gap" not in caplog.text
    with caplog.at_level("WARNING", logger="verl_offpolicy"):
        validate_offpolicy_config(
            compose_main_ppo("offpolicy_trainer", [*base, "actor_rollout_ref.rollout.top_p=0.95"])
        )
    assert (
        f"{RC}.rollout_is=token compare the rollout's log-probs with the trainer's, and "
        "actor_rollout_ref.rollout.top_p=0.95 (log-probs renormalised over the kept set) add a sampling gap"
    ) in caplog.text
