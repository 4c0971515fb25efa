"""The trainer's metric helpers (``verl_offpolicy/glue/scheduler/metrics.py``): staleness under verl's names; ours only where verl has no name. The end-to-end check that a real run logs
them is ``tests/test_scheduler_e2e.py::test_logged_versions_and_staleness_follow_the_spec``."""

import re
from pathlib import Path

from verl_offpolicy.glue.scheduler import metrics

VERL_TRAINER_BASE = Path(__import__("verl").__file__).parent / "trainer" / "ppo" / "v1" / "trainer_base.py"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "scheduler.md"


def test_staleness_names_are_the_ones_verl_logs():
    source = VERL_TRAINER_BASE.read_text()
    for stat in metrics.STATS:
        for prefix in (metrics.VERL_STALENESS, metrics.VERL_STALENESS_WORST, metrics.VERL_SPANS):
            assert f'"{prefix}/{stat}"' in source
    assert metrics.staleness_key("max") == "training/off_policy/trajectory_staleness/max"


def test_our_metrics_carry_what_verl_lacks():
    assert metrics.queue_metrics(4, 2, 3) == {
        "offpolicy/version": 4.0,
        "offpolicy/queue_len": 2.0,
        "offpolicy/rollout_batches_per_sync": 3.0,
    }
    assert metrics.rollout_call_metrics(0) == {"offpolicy/rollout_calls": 0.0, "offpolicy/generated_batches": 0.0}
    assert metrics.rollout_call_metrics(5) == {"offpolicy/rollout_calls": 1.0, "offpolicy/generated_batches": 5.0}


def test_docs_table_lists_every_metric_and_no_second_staleness():
    """docs/scheduler.md's one metrics table names every metric of glue/scheduler/metrics.py, verl's and ours."""
    text = DOCS.read_text()
    names = [v for k, v in vars(metrics).items() if k.isupper() and isinstance(v, str) and "/" in v]
    for name in names:
        assert f"`{name}" in text, name
    assert not re.search(r"`offpolicy/staleness", text)
