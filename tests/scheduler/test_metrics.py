"""The trainer's metric helpers (``verl_offpolicy/glue/scheduler/metrics.py``): staleness under verl's names;
ours only where verl has no name. The end-to-end check that a real run logs
them is ``tests/scheduler/test_scheduler_e2e.py::test_logged_versions_and_staleness_follow_the_spec``."""

import re
from pathlib import Path

from verl_offpolicy.glue.scheduler import metrics

VERL_TRAINER_BASE = Path(__import__("verl").__file__).parent / "trainer" / "ppo" / "v1" / "trainer_base.py"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "scheduler.md"


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


# ------------------------------------------------------------------ off-policy health: names

ALGORITHMS_DOCS = DOCS.parent / "algorithms.md"


def _section_table_first_cells(text: str, heading: str) -> list[str]:
    """The backticked names in the first cell of each row of the first table after ``heading``."""
    section = text.split(heading, 1)[1]
    table = re.search(r"^\|.*?(?=^[^|])", section, flags=re.MULTILINE | re.DOTALL).group(0)
    rows = table.splitlines()[2:]  # header and rule
    return [name for row in rows for name in re.findall(r"`([^`]+)`", row.split("|")[1])]


def test_anchor_corr_suffixes_are_the_keys_verl_returns():
    """The suffixes are what verl's own functions return (its compute_offpolicy_metrics in full; of its IS
    weight metrics, all but the four that measure a truncation threshold, which is not applied here)."""
    import torch
    from verl.trainer.ppo.rollout_corr_helper import compute_offpolicy_metrics, compute_rollout_correction_weights

    proximal, anchor, mask = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -2.0]]), torch.ones(1, 2)
    assert set(compute_offpolicy_metrics(proximal, anchor, mask)) == set(metrics.ANCHOR_CORR_DIVERGENCE)
    _, weights = compute_rollout_correction_weights(proximal - anchor, mask, "token", metrics.UNTRUNCATED)
    assert set(weights) - set(metrics.ANCHOR_CORR_WEIGHTS) == {
        "rollout_is_ratio_fraction_high",
        "rollout_is_ratio_fraction_low",
        "rollout_is_seq_fraction_high",
        "rollout_is_seq_fraction_low",
    }
    assert set(metrics.ANCHOR_CORR_WEIGHTS) <= set(weights)
    assert set(metrics.anchor_corr_metrics(proximal, anchor, mask)) == {
        "offpolicy/anchor_corr/" + stat for stat in metrics.ANCHOR_CORR_STATS
    }


def test_docs_list_every_anchor_corr_stat_once():
    names = _section_table_first_cells(DOCS.read_text(), "### Off-policy health on stale steps")
    assert sorted(names) == sorted(metrics.ANCHOR_CORR_STATS)


def test_docs_list_every_loss_fraction_under_the_one_rule():
    import verl.trainer.ppo.core_algos  # noqa: F401  (registers our losses first: adapters imported first is a cycle)

    from verl_offpolicy.glue import algorithms

    names = _section_table_first_cells(ALGORITHMS_DOCS.read_text(), "### What each loss did to its tokens")
    declared = [f.loss_fraction_metric(mode) for f in algorithms.families() for mode in f.loss_fractions]
    assert sorted(names) == sorted(declared) and len(declared) == 3
    assert all(re.fullmatch(r"actor/offpolicy/(rec|m2po|topr)/(clipped|masked|truncated)_frac", n) for n in names)
