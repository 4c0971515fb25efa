"""The environment ``main_ppo`` runs in: the CPU path's variables, and caches and Ray's token kept under the run's dirs.

Unless those variables are set: the datasets cache (``HF_DATASETS_CACHE``) and matplotlib's font
cache (``MPLCONFIGDIR``) go under ``output_dir/.cache``, and Ray's session token into the Ray temp
dir (``RAY_AUTH_TOKEN_PATH``; Ray would otherwise create ``~/.ray/auth_token``) unless a Ray token
or ``RAY_AUTH_MODE`` is set.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Optional

from verl_offpolicy.cpu.platform import CPU_ENV, LOOPBACK_ENV
from verl_offpolicy.demo.output_dir import CACHE_NAME


def run_files_env(output_dir: str | os.PathLike, ray_temp_dir: Optional[str], base: dict[str, str]) -> dict[str, str]:
    """Variables that keep the caches and Ray's token of a run under ``output_dir`` / ``ray_temp_dir``.

    A variable the caller has set is kept. The Ray token file (a fresh random token, mode 0600) is
    written to ``ray_temp_dir``, so it is removed with it.
    """
    cache = Path(output_dir) / CACHE_NAME
    env = {}
    if "HF_DATASETS_CACHE" not in base:
        env["HF_DATASETS_CACHE"] = str(cache / "huggingface" / "datasets")
    if "MPLCONFIGDIR" not in base:
        env["MPLCONFIGDIR"] = str(cache / "matplotlib")
    if ray_temp_dir and not {"RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"} & set(base):
        token = Path(ray_temp_dir) / "auth_token"
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        env["RAY_AUTH_TOKEN_PATH"] = str(token)
    return env


def cpu_env(metrics_path: str | os.PathLike, base: Optional[dict[str, str]] = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with the CPU path's variables and verl's metrics file."""
    env = dict(os.environ if base is None else base)
    env.update(CPU_ENV)
    env.update(LOOPBACK_ENV)
    env["VERL_FILE_LOGGER_PATH"] = str(metrics_path)
    env["PYTHONUNBUFFERED"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    env.setdefault("RAY_DEDUP_LOGS", "0")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    return env
