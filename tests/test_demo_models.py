"""``verl-offpolicy demo --model``: the choice is checked before anything starts, and each model's
settings land on main_ppo's command line between the preset and the caller's overrides
(``run_overrides``, the tail of ``demo_command``'s command line)."""

from verl_offpolicy.cli import main
from verl_offpolicy.demo.command import preset_overrides, run_overrides


def test_unknown_model_is_one_clear_error(capsys, tmp_path):
    assert main(["demo", "--model", "gpt-5", "--output-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "unknown --model 'gpt-5'; allowed: tiny, tiny-h32, smollm2-135m" in err
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
