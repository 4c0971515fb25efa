"""What verl's own ``validate_config`` needs beyond the stock defaults, shared by the config tests
(composition itself: :func:`verl_offpolicy.glue.compose.compose_main_ppo`)."""

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
    """The config main_ppo would run, after every startup check ``verl-offpolicy check`` runs, in-process
    (``verl_offpolicy.cli.run_startup_checks``). Raises what a check raises."""
    from verl_offpolicy.cli import run_startup_checks

    return run_startup_checks(compose_main_ppo(config_name, overrides, return_hydra_config=True))[0]
