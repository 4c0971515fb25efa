"""Invalid hyperparameters of the estimators and losses fail with messages naming the full key and the
allowed values, wherever they are used: the typed configs, the registered functions, Hydra composition."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the verl.plugins entry point: registers our names)
from hydra.errors import InstantiationException
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import ActorConfig

from verl_offpolicy.glue.compose import compose_main_ppo
from verl_offpolicy.glue.config import OffPolicyConfig, OffPolicyLossConfig
from verl_offpolicy.glue.validation import validate_parts

LOSS = "actor_rollout_ref.actor.policy_loss"
ALGO = "algorithm.offpolicy"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"loss_mode": "pmd", "tau": 0.0}, rf"{LOSS}.tau \(loss_mode=pmd\) must be > 0, got 0.0"),
        ({"loss_mode": "pmd", "tau": -0.5}, rf"{LOSS}.tau \(loss_mode=pmd\) must be > 0"),
        ({"loss_mode": "opmd", "tau": -1.0}, rf"{LOSS}.tau must be >= 0, got -1.0"),
        ({"loss_mode": "rec", "regularizer_coef": -0.1}, rf"{LOSS}.regularizer_coef must be >= 0"),
        ({"loss_mode": "rec", "ring_clip_ratio_low": -0.1}, rf"{LOSS}.ring_clip_ratio_low must be >= 0"),
        (
            {"loss_mode": "rec", "clip_mode": "both"},
            rf"{LOSS}.clip_mode='both' is not valid; allowed values: none, one-side, two-side, ring, gspo-one-side",
        ),
        (
            {"loss_mode": "rec", "weight": "is"},
            rf"{LOSS}.weight='is' is not valid; allowed values: none, importance_sampling, gspo_importance_sampling",
        ),
        (
            {"loss_mode": "rec", "regularizer": "kl"},
            rf"{LOSS}.regularizer='kl' is not valid; allowed values: none, forward-kl, k2",
        ),
    ],
)
def test_loss_config_rejects(kwargs, message):
    """Each value on its own when the section is built; τ against its loss_mode by the startup rules."""
    with pytest.raises(ValueError, match=message):
        validate_parts(actor=_rec_actor(**kwargs))


def test_opmd_loss_accepts_tau_zero():
    assert OffPolicyLossConfig(loss_mode="opmd", tau=0.0).tau == 0.0  # spec: τ ≥ 0 for opmd


@pytest.mark.parametrize(
    "preset, override, message",
    [
        # The user set algorithm.offpolicy.tau; the presets interpolate it into the loss: the error names their key.
        ("opmd", f"{ALGO}.tau=-1", rf"^{ALGO}.tau \(read by loss_mode=opmd as {LOSS}.tau\) must be >= 0, got -1$"),
        ("pmd_mean", f"{ALGO}.tau=0", rf"^{ALGO}.tau \(read by loss_mode=pmd as {LOSS}.tau\) must be > 0, got 0$"),
        # The user overrode the loss's key itself: that key is named.
        ("opmd", f"{LOSS}.tau=-1", rf"^{LOSS}.tau must be >= 0, got -1$"),
    ],
)
def test_a_tau_error_names_the_key_the_user_set(preset, override, message):
    from tests.hydra_utils import VALID_SIZES, compose_and_check

    with pytest.raises(ValueError, match=message):
        compose_and_check("offpolicy_trainer", [f"algorithm={preset}", override, *VALID_SIZES])


def _estimate(name, **offpolicy):
    """The startup rules on the algorithm section, then the registered estimator."""
    config = OmegaConf.create({"adv_estimator": name, "offpolicy": offpolicy})
    validate_parts(algorithm=config)
    return get_adv_estimator_fn(name)(torch.ones(2, 1), torch.ones(2, 1), np.array(["u", "u"]), config=config)


@pytest.mark.parametrize(
    "name, offpolicy, message",
    [
        ("pmd_partition", {"tau": 0.0}, rf"{ALGO}.tau \(used by adv_estimator=pmd_partition\) must be > 0, got 0.0"),
        ("opmd", {"baseline": "logavgexp", "tau": -1.0}, rf"{ALGO}.tau \(used by adv_estimator=opmd\) must be > 0"),
        ("opmd", {"baseline": "median"}, rf"{ALGO}.baseline='median' is not valid; allowed values: mean, logavgexp"),
        ("red_weight", {"temperature": 0.0}, rf"{ALGO}.temperature must be > 0, got 0.0"),
        ("agro", {"beta": -0.1}, rf"{ALGO}.beta must be > 0"),
        ("asymre", {"shift": float("nan")}, rf"{ALGO}.shift must be a finite number"),
        ("red_drop", {"seed": 1.5}, rf"{ALGO}.seed must be an integer"),
        ("opmd", {"temprature": 1.0}, rf"unknown key\(s\) \['temprature'\] in {ALGO}; allowed keys: .*temperature"),
    ],
)
def test_estimator_rejects(name, offpolicy, message):
    with pytest.raises(ValueError, match=message):
        _estimate(name, **offpolicy)


def test_opmd_mean_baseline_does_not_need_positive_tau():
    adv, _ = _estimate("opmd", baseline="mean", tau=0.0)  # τ is unused by the mean baseline
    assert torch.equal(adv, torch.zeros(2, 1))


def _rec_actor(clip_low=0.2, clip_high=0.2, clip_ratio=0.2, loss_mode="rec", **loss_kw):
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=clip_ratio,
        clip_ratio_low=clip_low,
        clip_ratio_high=clip_high,
        policy_loss=OffPolicyLossConfig(loss_mode=loss_mode, **loss_kw),
    )


def _rec(config):
    """The startup rules on the actor section, then the registered loss."""
    validate_parts(actor=config)
    x = torch.zeros(2, 3, requires_grad=True)
    mask = torch.ones(2, 3, dtype=torch.bool)
    return get_policy_loss_fn("rec")(x.detach(), x, torch.ones(2, 3), mask, "token-mean", config)


@pytest.mark.parametrize(
    "config, message",
    [
        (_rec_actor(clip_low=-0.1), r"actor_rollout_ref.actor.clip_ratio_low must be >= 0, got -0.1"),
        (_rec_actor(clip_high=-0.2), r"actor_rollout_ref.actor.clip_ratio_high must be >= 0, got -0.2"),
        (
            _rec_actor(clip_low=0.7, clip_mode="ring", ring_clip_ratio_low=0.6),
            rf"{LOSS}.ring_clip_ratio_low=0.6 must be >= actor_rollout_ref.actor.clip_ratio_low=0.7",
        ),
        (
            _rec_actor(clip_high=2.5, clip_mode="ring", ring_clip_ratio_high=2.0),
            rf"{LOSS}.ring_clip_ratio_high=2.0 must be >= actor_rollout_ref.actor.clip_ratio_high=2.5",
        ),
    ],
)
def test_rec_loss_rejects_clip_ratios(config, message):
    with pytest.raises(ValueError, match=message):
        _rec(config)


def test_hydra_composition_reports_the_key():
    cfg = compose_main_ppo(
        "ppo_trainer",
        [
            f"{LOSS}._target_=verl_offpolicy.glue.config.OffPolicyLossConfig",
            f"{LOSS}.loss_mode=rec",
            f"+{LOSS}.clip_mode=sideways",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        ],
    )
    with pytest.raises(InstantiationException, match=rf"{LOSS}.clip_mode='sideways' is not valid; allowed values"):
        omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def test_offpolicy_section_defaults_match_the_spec():
    from verl_offpolicy.glue.algorithms.opmd import resolve_tau

    section = OffPolicyConfig()
    assert (section.baseline, section.shift, section.temperature, section.beta, section.on_policy) == (
        "mean",
        -0.1,
        1.0,
        0.1,
        False,
    )
    # τ left unset takes each consumer's default from the spec: opmd 1.0, pmd_partition 0.01, pmd loss 0.01.
    assert (resolve_tau(section.tau, "opmd"), resolve_tau(section.tau, "pmd_partition")) == (1.0, 0.01)
    assert resolve_tau(OffPolicyConfig(tau=0.3).tau, "pmd_partition") == 0.3
    loss = OffPolicyLossConfig()
    assert (loss.ring_clip_ratio_low, loss.ring_clip_ratio_high) == (0.6, 2.0)
    assert resolve_tau(OffPolicyLossConfig(loss_mode="pmd").tau, "pmd") == 0.01
    assert resolve_tau(OffPolicyLossConfig(loss_mode="opmd").tau, "opmd") == 1.0


# τ is one hyperparameter (check_tau_coupling): expected outcomes derived by hand from the rule of
# docs/algorithms.md — the loss's resolved τ must equal the estimator's when both read τ, else
# algorithm.offpolicy.tau when that is set. Defaults: opmd 1.0, pmd_partition 0.01, pmd 0.01.
@pytest.mark.parametrize(
    "estimator, baseline, algo_tau, loss_mode, loss_tau, accepted",
    [
        ("pmd_partition", "mean", 0.01, "pmd", 0.01, True),  # the preset: one value
        ("pmd_partition", "mean", 0.01, "pmd", 0.5, False),  # the loss's key overridden alone
        ("pmd_partition", "mean", None, "pmd", None, True),  # both default to 0.01
        ("pmd_partition", "mean", None, "opmd", None, False),  # 0.01 (estimator) vs 1.0 (opmd loss)
        ("opmd", "logavgexp", 2.0, "opmd", 1.0, False),  # the logavgexp baseline reads τ too
        ("opmd", "mean", None, "opmd", 0.5, True),  # only the loss reads τ and nothing else is set
        ("rloo", "mean", 0.01, "pmd", 0.05, False),  # pmd_mean: algorithm.offpolicy.tau is the one key
        ("grpo", "mean", 0.3, "rec", None, True),  # rec reads no τ
    ],
)
def test_tau_is_one_hyperparameter_for_estimator_and_loss(estimator, baseline, algo_tau, loss_mode, loss_tau, accepted):
    from verl_offpolicy.glue.algorithms.opmd import check_tau_coupling

    offpolicy = OffPolicyConfig(tau=algo_tau, baseline=baseline)
    loss = OffPolicyLossConfig(loss_mode=loss_mode, tau=loss_tau)
    if accepted:
        check_tau_coupling(offpolicy, estimator, loss)
    else:
        with pytest.raises(
            ValueError, match=rf"{LOSS}.tau={loss_tau} \(loss_mode={loss_mode}\) and {ALGO}.tau={algo_tau}"
        ):
            check_tau_coupling(offpolicy, estimator, loss)


def test_clip_ratio_falls_back_to_clip_ratio_in_the_loss_and_at_startup():
    """ε_low = clip_ratio when clip_ratio_low is null: the same ε for the registered loss (an ActorConfig)
    and the startup validation (the composed DictConfig). ring ε′_low = 0.6 < clip_ratio = 0.7 fails both."""
    from tests.hydra_utils import VALID_SIZES
    from verl_offpolicy.glue.validation import validate_offpolicy_config

    message = rf"{LOSS}.ring_clip_ratio_low=0.6 must be >= actor_rollout_ref.actor.clip_ratio_low=0.7"
    actor = _rec_actor(clip_low=None, clip_ratio=0.7, clip_mode="ring")
    with pytest.raises(ValueError, match=message):
        _rec(actor)
    overrides = ["actor_rollout_ref.actor.clip_ratio_low=null", "actor_rollout_ref.actor.clip_ratio=0.7"]
    cfg = compose_main_ppo("offpolicy_trainer", ["algorithm=rec_ring_nois", *overrides, *VALID_SIZES])
    with pytest.raises(ValueError, match=message):
        validate_offpolicy_config(cfg)
