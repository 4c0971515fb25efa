"""What a finished run measured: verl's file logger (JSONL) read back into per-step metrics, the
validation rewards, the timings, and :class:`DemoResult` with its summary."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from verl_offpolicy.cpu.platform import is_loopback
from verl_offpolicy.demo.records import RESTART_KEY

TRAIN_SCORE = "critic/score/mean"
STEP_TIME = "timing_s/step"
PROBS_DIFF_MAX = "training/rollout_probs_diff_max"
PROBS_DIFF_MEAN = "training/rollout_probs_diff_mean"


def read_metrics(path: str | os.PathLike) -> dict[int, dict[str, Any]]:
    """verl FileLogger JSONL -> {step: merged metrics} (a step may be logged more than once).

    A restart record (:data:`~verl_offpolicy.demo.records.RESTART_KEY`: a re-run in the same directory
    continues after step k) drops what was read for the steps after k: the re-run logs them anew (the
    earlier records stay in the file)."""
    steps: dict[int, dict[str, Any]] = {}
    path = Path(path)
    if not path.exists():
        return steps
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        record = json.loads(line)
        step, data = int(record["step"]), record["data"]
        if RESTART_KEY in data:
            steps = {s: m for s, m in steps.items() if s <= data[RESTART_KEY]}
            continue
        steps.setdefault(step, {}).update(data)
    return steps


def restarts(path: str | os.PathLike) -> list[int]:
    """The steps after which re-runs continued the run logged in ``path`` (0: a re-run from scratch)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line)["data"][RESTART_KEY] for line in path.read_text().splitlines() if RESTART_KEY in line]


_VAL_KEY = re.compile(r"^val-(core|aux)/[^@]+/(reward|acc)/mean@\d+$")


def validation_key(metrics: dict[str, Any]) -> Optional[str]:
    """The mean validation reward key if logged: ``val-(core|aux)/<data_source>/(reward|acc)/mean@<n>``.

    verl names the custom reward ``reward`` (``val-aux``) and, for a float score, also ``acc``
    (``val-core``); both hold the same mean. ``reward`` is preferred.
    """
    keys = sorted((k for k in metrics if _VAL_KEY.match(k)), key=lambda k: ("/reward/" not in k, k))
    return keys[0] if keys else None


def training_metrics(by_step: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """One dict per training step (step >= 1 with a train score), in step order, with its ``step``."""
    return [{"step": s, **m} for s, m in sorted(by_step.items()) if s >= 1 and TRAIN_SCORE in m]


def missing_steps(metrics: list[dict[str, Any]], steps: int, resumed: int = 0) -> tuple[list[int], list[int]]:
    """The steps of 1..``steps`` without a record in ``metrics`` (:func:`training_metrics`), split in two:
    (unlogged, missing).

    Unlogged: at or before ``resumed``, the checkpoint this run resumed from. verl saves a step's checkpoint
    before it logs the step, so an earlier run stopped between the two trained the step and left no record
    of it (nothing can recover it). Missing: after ``resumed``, steps this run should have logged."""
    absent = sorted(set(range(1, steps + 1)) - {m["step"] for m in metrics})
    return [s for s in absent if s <= resumed], [s for s in absent if s > resumed]


def validation_rewards(by_step: dict[int, dict[str, Any]]) -> dict[int, float]:
    """step -> mean validation reward (greedy), for the steps that logged one (step 0: before training)."""
    validation = {}
    for s, m in sorted(by_step.items()):
        key = validation_key(m)
        if key is not None:
            validation[s] = float(m[key])
    return validation


def run_timings(
    metrics: list[dict[str, Any]], *, total_s: float, subprocess_s: float, first_step_s: Optional[float]
) -> dict[str, float]:
    """Seconds: in all, of the subprocess, per step (mean) and of start-up (launch to the end of step 1,
    minus step 1; only if the first step's line was seen at ``first_step_s``)."""
    step_times = [m[STEP_TIME] for m in metrics if STEP_TIME in m]
    timings = {
        "total_s": round(total_s, 2),
        "subprocess_s": round(subprocess_s, 2),
        "mean_step_s": round(sum(step_times) / len(step_times), 3) if step_times else float("nan"),
    }
    if first_step_s is not None and step_times:
        timings["startup_s"] = round(first_step_s - step_times[0], 2)
    return timings


def rollout_vs_trainer_gap(metrics: list[dict[str, Any]]) -> dict[str, float]:
    """Largest and mean |p_rollout - p_actor| over the run, if verl logged them (else empty)."""
    diffs = [m[PROBS_DIFF_MAX] for m in metrics if PROBS_DIFF_MAX in m]
    if not diffs:
        return {}
    return {
        "rollout_probs_diff_max": max(diffs),
        "rollout_probs_diff_mean": sum(m[PROBS_DIFF_MEAN] for m in metrics) / len(metrics),
    }


@dataclass
class DemoResult:
    output_dir: str
    command: list[str]
    metrics: list[dict[str, Any]]  # one dict per training step (step >= 1), with "step"
    validation: dict[int, float]  # step -> mean validation reward (greedy); step 0 = before training
    timings: dict[str, float]
    plot_path: Optional[str]
    log_path: str
    metrics_path: str
    rollout_vs_trainer: dict[str, float] = field(default_factory=dict)
    ray_temp_dir: Optional[str] = None  # the run's own Ray session dir (removed after the run)
    listening: list[str] = field(default_factory=list)  # TCP listen addresses at the first training step
    # /dev/shm files the run's processes had mapped at the first training step, and those of them it left
    # behind (unlinked by the demo after the run)
    shared_memory: dict[str, list[str]] = field(default_factory=dict)
    resumed_after_step: Optional[int] = None  # this run resumed from the checkpoint of that step (re-run in its dir)
    # steps an earlier run trained and checkpointed but was stopped before logging (no record exists)
    unlogged_steps: list[int] = field(default_factory=list)
    # the trained model's parameters, trainable parameters and LoRA rank (verl_offpolicy.demo.model_size)
    model_size: dict[str, Any] = field(default_factory=dict)

    @property
    def rewards(self) -> list[float]:
        return [m[TRAIN_SCORE] for m in self.metrics if TRAIN_SCORE in m]

    @property
    def reward_start(self) -> float:
        return self.rewards[0]

    @property
    def reward_end(self) -> float:
        return self.rewards[-1]

    def summary(self) -> dict[str, Any]:
        rewards = self.rewards
        window = max(1, min(3, len(rewards) // 3))
        return {
            "steps": len(self.metrics) + len(self.unlogged_steps),
            "resumed_after_step": self.resumed_after_step,
            "unlogged_steps": self.unlogged_steps,
            "reward_first": rewards[0] if rewards else None,
            "reward_last": rewards[-1] if rewards else None,
            f"reward_first{window}_mean": sum(rewards[:window]) / window if rewards else None,
            f"reward_last{window}_mean": sum(rewards[-window:]) / window if rewards else None,
            "validation": self.validation,
            "timings": self.timings,
            "rollout_vs_trainer": self.rollout_vs_trainer,
            **self.model_size,
            "listening_sockets": len(self.listening),
            "listening_not_loopback": [a for a in self.listening if not is_loopback(a)],
            "shared_memory_left_by_run": self.shared_memory.get("removed", []),  # unlinked by the demo
            "plot": self.plot_path,
        }
