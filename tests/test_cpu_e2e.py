"""CI end-to-end: stock ``python -m verl.trainer.main_ppo`` on the CPU for a few GRPO steps.

verl's real pipeline (Ray, v1 trainer with TransferQueue, FSDP2 ActorRolloutRefWorker, agent loop,
reward loop, hf rollout with weight sync) through :func:`verl_offpolicy.cpu.demo.run_demo`, which
kills the run (process group and its Ray session) if it exceeds the timeout. Extend ``CASES`` to run
other presets (``preset`` = ``+algorithm=<name>``) the same way.
"""

import math
import time
from pathlib import Path

import pytest

from verl_offpolicy.cpu.demo import DemoError, DemoResult, _session_processes, is_loopback, run_demo

STEPS = 2
TIMEOUT = 240  # the run takes ~75 s on 2 cores (about 60 s of start-up)

CASES = [pytest.param("grpo", [], id="grpo")]


def check_completed(result: DemoResult, steps: int = STEPS) -> None:
    """The run logged every training step with verl's metrics, and rollout/trainer agree."""
    assert [m["step"] for m in result.metrics] == list(range(1, steps + 1))
    for m in result.metrics:
        for key in ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "timing_s/step", "response_length/mean"):
            assert key in m and math.isfinite(float(m[key])), (key, m.get(key))
        assert 0.0 <= m["critic/score/mean"] <= 1.0
        assert m["training/rollout_probs_diff_valid"] == 1
        # verl's own debug metric: |p_rollout - p_actor| on the sampled tokens, after the weight sync.
        assert m["training/rollout_probs_diff_max"] < 1e-3
    assert 0 in result.validation  # val_before_train
    assert Path(result.plot_path).stat().st_size > 0
    assert result.timings["mean_step_s"] > 0


@pytest.mark.parametrize("preset, overrides", CASES)
def test_main_ppo_runs_end_to_end_on_cpu(preset, overrides, tmp_path):
    output_dir = str(tmp_path / f"e2e-{preset}")
    result = run_demo(
        preset=preset,
        steps=STEPS,
        seed=0,
        output_dir=output_dir,
        timeout=TIMEOUT,
        overrides=["trainer.test_freq=-1", *overrides],
    )
    print(result.summary())
    check_completed(result)
    # Everything that listens on a port (Ray, TransferQueue, the process groups) binds to loopback.
    # Ray alone has a GCS, a raylet and a gRPC server per worker: an empty snapshot would be a bug.
    assert len(result.listening) >= 5, result.listening
    assert [a for a in result.listening if not is_loopback(a)] == [], result.listening
    # Nothing of the run (main_ppo, its Ray session) is left behind.
    assert _session_processes(output_dir) == []
    assert _session_processes(result.ray_temp_dir) == []


@pytest.mark.parametrize(
    "preset, config_name",
    [
        pytest.param("asymre", "ppo_trainer", id="asymre-stock-config"),  # +algorithm=asymre on verl's config
        pytest.param("agro", "offpolicy_trainer", id="agro-primary-config"),  # algorithm=agro on ours
    ],
)
def test_our_presets_train_through_main_ppo_with_our_estimator_loss_and_trainer(preset, config_name, tmp_path):
    """Two presets through stock main_ppo: our trainer, loss and estimator were the ones used."""
    result = run_demo(
        preset=preset,
        steps=STEPS,
        seed=0,
        output_dir=str(tmp_path / f"e2e-{preset}"),
        timeout=TIMEOUT,
        config_name=config_name,
        overrides=["trainer.test_freq=-1"],
    )
    check_completed(result)
    for m in result.metrics:
        # our trainer (offpolicy/*) and our rec loss (its metrics, which verl's vanilla loss does not log)
        assert m["offpolicy/version"] == m["step"] - 1 and m["offpolicy/staleness/mean"] == 0
        assert {"actor/pg_clipfrac_upper", "actor/ratio_mean", "actor/ratio_max"} <= set(m)
        assert m["actor/grad_norm"] > 0
        if preset == "asymre":
            # A = r − (r̄ + shift): the token-mean advantage is ≈ −shift = +0.1 (GRPO's would be ≈ 0)
            assert m["critic/advantages/mean"] == pytest.approx(0.1, abs=0.03)
        else:
            # AGRO's R = r − β·log(π/π_ref) is verl's KL-in-reward with the fixed coefficient β
            # (the demo's β = 0.01 for this task, set once in algorithm.offpolicy.beta)
            assert m["actor/reward_kl_penalty_coeff"] == pytest.approx(0.01)
            assert "actor/reward_kl_penalty" in m


def test_timeout_becomes_a_failure_and_cleans_up(tmp_path):
    """A run that cannot finish in time is killed with its Ray session, and says why."""
    output_dir = str(tmp_path / "e2e-timeout")
    before = {p.pid for p in _session_processes("vo-ray-")}
    start = time.monotonic()
    with pytest.raises(DemoError, match="did not finish within 30s"):
        run_demo(steps=STEPS, output_dir=output_dir, timeout=30, overrides=["trainer.test_freq=-1"])
    assert time.monotonic() - start < 120
    assert _session_processes(output_dir) == []
    leftovers = [p for p in _session_processes("vo-ray-") if p.pid not in before]
    assert leftovers == [], [" ".join(p.cmdline()) for p in leftovers]
