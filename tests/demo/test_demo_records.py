"""A demo re-run in the same output directory: it continues the run from verl's latest
checkpoint there, keeps every earlier record (train.log and metrics.jsonl appended to, never deleted), marks
the restart, and reads back steps 1..N with each step's latest record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_offpolicy.demo.errors import DemoInputError
from verl_offpolicy.demo.records import (
    PART_NAME,
    RESTART_KEY,
    continued_step,
    log_banner,
    merge_part,
    resume_step,
    start_records,
)
from verl_offpolicy.demo.results import read_metrics, restarts, training_metrics


def _checkpoint(folder: Path, step: int, complete: bool = True) -> None:
    """What verl's _save_checkpoint leaves: global_step_<k>/, then the tracker file once it is complete."""
    (folder / f"global_step_{step}").mkdir(parents=True)
    if complete:
        (folder / "latest_checkpointed_iteration.txt").write_text(str(step))


def _record(step: int, score: float) -> str:
    return json.dumps({"step": step, "data": {"critic/score/mean": score, "timing_s/step": 1.0}})


def test_resume_step_is_the_checkpoint_verl_resumes_from(tmp_path):
    assert resume_step(tmp_path, []) == 0
    _checkpoint(tmp_path / "checkpoints", 2, complete=False)
    assert resume_step(tmp_path, []) == 0  # no tracker: verl starts from scratch
    _checkpoint(tmp_path / "checkpoints", 4)
    assert resume_step(tmp_path, []) == 4
    assert resume_step(tmp_path, ["trainer.resume_mode=disable"]) == 0
    assert resume_step(tmp_path, ["trainer.resume_mode=resume_path", "trainer.resume_from_path=/x/global_step_7"]) == 7
    _checkpoint(tmp_path / "elsewhere", 3)
    assert resume_step(tmp_path, ["trainer.default_local_dir=elsewhere"]) == 3  # relative to the run's cwd
    assert resume_step(tmp_path, [f"trainer.default_local_dir={tmp_path / 'none'}"]) == 0


def test_nothing_left_to_train_is_refused_with_what_to_do(tmp_path):
    _checkpoint(tmp_path / "checkpoints", 4)
    assert continued_step(tmp_path, [], steps=6) == 4
    for steps in (4, 3):
        with pytest.raises(
            DemoInputError,
            match=r"holds a checkpoint of step 4: a run of \d steps resumed from it has nothing to train\. "
            r"Pass --steps > 4",
        ):
            continued_step(tmp_path, [], steps=steps)
    assert continued_step(tmp_path, ["trainer.resume_mode=disable"], steps=3) == 0


def test_a_resumed_rerun_keeps_every_record_and_reads_back_steps_1_to_n(tmp_path):
    """Interrupted during step 3 after the step-2 checkpoint (step 3 logged, not checkpointed), re-run to 4 steps."""
    earlier = [_record(1, 0.1), _record(2, 0.2), _record(3, 0.3)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(earlier) + "\n")
    part = start_records(tmp_path, resumed=2)
    assert part == tmp_path / PART_NAME  # verl's file logger truncates the file it opens: not metrics.jsonl
    part.write_text(_record(3, 0.33) + "\n" + _record(4, 0.4) + "\n")  # what the resumed main_ppo logs
    merge_part(tmp_path)
    assert not part.exists()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert lines[:3] == earlier  # nothing lost
    assert json.loads(lines[3]) == {"step": 2, "data": {RESTART_KEY: 2}}  # the resume, visible
    by_step = read_metrics(tmp_path / "metrics.jsonl")
    assert [(m["step"], m["critic/score/mean"]) for m in training_metrics(by_step)] == [
        (1, 0.1),
        (2, 0.2),
        (3, 0.33),
        (4, 0.4),
    ]
    assert restarts(tmp_path / "metrics.jsonl") == [2]


def test_a_fresh_rerun_keeps_the_earlier_records_but_reads_only_its_own(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(_record(1, 0.1) + "\n" + _record(2, 0.2) + "\n")
    start_records(tmp_path, resumed=0).write_text(_record(1, 0.5) + "\n")
    merge_part(tmp_path)
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 4
    assert [
        (m["step"], m["critic/score/mean"]) for m in training_metrics(read_metrics(tmp_path / "metrics.jsonl"))
    ] == [(1, 0.5)]


def test_the_first_run_writes_metrics_jsonl_itself_and_a_killed_reruns_records_are_merged_next_time(tmp_path):
    assert start_records(tmp_path, resumed=0) == tmp_path / "metrics.jsonl"
    (tmp_path / "metrics.jsonl").write_text(_record(1, 0.1) + "\n")
    start_records(tmp_path, resumed=1).write_text(_record(2, 0.2) + "\n")  # then the demo is SIGKILLed: no merge
    start_records(tmp_path, resumed=2)  # the next re-run merges it first
    assert [m["step"] for m in training_metrics(read_metrics(tmp_path / "metrics.jsonl"))] == [1, 2]
    assert restarts(tmp_path / "metrics.jsonl") == [1, 2]


def test_a_start_that_failed_before_logging_and_its_retry_mark_one_restart(tmp_path):
    """Ray's start-up timed out (nothing logged) and the demo started again, resuming from the same step."""
    (tmp_path / "metrics.jsonl").write_text(_record(1, 0.1) + "\n")
    start_records(tmp_path, resumed=1)
    merge_part(tmp_path)  # the failed start: no part file was written
    start_records(tmp_path, resumed=1).write_text(_record(2, 0.2) + "\n")
    merge_part(tmp_path)
    assert restarts(tmp_path / "metrics.jsonl") == [1]
    assert [m["step"] for m in training_metrics(read_metrics(tmp_path / "metrics.jsonl"))] == [1, 2]


def test_the_log_banner_marks_a_rerun(tmp_path):
    assert log_banner(tmp_path, 2, 6) == ""  # no earlier log: written anew
    (tmp_path / "train.log").write_text("step:2 - ...\n")
    assert "a new run in this directory, resumed from the checkpoint of step 2: steps 3..6" in log_banner(
        tmp_path, 2, 6
    )
    assert "started from scratch" in log_banner(tmp_path, 0, 6)
