"""CPU seconds a run spends per training step, machine-wide and per process, read from /proc while it runs.

A thread polls every ``interval_s``: the lines of the run's ``metrics.jsonl`` (one per finished step; verl's
FileLogger) and, at each new line, the machine's busy CPU time (``/proc/stat``) and every process's
(``/proc/<pid>/stat``). Over the steps after the first (the window the benchmarks time), the CPU seconds per
step bound steps/s from above on this machine: ``cores / cpu_per_step`` (all cores busy, nothing waiting).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

from _results import Poller  # benchmarks/_results.py

from verl_offpolicy.demo.output_dir import METRICS_NAME

_TICK = os.sysconf("SC_CLK_TCK")


def _busy_s() -> float:
    """Busy CPU seconds of the machine since boot: /proc/stat's user, nice, system, irq and softirq (not idle,
    iowait, a hypervisor's steal, nor guest time, which user and nice already hold)."""
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in Path("/proc/stat").read_text().split()[1:8])
    return (user + nice + system + irq + softirq) / _TICK


def _process_name(cmdline: str) -> str:
    if cmdline.startswith("ray::"):
        return cmdline.split()[0].split(".")[0]  # ray::AgentLoopWorkerTQ.generate_sequences -> ray::AgentLoopWorkerTQ
    if "main_ppo" in cmdline:
        return "main_ppo (driver)"
    if "ray/core" in cmdline or "/ray/" in cmdline:
        return "Ray (raylet, GCS, monitors)"
    return "other"


def _processes() -> dict[int, tuple[str, float]]:
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        found[int(pid)] = (_process_name(cmdline), (int(stat[11]) + int(stat[12])) / _TICK)  # utime + stime
    return found


class CpuAccount(Poller):
    """``with CpuAccount(output_dir) as account: run(...)``; then :meth:`result`."""

    def __init__(self, output_dir: Path, interval_s: float = 0.2) -> None:
        super().__init__(interval_s)
        self.metrics = Path(output_dir) / METRICS_NAME
        self.snapshots: dict[int, tuple[float, float, dict]] = {}  # step -> (time, machine busy s, processes)

    def poll(self) -> None:
        try:
            with self.metrics.open() as f:
                lines = sum(1 for _ in f)
        except OSError:
            return
        seen = max(self.snapshots, default=0)
        if lines > seen:
            snapshot = (time.monotonic(), _busy_s(), _processes())
            for step in range(seen + 1, lines + 1):
                self.snapshots[step] = snapshot

    def result(self, first_step: int = 1) -> dict:
        """CPU seconds per step over steps ``first_step`` + 1 .. the last: machine-wide and by process name."""
        last = max(self.snapshots, default=0)
        if last <= first_step or first_step not in self.snapshots:
            return {}
        (t0, busy0, procs0), (t1, busy1, procs1) = self.snapshots[first_step], self.snapshots[last]
        steps = last - first_step
        by_name: Counter[str] = Counter()
        for pid, (name, cpu) in procs1.items():
            start = procs0.get(pid)
            by_name[name] += cpu - (start[1] if start and start[0] == name else 0.0)
        return {
            "steps": steps,
            "wall_per_step": (t1 - t0) / steps,
            "cpu_per_step": (busy1 - busy0) / steps,
            "by_process": {name: cpu / steps for name, cpu in by_name.most_common()},
        }
