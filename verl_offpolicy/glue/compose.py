"""Composition of a ``verl.trainer.main_ppo`` command line, exactly as its Hydra app composes it: verl's
config module (``verl.trainer.config``) plus the search-path plugins Hydra discovers (ours adds
``pkg://verl_offpolicy.configs``). The one place that composes: the CLI (``check``, ``doctor``), the
tests and their FSDP2 harness all call :func:`compose_main_ppo`.
"""

from __future__ import annotations

from typing import Sequence

from verl_offpolicy.configs import preset_selector

MAIN_PPO_CONFIG_MODULE = "verl.trainer.config"


def compose_main_ppo(config_name: str, overrides: Sequence[str] = (), return_hydra_config: bool = False):
    """The config ``python -m verl.trainer.main_ppo --config-name <config_name> <overrides>`` would run
    (with the ``hydra`` node when ``return_hydra_config``: its callbacks are what main_ppo installs)."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_module(config_module=MAIN_PPO_CONFIG_MODULE, version_base=None):
        return compose(config_name=config_name, overrides=list(overrides), return_hydra_config=return_hydra_config)


def compose_preset(preset: str, config_name: str = "ppo_trainer", overrides: Sequence[str] = ()):
    """``config_name`` with ``preset`` selected by the one rule (:func:`verl_offpolicy.configs.preset_selector`)."""
    return compose_main_ppo(config_name, [preset_selector(preset, config_name), *overrides])
