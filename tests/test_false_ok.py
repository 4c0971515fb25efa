"""Values that passed ``verl-offpolicy check`` and then failed, trained nothing or were silently reinterpreted.

Each case composes a command line and runs every startup check in this process, as ``check`` does
(:func:`tests.hydra_utils.compose_and_check`: ``run_startup_checks`` of ``verl_offpolicy.cli``), and expects the
refusal to name the key and the value (and what to set), or the startup warning to name the setting.
"""

from __future__ import annotations

import logging

import pytest

from tests.hydra_utils import VALID_SIZES, compose_and_check

BASE = ["algorithm=opmd", *VALID_SIZES, "actor_rollout_ref.rollout.calculate_log_probs=true"]
RC = "algorithm.rollout_correction"


def _refused(overrides: list[str], *fragments: str, config_name: str = "offpolicy_trainer", base=BASE) -> str:
    with pytest.raises(ValueError) as caught:
        compose_and_check(config_name, [*base, *overrides])
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


# ------------------------------------------------------------------------ verl's rollout correction


@pytest.mark.parametrize(
    "overrides,fragments",
    [
        ([f"{RC}.rollout_is=bogus"], [f"{RC}.rollout_is='bogus'", "Must be one of", "'sequence'", "'token'"]),
        ([f"{RC}.rollout_rs=bogus"], [f"{RC}.rollout_rs='bogus'", "seq_mean_k1", "token_k3"]),
        ([f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=abc"], [f"{RC}.rollout_is_threshold='abc'", "lower <= upper"]),
        ([f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=-1"], [f"{RC}.rollout_is_threshold=-1", "must be positive"]),
        # an inverted IcePop band: verl would refuse it in the trainer's first step
        ([f"{RC}.rollout_is=sequence", f"{RC}.rollout_is_threshold=2.0_0.5"], [f"{RC}.rollout_is_threshold='2.0_0.5'", "lower bound must be <= upper"]),
        ([f"{RC}.rollout_is_threshold=nan"], [f"{RC}.rollout_is_threshold=nan", "is not a number"]),
        ([f"{RC}.rollout_rs=seq_mean_k3"], [f"{RC}.rollout_rs_threshold=None", "must be provided"]),
        ([f"{RC}.rollout_rs=seq_mean_k3", f"{RC}.rollout_rs_threshold=0.5_2.0"], [f"{RC}.rollout_rs_threshold='0.5_2.0'", "single upper bound"]),
        ([f"{RC}.loss_type=bogus"], [f"{RC}.loss_type='bogus'", "reinforce", "ppo_clip"]),
        ([f"{RC}.bypass_mode=yes"], [f"{RC}.bypass_mode must be true or false, got 'yes'"]),
    ],
)
def test_rollout_correction_values_are_verls(overrides, fragments):
    _refused(overrides, *fragments)


def test_rollout_correction_values_verl_accepts_pass():
    compose_and_check("offpolicy_trainer", [*BASE, f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=0.5_5.0"])
    compose_and_check("offpolicy_trainer", [*BASE, f"{RC}.rollout_rs='token_k1,seq_mean_k3'", f"{RC}.rollout_rs_threshold='0.5_2.0,0.01'"])


def test_an_icepop_band_without_ratio_1_is_warned_at_startup(caplog):
    with caplog.at_level(logging.WARNING, logger="verl_offpolicy"):
        compose_and_check("offpolicy_trainer", [*BASE, f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=1.25_3.5"])
    warned = [r.getMessage() for r in caplog.records if "excludes ratio 1" in r.getMessage()]
    assert len(warned) == 1 and f"{RC}.rollout_is_threshold=1.25_3.5" in warned[0] and "[1.25, 3.5]" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="verl_offpolicy"):  # a band around 1: no warning
        compose_and_check("offpolicy_trainer", [*BASE, f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=0.25_4.5"])
    assert not [r for r in caplog.records if "excludes ratio 1" in r.getMessage()]


# ------------------------------------------------------------------------ verl's legacy trainer


def test_the_legacy_trainer_refuses_the_overlapped_mode():
    # verl's RayPPOTrainer asserts a hybrid engine in its constructor, after Ray started
    _refused(["trainer.use_v1=false", "actor_rollout_ref.hybrid_engine=false"],
             "trainer.use_v1=false", "actor_rollout_ref.hybrid_engine=false", "set actor_rollout_ref.hybrid_engine=true")
    compose_and_check("offpolicy_trainer", [*BASE, "trainer.use_v1=false"])  # colocated: runs on the legacy trainer


# ------------------------------------------------------------------------ upper bounds, sampling values

MATH_VERIFY = ["reward.custom_reward_function.path=pkg://verl_offpolicy.rewards.math_verify_reward"]
TIMEOUT_KEY = "reward.custom_reward_function.reward_kwargs.timeout_seconds"


def test_timeouts_above_what_the_platforms_timers_hold_are_refused(monkeypatch):
    """1e10 s passed startup, then every wait on it raised OverflowError; threading.TIMEOUT_MAX is the bound."""
    import threading

    limit = f"{threading.TIMEOUT_MAX:.0f}"
    _refused([*MATH_VERIFY, f"+{TIMEOUT_KEY}=1e10"], f"{TIMEOUT_KEY} must be", "got 10000000000.0", f"at most {limit}")
    compose_and_check("offpolicy_trainer", [*BASE, *MATH_VERIFY, f"+{TIMEOUT_KEY}=1e9"])
    monkeypatch.setenv("VERL_OFFPOLICY_GENERATION_TIMEOUT", "1e10")
    _refused([], "VERL_OFFPOLICY_GENERATION_TIMEOUT must be a number of seconds > 0, got '1e10'", f"at most {limit}")
    monkeypatch.setenv("VERL_OFFPOLICY_GENERATION_TIMEOUT", "1e9")
    compose_and_check("offpolicy_trainer", BASE)


@pytest.mark.parametrize(
    "override,fragment",
    [
        ("actor_rollout_ref.rollout.top_p=1.5", "actor_rollout_ref.rollout.top_p=1.5 is not valid; allowed: a number in (0, 1]"),
        ("actor_rollout_ref.rollout.top_p=0", "actor_rollout_ref.rollout.top_p=0 is not valid"),
        ("actor_rollout_ref.rollout.temperature=0", "actor_rollout_ref.rollout.temperature=0 is not valid; allowed: a number > 0"),
        ("actor_rollout_ref.rollout.temperature=-0.5", "actor_rollout_ref.rollout.temperature=-0.5 is not valid"),
        ("actor_rollout_ref.rollout.val_kwargs.top_p=2", "actor_rollout_ref.rollout.val_kwargs.top_p=2 is not valid"),
        ("actor_rollout_ref.rollout.val_kwargs.temperature=-1", "actor_rollout_ref.rollout.val_kwargs.temperature=-1 is not valid"),
    ],
)
def test_sampling_values_the_engines_refuse_are_refused_at_startup(override, fragment):
    _refused([override], fragment)


def test_greedy_validation_and_a_reshaped_rollout_pass():
    compose_and_check("offpolicy_trainer", [
        *BASE, "actor_rollout_ref.rollout.val_kwargs.temperature=0", "actor_rollout_ref.rollout.temperature=0.7",
        "actor_rollout_ref.rollout.top_p=0.9",
    ])
