"""The real-model study's configuration (``benchmarks/smollm2_study.py``) through stock ``main_ppo``, so the
study script cannot rot.

Two steps of OPMD (Kimi's form, as the REC paper ran it) on the study's stale setting, run as the study runs
them (its ``run_session`` and ``record``,
its overrides, the ``smollm2-135m-2step`` demo model), in two sessions as a study spread over several
invocations is: the first trains step 1 and checkpoints, the second resumes and trains step 2. Several
minutes and ~12 GB: marked ``real_model`` (``python -m pytest tests -m real_model``).

Checks, each against something the run could get wrong:
- the batch: 2 prompts x 8 samples per step, the prompts two-step problems (``a + b - c``) of the run's data;
- the schedule: under (4, 4) steps 1 and 2 train batches of version 0, staleness 0 then 1 (docs/scheduler.md's
  formula by hand: v(t) = 4 * max(0, floor((t - 5) / 4)) = 0);
- the resume: step 1 is not trained again by the second session (its rollout dump is untouched), and the record
  sums the two sessions;
- the held-out evaluation before training and after the last step;
- bf16 compute: the rollout/trainer probability gap of the sampled tokens is bf16's (fp32 gives ~1e-5 here,
  ``tests/demo/test_smollm2_e2e.py``; bf16 ~7e-2, ``benchmarks/results/stack_smollm2_dtype.md``).
"""

import json
from pathlib import Path

import pandas as pd
import pytest

from verl_offpolicy.demo.output_dir import METRICS_NAME
from verl_offpolicy.demo.results import PROBS_DIFF_MAX, read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.real_model]

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def study(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import smollm2_study

    monkeypatch.setattr(smollm2_study, "SCRATCH", tmp_path / "runs")
    return smollm2_study


@pytest.mark.timeout(5400)
def test_the_study_configuration_trains_and_resumes_across_sessions(study, tmp_path):
    setting = (4, 4)
    assert setting in study.SETTINGS  # the study's stale setting
    out = tmp_path / "runs" / study.run_name("opmd_kimi", setting)
    overrides = study.study_overrides(setting, out, test_freq=2, save_freq=1)
    rollouts = out / "rollouts"

    first = study.run_session("opmd_kimi", setting, 1, 2400, overrides)
    assert first["outcome"] == "finished", first
    assert study.record("opmd_kimi", setting, 2, overrides) is None  # step 2 not trained yet
    step1_dump = rollouts / "1.jsonl"
    step1_mtime = step1_dump.stat().st_mtime_ns

    second = study.run_session("opmd_kimi", setting, 2, 2400, overrides)
    assert second["outcome"] == "finished", second
    assert step1_dump.stat().st_mtime_ns == step1_mtime  # resumed after step 1: step 1 was not trained again
    rec = study.record("opmd_kimi", setting, 2, overrides)
    assert rec is not None and rec["sessions"] == 2
    assert rec["wall_s"] == pytest.approx(first["wall_s"] + second["wall_s"], abs=0.2)
    assert rec["peak_gb"] == max(first["peak_gb"], second["peak_gb"]) > 1.0
    assert {"0", "2"} <= set(rec["validation"])  # before training and after the last step
    assert rec["staleness_matches_schedule"] is True
    # verl's dump of the greedy answers at each validation (step 0 of the first session, 2 at the end): 32 problems each
    dumps = {p.name: p.read_text().splitlines() for p in (out / "validation").glob("*.jsonl")}
    assert "0.jsonl" in dumps and "2.jsonl" in dumps and all(len(lines) == 32 for lines in dumps.values()), dumps.keys()
    boxed = {
        step: sum("\\boxed{" in json.loads(line)["output"] for line in dumps[f"{step}.jsonl"]) / 32
        for step in ("0", "2")
    }
    assert {k: rec["validation_boxed"][k] for k in boxed} == boxed

    metrics = read_metrics(out / METRICS_NAME)
    assert [round(metrics[t]["training/off_policy/trajectory_staleness/mean"]) for t in (1, 2)] == [0, 1]
    assert [round(metrics[t]["offpolicy/version"]) for t in (1, 2)] == [0, 0]

    train = pd.read_parquet(out / "data" / "train.parquet")
    assert set(train["extra_info"].map(lambda e: e["operation"])) == {"add_sub"}
    questions = {p[-1]["content"] for p in train["prompt"]}
    assert len(pd.read_parquet(out / "data" / "val.parquet")) == 32
    for step in (1, 2):
        dumped = [json.loads(line) for line in (rollouts / f"{step}.jsonl").read_text().splitlines()]
        prompts = [d["input"] for d in dumped]
        assert len(dumped) == 16 and len(set(prompts)) == 2 and all(prompts.count(p) == 8 for p in prompts)
        assert all(any(q in p for q in questions) for p in prompts)  # the chat ends with a two-step training question
        assert 1e-3 < metrics[step][PROBS_DIFF_MAX] < 0.5, metrics[step][PROBS_DIFF_MAX]  # bf16's gap, not fp32's ~1e-5
