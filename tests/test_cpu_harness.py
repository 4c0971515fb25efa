"""The single-process FSDP2 TrainingWorker harness: one real actor update with verl's vanilla loss."""

import pytest

from tests.cpu_harness import isolated


@pytest.mark.slow
def test_one_vanilla_update_changes_weights_in_the_advantage_direction(tmp_path):
    report = isolated("tests.scenario_losses:demo_vanilla_update", timeout=300, workdir=str(tmp_path), lr=1e-2)
    print(report)
    assert report["num_params"] > 0
    assert report["num_changed"] == report["num_params"]
    assert report["max_abs_change"] > 1e-3
    # Positive advantage: the response became more likely; negative: less likely.
    assert report["good_logp_after"] > report["good_logp_before"] + 0.1
    assert report["bad_logp_after"] < report["bad_logp_before"] - 0.1
    assert report["metrics"]["lr"] == 1e-2
    assert report["metrics"]["grad_norm"] > 0
