"""The long-tailed repeat task (``demo --model tiny-long``): each row's budget is a log-normal draw that also caps
the row's responses, and the seeded agent loops hand the cap to the rollout as the sample's ``max_tokens``."""

from __future__ import annotations

import math

import pandas as pd

from tests.hydra_utils import compose_and_check
from verl_offpolicy.cpu.agent_loop import seeded
from verl_offpolicy.cpu.task import BUDGET_KEY, ROW_MAX_TOKENS_KEY
from verl_offpolicy.demo.command import run_overrides
from verl_offpolicy.demo.repeat_task import LONG_TAIL_CAP, build_dataset, long_tail_budget


class _Draw:
    """A ``random.Random`` whose ``gauss`` returns the given z."""

    def __init__(self, z: float) -> None:
        self.z = z

    def gauss(self, mu: float, sigma: float) -> float:
        return self.z


def test_a_budget_is_the_median_times_e_to_the_draw_rounded_and_clipped():
    # median 6: z = 0 -> 6; z = ln 2 -> 12; z = ln(1/4) -> 1.5 -> 2 (round half to even); far out: the cap, and 1
    assert [long_tail_budget(_Draw(z)) for z in (0.0, math.log(2), math.log(0.25))] == [6, 12, 2]
    assert (long_tail_budget(_Draw(10.0)), long_tail_budget(_Draw(-10.0))) == (LONG_TAIL_CAP, 1)


def test_the_long_tailed_rows_cap_their_responses_at_their_budget(tmp_path):
    paths = build_dataset(tmp_path, long_tail=True, seed=0)
    rows = pd.read_parquet(paths["train_files"])["extra_info"].tolist()
    budgets = [row[BUDGET_KEY] for row in rows]
    assert all(row[ROW_MAX_TOKENS_KEY] == row[BUDGET_KEY] for row in rows)
    assert min(budgets) >= 1 and max(budgets) <= LONG_TAIL_CAP
    # long-tailed: the largest budget is several times the median (σ = 1: the 1-in-256 draw is ~e^2.7 the median)
    ordered = sorted(budgets)
    assert ordered[-1] >= 5 * ordered[len(ordered) // 2], ordered
    plain = pd.read_parquet(build_dataset(tmp_path / "plain", seed=0)["train_files"])["extra_info"].tolist()
    assert all(ROW_MAX_TOKENS_KEY not in row or row[ROW_MAX_TOKENS_KEY] is None for row in plain)
    assert {row[BUDGET_KEY] for row in plain} == {8}


def test_the_seeded_agent_loops_pass_a_rows_cap_as_max_tokens():
    capped = seeded({"temperature": 1.0}, "hf", {"index": 3, "session_id": 1, "extra_info": {ROW_MAX_TOKENS_KEY: 17}})
    assert capped["max_tokens"] == 17
    assert "max_tokens" not in seeded({}, "hf", {"index": 3, "session_id": 1, "extra_info": {"index": 3}})
    assert seeded({"max_tokens": 5}, "hf", {"extra_info": {ROW_MAX_TOKENS_KEY: 17}})["max_tokens"] == 5  # the caller's


def test_tiny_long_composes_with_responses_up_to_the_largest_budget(tmp_path):
    tail = run_overrides("opmd", "offpolicy_trainer", "tiny-long")
    cfg = compose_and_check("offpolicy_trainer", ["+cpu=demo", f"actor_rollout_ref.model.path={tmp_path}", *tail])
    assert cfg.data.max_response_length == LONG_TAIL_CAP
    hf = cfg.actor_rollout_ref.rollout.engine_kwargs.hf
    assert hf.continuous_batching is True and hf.token_latency_s == 0.02  # vLLM's batching, a larger model's decode
