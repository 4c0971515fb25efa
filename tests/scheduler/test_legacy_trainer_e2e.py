"""Every preset on verl's legacy trainer (``trainer.use_v1=false``: ``main_ppo_v0``'s ``RayPPOTrainer``) at (1, 0).

The estimators and losses are verl registry entries, so at (s, d) = (1, 0) nothing of the scheduler is needed
(verl's ``neo`` branch disables the V1 trainer). One family's preset per run: the legacy run trains the same
first step as the V1 run (our ``offpolicy`` trainer at (1, 0)), same seed, same batch: the same prompts, responses
and scores (verl's rollout dumps) and the same policy loss. The REC preset is in the default tier; OPMD, M2PO and
PMD in ``-m extended`` (the same code path, outside the default run's 30 minutes).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jobs import queued_at_start
from tests.scenario_runs import PRIMARY_CONFIG, SHARED_RUN_TIMEOUT, SMALL_DEMO, dumped_batches

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]

STEPS = 1
LEGACY = ["trainer.use_v1=false"]
DEFAULT_TIER = ["rec_oneside_nois"]
EXTENDED_TIER = ["opmd", "m2po", "pmd_mean"]


def _pair(demo_runs, preset):
    return {
        trainer: demo_runs.start(
            preset, STEPS, SMALL_DEMO + extra, PRIMARY_CONFIG, SHARED_RUN_TIMEOUT, name=f"{trainer}_{preset}"
        )
        for trainer, extra in (("v1", []), ("legacy", LEGACY))
    }


@queued_at_start(scope="module")
def runs(demo_runs):
    jobs = {preset: _pair(demo_runs, preset) for preset in DEFAULT_TIER}
    return lambda preset: {trainer: job.result() for trainer, job in jobs[preset].items()}


@queued_at_start(scope="module")
def extended_runs(demo_runs):
    jobs = {preset: _pair(demo_runs, preset) for preset in EXTENDED_TIER}
    return lambda preset: {trainer: job.result() for trainer, job in jobs[preset].items()}


def _check_same_first_step(pair):
    assert "Legacy trainer" in Path(pair["legacy"].log_path).read_text(
        errors="replace"
    )  # verl's own warning: main_ppo_v0 ran
    batches = {name: dumped_batches(Path(r.output_dir) / "rollouts", [1]) for name, r in pair.items()}
    assert batches["legacy"] == batches["v1"] and len(batches["v1"][1]) == 16  # 4 prompts x 4 samples
    first = {name: {m["step"]: m for m in r.metrics}[1] for name, r in pair.items()}
    for key in ("actor/pg_loss", "critic/score/mean"):
        assert first["legacy"][key] == pytest.approx(first["v1"][key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("preset", DEFAULT_TIER)
def test_the_legacy_trainer_trains_the_first_step_of_the_v1_trainer(runs, preset):
    _check_same_first_step(runs(preset))


@pytest.mark.extended
@pytest.mark.parametrize("preset", EXTENDED_TIER)
def test_the_legacy_trainer_trains_the_first_step_of_the_v1_trainer_other_families(extended_runs, preset):
    _check_same_first_step(extended_runs(preset))
