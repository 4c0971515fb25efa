"""What verl's own ``validate_config`` needs beyond the stock defaults, shared by the config tests
(composition itself: :func:`verl_offpolicy.glue.compose.compose_main_ppo`)."""

import copy

from omegaconf import open_dict

from verl_offpolicy.glue.compose import compose_main_ppo

# Sizes only; nothing algorithmic.
VALID_SIZES = [
    "actor_rollout_ref.model.path=/not/loaded",
    "data.train_batch_size=16",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
    "trainer.n_gpus_per_node=2",
]


def compose_and_check(config_name: str, overrides: list[str]):
    """The config main_ppo would run, after every startup check ``verl-offpolicy check`` runs, in-process:
    the config's Hydra callbacks (our validation, CPU guards), our validation, verl's ``validate_config``
    and verl's actor config conversion. Raises what a check raises."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    from verl_offpolicy.cli import run_startup_callbacks
    from verl_offpolicy.glue.validation import validate_offpolicy_config

    full = compose_main_ppo(config_name, overrides, return_hydra_config=True)
    run_startup_callbacks(full)
    cfg = copy.deepcopy(full)
    with open_dict(cfg):
        del cfg["hydra"]  # what main_ppo's task receives
    validate_offpolicy_config(cfg)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    return cfg
