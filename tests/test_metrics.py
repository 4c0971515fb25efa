"""The trainer's metric helpers (``verl_offpolicy/glue/metrics.py``): staleness under verl's names, checked
against the schedule; ours only where verl has no name. The end-to-end check that a real run logs
them is ``tests/test_scheduler_e2e.py::test_logged_versions_and_staleness_follow_the_spec``."""

import re
from pathlib import Path

import pytest

from verl_offpolicy.glue import metrics

VERL_TRAINER_BASE = Path(__import__("verl").__file__).parent / "trainer" / "ppo" / "v1" / "trainer_base.py"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "scheduler.md"


def _verl_staleness(value: int) -> dict:
    # the names verl 0.9.1 logs (trainer_base.py, _compute_metrics), written out by hand
    return {f"training/off_policy/trajectory_staleness/{s}": value for s in ("mean", "max", "min")}


def test_staleness_names_are_the_ones_verl_logs():
    source = VERL_TRAINER_BASE.read_text()
    for stat in metrics.STATS:
        for prefix in (metrics.VERL_STALENESS, metrics.VERL_STALENESS_WORST, metrics.VERL_SPANS):
            assert f'"{prefix}/{stat}"' in source
    assert metrics.staleness_key("max") == "training/off_policy/trajectory_staleness/max"


def test_measured_staleness_equal_to_the_schedule_passes():
    metrics.check_measured_staleness(_verl_staleness(3), step=5, scheduled=3)


@pytest.mark.parametrize("measured,scheduled", [(2, 3), (0, 1), (4, 3)])
def test_measured_staleness_other_than_the_schedule_raises(measured, scheduled):
    with pytest.raises(RuntimeError, match=rf"staleness {measured}\.\.{measured} .* the schedule says {scheduled}"):
        metrics.check_measured_staleness(_verl_staleness(measured), step=5, scheduled=scheduled)


def test_mixed_staleness_in_one_batch_raises():
    logged = {**_verl_staleness(1), "training/off_policy/trajectory_staleness/min": 0}
    with pytest.raises(RuntimeError, match=r"staleness 0\.\.1"):
        metrics.check_measured_staleness(logged, step=2, scheduled=1)


def test_missing_verl_metrics_raise():
    with pytest.raises(RuntimeError, match="verl logged no training/off_policy/trajectory_staleness"):
        metrics.check_measured_staleness({}, step=1, scheduled=0)


def test_our_metrics_carry_what_verl_lacks():
    assert metrics.queue_metrics(4, 2, 3) == {
        "offpolicy/version": 4.0,
        "offpolicy/queue_len": 2.0,
        "offpolicy/rollout_batches_per_sync": 3.0,
    }
    assert metrics.rollout_call_metrics(0) == {"offpolicy/rollout_calls": 0.0, "offpolicy/generated_batches": 0.0}
    assert metrics.rollout_call_metrics(5) == {"offpolicy/rollout_calls": 1.0, "offpolicy/generated_batches": 5.0}


def test_docs_table_lists_every_metric_and_no_second_staleness():
    """docs/scheduler.md's one metrics table names every metric of glue/metrics.py, verl's and ours."""
    text = DOCS.read_text()
    names = [v for k, v in vars(metrics).items() if k.isupper() and isinstance(v, str) and "/" in v]
    for name in names:
        assert f"`{name}" in text, name
    assert not re.search(r"`offpolicy/staleness", text)
