"""``benchmarks/_cpu_account.py``, the CPU seconds per step behind bench_overlap's "CPU bound": a child process
that burns a known amount of CPU between two step lines of a run's metrics.jsonl is found there, by itself and
in the machine's total."""

import os
import subprocess
import sys
import time
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

BURN_S = 1.0  # CPU seconds the child spends (its own process time, so machine load only stretches the wall time)
BURN = (
    "import sys, time\n"
    "sys.stdin.readline()\n"  # wait for the go, sent after step 1's line
    f"while time.process_time() < {BURN_S}: pass\n"
    "print('done', flush=True)\n"
    "sys.stdin.readline()\n"  # stay alive (idle) until step 2's line is taken
)


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
    child = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        with CpuAccount(tmp_path, interval_s=0.05) as account:
            with metrics.open("a") as f:
                f.write('{"step": 1}\n')
            _wait_for(lambda: 1 in account.snapshots, "step 1's snapshot")
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "done"
            with metrics.open("a") as f:
                f.write('{"step": 2}\n')
            _wait_for(lambda: 2 in account.snapshots, "step 2's snapshot")
        child.stdin.write("end\n")
        child.stdin.flush()
        child.wait(timeout=60)
    finally:
        child.kill()

    result = account.result(first_step=1)
    assert result["steps"] == 1
    # The child's burn lies entirely between the two snapshots (its interpreter start-up came before step 1).
    (_, _, before), (_, _, after) = account.snapshots[1], account.snapshots[2]
    burnt = after[child.pid][1] - before[child.pid][1]
    assert BURN_S * 0.95 <= burnt <= BURN_S * 1.2, burnt
    assert result["by_process"]["other"] >= burnt  # summed by name with this test's own process
    assert result["wall_per_step"] >= BURN_S * 0.95  # one thread burnt it
    assert burnt * 0.95 <= result["cpu_per_step"] <= os.cpu_count() * result["wall_per_step"] + 0.1, result
