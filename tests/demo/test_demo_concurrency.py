"""Two demos at once, into different output dirs, on this machine: both finish and neither leaves anything.

Before the clean-up kept to its own run's files, a demo ending removed the live semaphore of another run's vLLM
engine (``SemLock._rebuild ... FileNotFoundError`` seconds later). One run generates with the ``hf`` rollout, the
other with verl's vLLM rollout (vLLM's CPU build, installed by the README's setup), 2 steps each, no validation.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.markers import needs_vllm
from verl_offpolicy.demo.process import processes_mentioning

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]

RUN_TIMEOUT = 1500  # two runs share two cores with whatever else the suite runs
QUIET = ["trainer.val_before_train=false", "trainer.test_freq=-1"]


def _demo(out: Path, *args: str) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "verl_offpolicy.cli",
        "demo",
        "--steps",
        "2",
        "--output-dir",
        str(out),
        "--timeout",
        str(RUN_TIMEOUT),
        *args,
        *QUIET,
    ]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL
    )


@needs_vllm
def test_two_demos_at_once_both_finish_and_leave_nothing(tmp_path):
    hf, vllm = tmp_path / "hf", tmp_path / "vllm"
    runs = {hf: _demo(hf, "--model", "tiny"), vllm: _demo(vllm, "--rollout", "vllm")}
    deadline = time.monotonic() + RUN_TIMEOUT + 300
    outputs = {}
    for out, proc in runs.items():
        try:
            outputs[out] = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=60)
    for out, proc in runs.items():
        assert proc.returncode == 0, f"{out.name}: exit {proc.returncode}\n{outputs.get(out, '')[-4000:]}"
        log = (out / "train.log").read_text(errors="replace")
        # another run's clean-up removing a live semaphore: SemLock._rebuild ... FileNotFoundError on /dev/shm
        assert not re.search(r"SemLock|FileNotFoundError: \[Errno 2\][^\n]*(/dev/shm|sem\.)", log), log[-3000:]
        summary = json.loads((out / "summary.json").read_text())
        assert summary["steps"] == 2 and summary["listening_not_loopback"] == []
    for out in runs:
        assert [" ".join(p.cmdline()) for p in processes_mentioning(str(out))] == []
