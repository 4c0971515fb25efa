"""Hydra composition exactly as stock ``verl.trainer.main_ppo`` does it (its config module plus the
search-path plugins discovered by Hydra), shared by the config tests."""

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

# What verl's own validate_config needs beyond the stock defaults (sizes only; nothing algorithmic).
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


def compose_main_ppo(config_name: str, overrides: list[str], return_hydra_config: bool = False):
    """Compose ``config_name`` through main_ppo's config module (``verl.trainer.config``)."""
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name=config_name, overrides=overrides, return_hydra_config=return_hydra_config)



def compose_and_check(config_name: str, overrides: list[str]):
    """The config main_ppo would run, after every startup check ``verl-offpolicy check`` runs, in-process
    (``verl_offpolicy.cli.run_startup_checks``). Raises what a check raises."""
    from verl_offpolicy.cli import run_startup_checks

    return run_startup_checks(compose_main_ppo(config_name, overrides, return_hydra_config=True))[0]
