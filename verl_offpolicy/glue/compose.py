"""Composition of a ``verl.trainer.main_ppo`` command line, exactly as its Hydra app composes it: verl's
``@hydra.main(config_path="config", config_name="ppo_trainer")`` of ``verl/trainer/main_ppo.py``, Hydra's own
options (``--config-path/-cp``, ``--config-dir/-cd``, ``--config-name/-cn``, parsed by Hydra's parser) and the
search-path plugins Hydra discovers (ours adds ``pkg://verl_offpolicy.configs``). The one place that composes:
the CLI (``check``, ``doctor``), the tests and their FSDP2 harness all call :func:`compose_main_ppo_argv` or
:func:`compose_main_ppo`.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Sequence

from verl_offpolicy.configs import preset_selector

MAIN_PPO_MODULE = "verl.trainer.main_ppo"
# main_ppo's @hydra.main arguments (verl/trainer/main_ppo.py)
MAIN_PPO_CONFIG_PATH = "config"
MAIN_PPO_CONFIG_NAME = "ppo_trainer"


def main_ppo_file() -> str:
    """The path of ``verl/trainer/main_ppo.py`` (found without importing it): a relative ``--config-path`` is
    relative to its folder, as for Hydra's ``@hydra.main`` in a file run with ``python -m``."""
    spec = importlib.util.find_spec(MAIN_PPO_MODULE)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"{MAIN_PPO_MODULE} is not importable: is verl installed?")
    return spec.origin


def compose_main_ppo_argv(argv: Sequence[str], return_hydra_config: bool = False):
    """The config ``python -m verl.trainer.main_ppo <argv>`` would run: Hydra's parser reads the options
    (``--config-path/-cp``, ``--config-dir/-cd``, ``--config-name/-cn``) and the overrides, and the search path
    is built as Hydra's ``_run_hydra`` builds it for main_ppo."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_automatic_config_search_path, get_args_parser
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import validate_config_path
    from hydra.errors import SearchPathException
    from hydra.types import RunMode
    from omegaconf import open_dict

    args = get_args_parser().parse_args(list(argv))
    config_path = MAIN_PPO_CONFIG_PATH if args.config_path is None else args.config_path
    config_name = MAIN_PPO_CONFIG_NAME if args.config_name is None else args.config_name
    validate_config_path(config_path)
    search_path = create_automatic_config_search_path(main_ppo_file(), None, config_path)
    if args.config_dir is not None:
        config_dir = os.path.abspath(args.config_dir)
        if not os.path.isdir(config_dir):
            raise SearchPathException(f"Additional config directory '{config_dir}' not found")
        search_path.prepend(provider="command-line", path=f"file://{config_dir}")
    GlobalHydra.instance().clear()
    hydra = Hydra.create_main_hydra2(task_name="main_ppo", config_search_path=search_path)
    try:
        cfg = hydra.compose_config(
            config_name=config_name,
            overrides=list(args.overrides),
            run_mode=RunMode.RUN,
            from_shell=True,
            with_log_configuration=False,
        )
    finally:
        GlobalHydra.instance().clear()
    if not return_hydra_config and "hydra" in cfg:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


def compose_main_ppo(config_name: str, overrides: Sequence[str] = (), return_hydra_config: bool = False):
    """The config ``python -m verl.trainer.main_ppo --config-name <config_name> <overrides>`` would run
    (with the ``hydra`` node when ``return_hydra_config``: its callbacks are what main_ppo installs)."""
    return compose_main_ppo_argv(["--config-name", config_name, *overrides], return_hydra_config)


def compose_preset(preset: str, config_name: str = "ppo_trainer", overrides: Sequence[str] = ()):
    """``config_name`` with ``preset`` selected by the one rule (:func:`verl_offpolicy.configs.preset_selector`)."""
    return compose_main_ppo(config_name, [preset_selector(preset, config_name), *overrides])
