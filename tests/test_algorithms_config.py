"""Invalid hyperparameters of the estimators and losses fail with messages naming the full key and the
allowed values, wherever they are used: the typed configs, the registered functions, Hydra composition."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.errors import InstantiationException
from omegaconf import OmegaConf

import verl  # noqa: F401  (loads the verl.plugins entry point: registers our names)
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import ActorConfig
from verl_offpolicy.glue.config import OffPolicyConfig, OffPolicyLossConfig

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
    with pytest.raises(ValueError, match=message):
        OffPolicyLossConfig(**kwargs)


def test_opmd_loss_accepts_tau_zero():
    assert OffPolicyLossConfig(loss_mode="opmd", tau=0.0).tau == 0.0  # spec: τ ≥ 0 for opmd


def _estimate(name, **offpolicy):
    config = OmegaConf.create({"adv_estimator": name, "offpolicy": offpolicy})
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


def _rec_actor(clip_low=0.2, clip_high=0.2, **loss_kw):
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio_low=clip_low,
        clip_ratio_high=clip_high,
        policy_loss=OffPolicyLossConfig(loss_mode="rec", **loss_kw),
    )


def _rec(config):
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
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        cfg = compose(
            config_name="ppo_trainer",
            overrides=[
                f"{LOSS}._target_=verl_offpolicy.glue.config.OffPolicyLossConfig",
                f"{LOSS}.loss_mode=rec",
                f"+{LOSS}.clip_mode=sideways",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            ],
        )
    with pytest.raises(InstantiationException, match=rf"{LOSS}.clip_mode='sideways' is not valid; allowed values"):
        omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def test_offpolicy_section_defaults_match_the_spec():
    section = OffPolicyConfig()
    assert (section.baseline, section.shift, section.temperature, section.beta, section.on_policy) == (
        "mean",
        -0.1,
        1.0,
        0.1,
        False,
    )
    # τ left unset takes each consumer's default from the spec: opmd 1.0, pmd_partition 0.01, pmd loss 0.01.
    assert (section.tau_for("opmd"), section.tau_for("pmd_partition")) == (1.0, 0.01)
    assert OffPolicyConfig(tau=0.3).tau_for("pmd_partition") == 0.3
    loss = OffPolicyLossConfig()
    assert (loss.ring_clip_ratio_low, loss.ring_clip_ratio_high) == (0.6, 2.0)
    assert OffPolicyLossConfig(loss_mode="pmd").resolved_tau == 0.01
    assert OffPolicyLossConfig(loss_mode="opmd").resolved_tau == 1.0
