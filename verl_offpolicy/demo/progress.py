"""What a person sees while the CPU demo runs: start-up phases as they complete, a line per training
step (:func:`progress_line`), and a plain summary.

``main_ppo``'s start-up (Ray, TransferQueue, the FSDP2 worker, the rollout server, the first weight
sync, the validation before training) takes one to two minutes on 2 cores and prints nothing a
person would read. :class:`StartupPhases` watches the run's output for the line each phase prints
when it is done and turns it into one console line with the seconds since launch. Every pattern
below is a line verl 0.9.1, Ray or this package's CPU backend prints in every demo run.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Optional

from verl_offpolicy.demo.results import PROBS_DIFF_MAX, STEP_TIME, TRAIN_SCORE, validation_key
from verl_offpolicy.glue.scheduler.metrics import FILTER_ROUNDS

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Phase:
    pattern: re.Pattern
    label: str  # may use the pattern's named groups


# In the order they complete. A phase is reported once, the first time its line appears.
PHASES: tuple[Phase, ...] = (
    Phase(re.compile(r"\[validate_config\] All configuration checks passed"), "configuration composed and checked"),
    Phase(re.compile(r"Started a local Ray instance"), "Ray started (127.0.0.1)"),
    Phase(re.compile(r"^\(TaskRunner\w* pid=\d+\)"), "trainer process up (Ray actor)"),
    Phase(re.compile(r"^\(WorkerDict pid=\d+\)"), "training worker process up"),
    Phase(
        re.compile(r"(?P<model>\w+) contains (?P<n>[\d.]+\w?) parameters"),
        "model loaded in the training worker: {model}, {n} parameters",
    ),
    Phase(re.compile(r"hf rollout server \d+ ready"), "rollout server ready (model loaded)"),
    Phase(re.compile(r"synced \d+ tensors to replica \d+ \(global_steps=0\)"), "weights synced trainer -> rollout"),
    Phase(re.compile(r"Initial validation metrics"), "greedy validation before training done"),
    Phase(re.compile(r"(?:^|\s)step:1 - "), "first training step done"),
)


class StartupPhases:
    """Feed it the run's output lines; it returns a console line when a phase completes."""

    def __init__(self, start: Optional[float] = None, phases: tuple[Phase, ...] = PHASES):
        self.start = time.monotonic() if start is None else start
        self.phases = phases
        self.seen: dict[str, float] = {}  # label template -> seconds since start

    def feed(self, line: str, now: Optional[float] = None) -> Optional[str]:
        line = _ANSI.sub("", line)
        for phase in self.phases:
            if phase.label in self.seen:
                continue
            match = phase.pattern.search(line)
            if match:
                elapsed = (time.monotonic() if now is None else now) - self.start
                self.seen[phase.label] = elapsed
                return f"[cpu-demo] {elapsed:6.1f} s  {phase.label.format(**match.groupdict())}"
        return None


def _fmt(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def plain_summary(summary: dict[str, Any], *, log_path: str, metrics_path: str) -> str:
    """A few lines for a person: reward first -> last, validation before -> after, seconds per step, files.

    ``summary`` is :meth:`verl_offpolicy.demo.results.DemoResult.summary`'s dict.
    """
    validation = summary.get("validation") or {}
    timings = summary.get("timings") or {}
    lines = [f"[cpu-demo] finished {summary['steps']} training steps"]
    if summary.get("resumed_after_step"):
        resumed = summary["resumed_after_step"]
        lines[0] += f" (steps 1..{resumed} by the earlier run(s) in this directory, resumed from its checkpoint)"
    lines.append(
        f"  train reward (sampled), step 1 -> last: {_fmt(summary.get('reward_first'))} -> "
        f"{_fmt(summary.get('reward_last'))}"
    )
    if validation:
        first, last = min(validation), max(validation)
        lines.append(
            f"  validation reward (greedy), step {first} -> step {last}: {_fmt(validation[first])} -> "
            f"{_fmt(validation[last])}"
        )
    else:
        lines.append("  validation reward: not run")
    per_step = timings.get("mean_step_s")
    startup = timings.get("startup_s")
    lines.append(
        f"  time: {per_step:.1f} s per step"
        + (f", start-up {startup:.0f} s" if startup is not None else "")
        + f", {timings.get('total_s', 0):.0f} s in all"
    )
    if summary.get("plot"):
        lines.append(f"  reward curve: {summary['plot']}")
    lines.append(f"  log: {log_path}")
    lines.append(f"  metrics (verl's file logger, JSONL): {metrics_path}")
    return "\n".join(lines)


def _number(text: str) -> str:
    """'np.float64(0.109375)' / '2.4956220470' -> '0.1094' / '2.496' (4 significant digits)."""
    inner = re.search(r"\(([^()]*)\)", text)  # np.float64(0.1) -> 0.1
    match = re.search(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", inner.group(1) if inner else text)
    if not match:
        return text
    return f"{float(match.group(0)):.4g}"


# verl's per-step console line ("step:<n> - key:value - ..."): group 1 is the step.
STEP_LINE = re.compile(r"(?:^|\s)step:(\d+) - ")
_ERROR_LINE = re.compile(r"Traceback \(most recent call last\)|\b[A-Z]\w*(?:Error|Exception): |verl-offpolicy:")


def _generation_rounds(value: Optional[str]) -> str:
    """The step line's note when DAPO's group filter needed more than one generation round for the batch."""
    rounds = float(_number(value)) if value is not None else 1.0
    if rounds <= 1:
        return ""
    return f" ({rounds:g} generation rounds: groups with one reward on every sample dropped and regenerated)"


def progress_line(line: str, seen_errors: Optional[set[str]] = None) -> Optional[str]:
    """A compact console line for verl's per-step console log, or None to stay quiet. With ``seen_errors``
    (the error lines shown so far, numbers and ids aside), an error line is shown once: a dead Ray actor fails
    every request in flight with the same error, which stays in the log."""
    match = STEP_LINE.search(line)
    if match:
        line = line[match.start() :].strip()
        fields = {}
        for part in line.split(" - "):
            if ":" in part:
                key, _, value = part.rpartition(":")
                fields[key.strip()] = value.strip()
        step = fields.get("step", "?")
        keys = [
            ("reward", TRAIN_SCORE),
            ("step_s", STEP_TIME),
            ("pg_loss", "actor/pg_loss"),
            ("|p_rollout-p_actor|max", PROBS_DIFF_MAX),
        ]
        shown = [f"{label}={_number(fields[k])}" for label, k in keys if k in fields]
        val_key = validation_key(fields)
        val = [f"val={_number(fields[val_key])}"] if val_key else []
        return f"[cpu-demo] step {step}: " + " ".join(shown + val) + _generation_rounds(fields.get(FILTER_ROUNDS))
    if "Warning" not in line and _ERROR_LINE.search(line):
        if seen_errors is not None:
            key = re.sub(r"[0-9a-f]{8,}|\d+", "#", line.strip())
            if key in seen_errors:
                return None
            seen_errors.add(key)
        return f"[cpu-demo] {line}"
    return None
