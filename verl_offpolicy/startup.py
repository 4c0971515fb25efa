"""The startup callback of every verl-offpolicy config, importable even from a broken installation.

:class:`StartupValidation` is the Hydra callback installed by every preset and by our primary configs
(``configs/offpolicy_shared/validation.yaml``). Before ``verl.trainer.main_ppo`` starts Ray or any
worker it checks that ``algorithm=`` names a preset, not verl's own file of that group
(:func:`check_algorithm_choice`), that the Ray
workers' environment lets ``import verl`` load verl-offpolicy (:func:`check_workers_plugin_setting`) and
runs :func:`verl_offpolicy.glue.validation.validate_offpolicy_config`, then the checks that call the user's code
(the DAPO filter metric against the reward function's answer). What the command line replaces of the selected
preset (:mod:`verl_offpolicy.glue.preset_overrides`) is checked first: a key that defines the preset's algorithm
stops the run, every other replaced preset key is printed once as a note, and an error that names a key the
command line replaced says so.

This module imports only the standard library, Hydra and OmegaConf at import time. Hydra instantiates
callbacks before running them, so if our validation code itself could not import (a broken install,
a missing dependency), a callback defined there would stop ``main_ppo`` with Hydra's "Error locating
target" and no cause; here the import happens inside the callback and :func:`import_failure_message`
turns its error into one line naming the file and the cause.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from verl_offpolicy.configs import PRESET_GROUP, preset_names
from verl_offpolicy.glue.broken_install import BrokenInstallError, import_failure_message


def import_validation():
    """``validate_offpolicy_config``, or :class:`BrokenInstallError` with one readable line."""
    module = "verl_offpolicy.glue.validation"
    try:
        from verl_offpolicy.glue.validation import validate_offpolicy_config
    except Exception as exc:
        raise BrokenInstallError(import_failure_message(module, exc)) from exc
    return validate_offpolicy_config


def verl_group_files(group: str) -> list[str]:
    """The config names of verl's own Hydra group ``group`` (``verl/trainer/config/<group>/*.yaml``), found
    without importing verl."""
    spec = importlib.util.find_spec("verl")
    folders = [Path(p) / "trainer" / "config" / group for p in (spec.submodule_search_locations or [])] if spec else []
    return sorted(f.stem for folder in folders if folder.is_dir() for f in folder.glob("*.yaml"))


def check_algorithm_choice(config: DictConfig) -> None:
    """Raise ``ValueError`` if ``algorithm=`` (Hydra's choice of the ``algorithm`` group) names one of verl's own files.

    verl's ``algorithm/rollout_correction.yaml`` is in the same group but is not an algorithm; it is mounted
    by verl under ``algorithm.rollout_correction``, a different choice key. Any other file of the group is a
    preset: ours, or the user's own on their Hydra search path (validated like ours).
    """
    choices = OmegaConf.select(config, "hydra.runtime.choices", default=None) or {}
    choice = choices.get(PRESET_GROUP)
    if choice is not None and choice not in preset_names() and choice in verl_group_files(PRESET_GROUP):
        raise ValueError(
            f"{PRESET_GROUP}={choice} is not a verl-offpolicy preset (it is verl's own config); allowed values: "
            f"{', '.join(preset_names())} (`verl-offpolicy list` describes them), or a preset of your own: "
            f"{PRESET_GROUP}/<name>.yaml in a folder on Hydra's search path (docs/extending.md)"
        )


WORKER_ENV_KEY = "ray_kwargs.ray_init.runtime_env.env_vars"


def workers_environment(config: DictConfig) -> dict[str, str]:
    """The environment of this run's Ray workers: this process's plus the config's
    ``ray_kwargs.ray_init.runtime_env.env_vars``."""
    extra = OmegaConf.select(config, WORKER_ENV_KEY, default=None)
    if OmegaConf.is_config(extra):
        extra = OmegaConf.to_container(extra, resolve=True)
    return {**os.environ, **{str(k): str(v) for k, v in (extra or {}).items()}}


def selected_names(config: DictConfig) -> list[str]:
    """``key=name`` for every name of ours the config selects (``algorithm.adv_estimator=opmd``, ...)."""
    from verl_offpolicy.glue.registration import expected_names

    return sorted(
        {f"{e.config_key}={e.name}" for e in expected_names() if OmegaConf.select(config, e.config_key) == e.name}
    )


def check_workers_plugin_setting(config: DictConfig) -> None:
    """Raise ``ValueError`` if the Ray workers' environment keeps ``import verl`` from loading verl-offpolicy.

    ``VERL_USE_EXTERNAL_PLUGINS=none`` (or a list without ``verl_offpolicy``) leaves every worker without
    our trainer, estimators and losses: verl would start Ray and fail a minute later with "Unknown trainer
    'offpolicy'". This process registers on its own (the validation imports our modules), so it cannot tell.
    """
    from verl_offpolicy.glue.plugin_setting import plugin_setting_problem

    problem = plugin_setting_problem(workers_environment(config))
    if problem:
        used = ", ".join(selected_names(config))
        raise ValueError(
            f"the Ray workers of this run will not have verl-offpolicy{f' ({used})' if used else ''}: {problem}"
        )


CLUSTER_ADDRESS_KEY = "ray_kwargs.ray_init.address"
CLUSTER_CHECK_TIMEOUT_S = 600.0  # a fresh worker on every node imports verl (minutes on a loaded machine)


def check_cluster_nodes(config: DictConfig) -> None:
    """Joining an existing cluster (``ray_kwargs.ray_init.address``): a fresh worker on every node, with this
    run's runtime_env variables, must load verl-offpolicy; else ``ValueError`` naming the node (verl would fail
    later with "Unknown platform" or "Unknown trainer" and no node named). The cluster's nodes have their own
    environments, which this process cannot see (``verl-offpolicy doctor --address`` shows the same report)."""
    address = OmegaConf.select(config, CLUSTER_ADDRESS_KEY, default=None)
    if not address or not selected_names(config):
        return
    from verl_offpolicy.doctor import ProbeError, cluster_run_problems

    extra = OmegaConf.select(config, WORKER_ENV_KEY, default=None)
    env_vars = {
        str(k): str(v)
        for k, v in (OmegaConf.to_container(extra, resolve=True) if OmegaConf.is_config(extra) else extra or {}).items()
    }
    try:
        problems = cluster_run_problems(str(address), dict(os.environ), env_vars, CLUSTER_CHECK_TIMEOUT_S)
    except ProbeError as exc:
        raise ValueError(f"{CLUSTER_ADDRESS_KEY}={address}: {exc}") from None
    if problems:
        raise ValueError(
            f"{CLUSTER_ADDRESS_KEY}={address}: the Ray workers of these nodes will not have verl-offpolicy ("
            f"{', '.join(selected_names(config))}): "
            + "; ".join(problems)
            + ". Start those nodes' raylets with verl-offpolicy installed and loadable (`verl-offpolicy doctor "
            "--address`)"
        )


class StartupValidation(Callback):
    """Hydra callback: validates before ``main_ppo`` runs; exits with the message on a bad config.

    Hydra turns an ``Exception`` raised by a callback into a warning, so the failure is raised as
    ``SystemExit`` carrying the message (exit status 1, nothing started).
    """

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            # The presets' resolvers (the trainer's mode, the mini-batch), also where verl did not load our plugin:
            # the checks below read the config, and the one that finds the plugin disabled names the fix.
            from verl_offpolicy.glue.resolvers import register_resolvers

            register_resolvers()
            check_algorithm_choice(config)
            validate = import_validation()
            check_workers_plugin_setting(config)
        except BrokenInstallError as exc:
            raise SystemExit(f"verl-offpolicy: {exc}") from exc
        except Exception as exc:
            raise SystemExit(f"verl-offpolicy: invalid configuration: {exc}") from exc
        from verl_offpolicy.glue.preset_overrides import (
            caused_by_command_line,
            check_defining_keys,
            override_notes,
            replaced_keys,
        )

        replaced = replaced_keys(config)  # the selected preset's keys the command line replaced, read once

        try:
            check_defining_keys(config, replaced)
            validate(config)
            from verl_offpolicy.glue.scheduler.filtering import check_filter_metric

            check_filter_metric(config)
            check_cluster_nodes(config)
        except Exception as exc:
            raise SystemExit(
                f"verl-offpolicy: invalid configuration: {caused_by_command_line(exc, config, replaced)}"
            ) from exc
        for note in override_notes(config, replaced):
            print(f"verl-offpolicy: note: {note}", file=sys.stderr, flush=True)
