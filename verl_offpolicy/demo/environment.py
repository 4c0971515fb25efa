"""The environment ``main_ppo`` runs in: the CPU path's variables, and caches, temporary files and Ray's
token kept under the run's dirs.

Unless those variables are set: the datasets cache (``HF_DATASETS_CACHE``) and matplotlib's font
cache (``MPLCONFIGDIR``) go under ``output_dir/.cache``; temporary files (``TMPDIR``: verl's checkpoint
locks among them) and Ray's session token (``RAY_AUTH_TOKEN_PATH``; Ray would otherwise create
``~/.ray/auth_token``, unless a Ray token or ``RAY_AUTH_MODE`` is set) into the Ray temp dir, which is
removed after the run.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Mapping, Optional

from verl_offpolicy.cpu.platform import CPU_ENV, LOOPBACK_ENV
from verl_offpolicy.demo.output_dir import CACHE_NAME


def run_files_env(output_dir: str | os.PathLike, ray_temp_dir: Optional[str], base: dict[str, str]) -> dict[str, str]:
    """Variables that keep the caches and Ray's token of a run under ``output_dir`` / ``ray_temp_dir``.

    A variable the caller has set is kept. The Ray token file (a fresh random token, mode 0600) and
    the run's ``TMPDIR`` (:data:`TMP_NAME`) are in ``ray_temp_dir``, so they are removed with it.
    """
    cache = Path(output_dir) / CACHE_NAME
    env = {}
    if "HF_DATASETS_CACHE" not in base:
        env["HF_DATASETS_CACHE"] = str(cache / "huggingface" / "datasets")
    if "MPLCONFIGDIR" not in base:
        env["MPLCONFIGDIR"] = str(cache / "matplotlib")
    if "VLLM_CACHE_ROOT" not in base:  # vLLM's compile and model caches (default ~/.cache/vllm)
        env["VLLM_CACHE_ROOT"] = str(cache / "vllm")
    if ray_temp_dir:
        env.update(ray_token_env(ray_temp_dir, base))
        if "TMPDIR" not in base:
            # verl's checkpoint code leaves a lock file per directory it creates in the temp dir
            # (verl/utils/fs.py, local_mkdir_safe: /tmp/ckpt_<hash>.lock, three per checkpoint).
            tmp = Path(ray_temp_dir) / TMP_NAME
            tmp.mkdir(mode=0o700, exist_ok=True)
            env["TMPDIR"] = str(tmp)
    return env


# The run's temporary files (``TMPDIR``), under its Ray temp dir: removed with it.
TMP_NAME = "tmp"
RAY_TOKEN_VARIABLES = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE")


def ray_token_env(ray_temp_dir: str | os.PathLike, base: Mapping[str, str]) -> dict[str, str]:
    """``RAY_AUTH_TOKEN_PATH`` of a fresh random token written to ``ray_temp_dir/auth_token`` (mode 0600).

    A new local Ray cluster enables token authentication and, without this, writes its token to
    ``~/.ray/auth_token`` with the default umask (world-readable) and leaves it there. Nothing is done
    (empty dict) when ``base`` sets any of :data:`RAY_TOKEN_VARIABLES`: the caller chose.
    """
    if set(RAY_TOKEN_VARIABLES) & set(base):
        return {}
    token = Path(ray_temp_dir) / "auth_token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return {"RAY_AUTH_TOKEN_PATH": str(token)}


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
