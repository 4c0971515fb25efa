"""``benchmarks/_cpu_account.py``, the CPU seconds per step behind bench_overlap's "CPU bound": CPU burnt by a
known amount between two step lines of a run's metrics.jsonl is found there, in its process and in the
machine's total."""

import os
import threading
import time
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

BURN_S = 1.0  # CPU seconds a thread of this process spends (its own CPU time: load only stretches the wall time)


def _burn() -> None:
    start = time.thread_time()
    while time.thread_time() - start < BURN_S:
        pass


def _wait_for(predicate, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_known_cpu_burn_between_two_steps_is_counted(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from _cpu_account import CpuAccount

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("")
    with CpuAccount(tmp_path, interval_s=0.05) as account:
        for step in (1, 2):
            if step == 2:  # the burn lies entirely between the two step lines
                burner = threading.Thread(target=_burn)
                burner.start()
                burner.join(timeout=120)
                assert not burner.is_alive()
            with metrics.open("a") as f:
                f.write(f'{{"step": {step}}}\n')
            _wait_for(lambda step=step: step in account.snapshots, f"step {step}'s snapshot")

    result = account.result(first_step=1)
    assert result["steps"] == 1
    (_, _, before), (_, _, after) = account.snapshots[1], account.snapshots[2]
    ours = after[os.getpid()][1] - before[os.getpid()][1]  # the burn, plus this process's polling
    assert BURN_S * 0.95 <= ours <= BURN_S * 1.5, ours
    assert result["by_process"]["other"] >= ours  # summed by name (this process is "other")
    assert result["wall_per_step"] >= BURN_S * 0.95  # one thread burnt it
    assert ours * 0.95 <= result["cpu_per_step"] <= os.cpu_count() * result["wall_per_step"] + 0.1, result
