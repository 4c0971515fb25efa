"""``verl-offpolicy demo --model``: the choice is checked before anything starts, and each model's
settings land on main_ppo's command line between the preset and the caller's overrides
(``run_overrides``, the tail of ``demo_command``'s command line)."""

import os
from pathlib import Path

import pytest

from tests.hydra_utils import compose_and_check
from verl_offpolicy.cli import main
from verl_offpolicy.demo.command import preset_overrides, run_overrides
from verl_offpolicy.demo.models import get_model, model_names

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_unknown_model_is_one_clear_error(capsys, tmp_path):
    assert main(["demo", "--model", "gpt-5", "--output-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"unknown --model 'gpt-5'; allowed: {', '.join(model_names())}" in err
    assert {"tiny", "tiny-h32", "tiny-tool", "smollm2-135m"} <= set(model_names())
    assert not (tmp_path / "o").exists()  # nothing was created


def test_smollm2_settings_sit_between_preset_and_caller_overrides():
    command = run_overrides("opmd", "offpolicy_trainer", "smollm2-135m", ["data.max_response_length=32"])
    preset = command.index("algorithm=opmd")
    reward = command.index("reward.custom_reward_function.path=pkg://verl_offpolicy.rewards.math_verify_reward")
    lr = command.index("actor_rollout_ref.actor.optim.lr=1e-5")
    ours = command.index("data.max_response_length=48")
    caller = command.index("data.max_response_length=32")  # Hydra: the last one wins
    assert preset < min(reward, lr, ours) and max(reward, lr, ours) < caller == len(command) - 1


def test_tiny_model_keeps_the_repeat_task_settings():
    command = run_overrides("agro", "offpolicy_trainer", "tiny")
    assert "algorithm.offpolicy.beta=0.01" in command  # AGRO's β for the repeat task's spread-out reward
    assert not any(c.startswith("reward.custom_reward_function") for c in command)  # +cpu=demo's repeat-task reward
    # the arithmetic task's 0/1 reward keeps the preset's β
    assert "algorithm.offpolicy.beta=0.01" not in preset_overrides("agro", "offpolicy_trainer", "smollm2-135m")


def test_the_demo_help_names_every_model(capsys):
    """The --model help is written by hand (the parser is built before any demo module may be imported): it must
    name every model of verl_offpolicy.demo.models."""
    from verl_offpolicy.demo.models import model_names

    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert [name for name in model_names() if f"{name} (" not in text] == []


def test_the_study_model_composes_to_its_setting(tmp_path, monkeypatch):
    """smollm2-135m-2step with the study's overrides (benchmarks/smollm2_study.py, stale setting) composes through
    Hydra and every startup check into the setting the study states: 2 prompts x 8 samples at T = 0.7, 64 response
    tokens, bf16 compute, a string OMP_NUM_THREADS for Ray, the (4, 4) schedule."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import smollm2_study

    tail = run_overrides(
        "rec_oneside_nois",
        "offpolicy_trainer",
        smollm2_study.MODEL,
        smollm2_study.study_overrides((4, 4), tmp_path / "run"),
    )
    keys = [o.lstrip("+").split("=", 1)[0] for o in get_model(smollm2_study.MODEL).overrides]
    assert len(keys) == len(set(keys))  # each setting once
    cfg = compose_and_check("offpolicy_trainer", ["+cpu=demo", f"actor_rollout_ref.model.path={tmp_path}", *tail])
    rollout, actor = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
    assert (cfg.data.train_batch_size, rollout.n, rollout.temperature, cfg.data.max_response_length) == (2, 8, 0.7, 64)
    assert actor.ppo_mini_batch_size == 2 and 16 % actor.ppo_micro_batch_size_per_gpu == 0
    assert actor.fsdp_config.mixed_precision.param_dtype == "bf16" and rollout.dtype == "bfloat16"
    assert actor.fsdp_config.mixed_precision.reduce_dtype == "fp32"  # fp32 gradient reduce (master weights fp32)
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS == str(os.cpu_count())
    assert (cfg.algorithm.offpolicy.sync_interval, cfg.algorithm.offpolicy.sync_offset) == (4, 4)
    assert cfg.trainer.save_freq == 10 and cfg.trainer.test_freq == 10 and cfg.trainer.val_before_train


def test_the_studys_noise_yardstick_is_the_largest_drop_within_one_run(monkeypatch):
    """The report's noise line: the largest fall of one run's accuracy between consecutive evaluations; rises
    (learning) do not count, nor do differences between runs. By hand: run a falls 0.5 -> 0.3 (0.2) and later
    rises by 0.3; run b falls 0.25 -> 0.2 (0.05); b's 0.45 rise and the a-to-b gap are larger and ignored."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import smollm2_study

    records = {
        ("a", (1, 0)): {"validation": {"0": 0.2, "10": 0.5, "20": 0.3, "30": 0.6}},
        ("b", (4, 4)): {
            "validation": {"20": 0.2, "0": 0.2, "10": 0.25, "30": 0.65}
        },  # keys out of order, as JSON may hold them
    }
    drop, where = smollm2_study.largest_drop(records)
    assert drop == pytest.approx(0.2) and where == "a (1, 0), steps 10 -> 20"
