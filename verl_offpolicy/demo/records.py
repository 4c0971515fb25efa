"""A run's records across re-runs in one output directory: nothing is deleted, a restart is visible.

Re-running a demo command in the same ``output_dir`` continues it: verl's ``main_ppo`` resumes from the
latest checkpoint there (``trainer.resume_mode=auto``, verl's default; checkpoints only with
``trainer.save_freq > 0``). :func:`resume_step` says from which step, as verl will find it.

- ``train.log`` is appended to, after a banner line (:func:`log_banner`).
- ``metrics.jsonl``: verl's file logger truncates the file it opens, so a run that finds earlier records
  has verl write :data:`PART_NAME` and appends it to ``metrics.jsonl`` when it ends, however it ends
  (:func:`merge_part`; a run killed before that is merged at the next start). Before the new records,
  one restart record ``{"step": k, "data": {RESTART_KEY: k}}`` says that the run continues after step
  ``k`` (0: from scratch); :func:`verl_offpolicy.demo.results.read_metrics` then lets the new records of
  steps after ``k`` replace the earlier ones, which stay in the file.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Sequence

from verl_offpolicy.demo.errors import DemoInputError
from verl_offpolicy.demo.output_dir import LOG_NAME, METRICS_NAME

PART_NAME = ".metrics.part.jsonl"  # what verl's file logger writes while a re-run runs
RESTART_KEY = "cpu_demo/restarted_after_step"
TRACKER_NAME = "latest_checkpointed_iteration.txt"  # verl's checkpoint tracker (written once a checkpoint is complete)


def _settings(overrides: Sequence[str]) -> dict[str, str]:
    """``key -> value`` of Hydra overrides (the last one of a key wins, as in Hydra)."""
    settings = {}
    for override in overrides:
        key, sep, value = override.lstrip("+~").partition("=")
        if sep:
            settings[key] = value
    return settings


def resume_step(output_dir: Path, overrides: Sequence[str]) -> int:
    """The step ``main_ppo`` run in ``output_dir`` (its working directory) with the demo's ``overrides``
    resumes from, found as verl's ``_load_checkpoint`` finds it; 0: it starts from scratch."""
    settings = _settings(overrides)
    mode = settings.get("trainer.resume_mode", "auto")
    if mode == "disable":
        return 0
    if mode == "resume_path":
        match = re.search(r"global_step_(\d+)", settings.get("trainer.resume_from_path", ""))
        return int(match.group(1)) if match else 0
    folder = Path(settings.get("trainer.default_local_dir", output_dir / "checkpoints"))
    folder = folder if folder.is_absolute() else output_dir / folder
    try:
        step = int((folder / TRACKER_NAME).read_text().strip())
    except (OSError, ValueError):
        return 0
    return step if (folder / f"global_step_{step}").is_dir() else 0


def continued_step(output_dir: Path, overrides: Sequence[str], steps: int) -> int:
    """:func:`resume_step` for a run of ``steps`` steps; a checkpoint at or past ``steps`` (nothing to train)
    raises :class:`~verl_offpolicy.demo.errors.DemoInputError` saying what to do."""
    resumed = resume_step(output_dir, overrides)
    if resumed >= steps:
        raise DemoInputError(
            f"{output_dir} holds a checkpoint of step {resumed}: a run of {steps} steps resumed from it has nothing "
            f"to train. Pass --steps > {resumed} to continue it, trainer.resume_mode=disable to start afresh here "
            "(the earlier records are kept), or another --output-dir"
        )
    return resumed


def merge_part(output_dir: Path) -> None:
    """Append what verl logged into :data:`PART_NAME` to ``metrics.jsonl``, then remove the part file."""
    part = output_dir / PART_NAME
    if not part.exists():
        return
    with open(output_dir / METRICS_NAME, "ab") as metrics, open(part, "rb") as new:
        shutil.copyfileobj(new, metrics)
    part.unlink()


def start_records(output_dir: Path, resumed: int) -> Path:
    """Prepare the records of a run that continues after step ``resumed`` (0: from scratch), keeping every
    earlier one; return the file verl's file logger is to write (``metrics.jsonl``, or :data:`PART_NAME`
    after a restart record if ``metrics.jsonl`` holds earlier records)."""
    merge_part(output_dir)
    metrics = output_dir / METRICS_NAME
    if not metrics.exists() or metrics.stat().st_size == 0:
        return metrics
    restart = json.dumps({"step": resumed, "data": {RESTART_KEY: resumed}})
    lines = metrics.read_text().splitlines()
    if not lines or lines[-1] != restart:  # the same restart again (a start that failed before logging): once
        with open(metrics, "a") as f:
            f.write(restart + "\n")
    return output_dir / PART_NAME


def log_banner(output_dir: Path, resumed: int, steps: int) -> str:
    """The line that opens this run's part of ``train.log`` if it holds an earlier run's lines ('' if not)."""
    log = output_dir / LOG_NAME
    if not log.exists() or log.stat().st_size == 0:
        return ""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    what = (
        f"resumed from the checkpoint of step {resumed}: steps {resumed + 1}..{steps}"
        if resumed
        else ("started from scratch (no checkpoint to resume from)")
    )
    return (
        f"\n[cpu-demo] ===== {when}: a new run in this directory, {what}; the lines above are an earlier run's =====\n"
    )
