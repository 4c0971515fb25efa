"""verl's Megatron engine on the CPU (``+cpu=megatron``, verl_offpolicy/cpu/megatron.py).

The equivalence check users cannot run without a cluster: the same weights (the tiny Llama, rounded
to bfloat16 values) and the same batch (4 responses of 3, 2, 2 and 4 tokens, trained as two
micro-batches of two, old log-probs chosen so that REC's one-side mask acts on some tokens) go
through a preset's loss under verl's FSDP2 engine and under verl's Megatron engine (real
``TrainingWorker``s, verl's ``ppo_loss``, one fresh CPU process per engine), and through a plain
fp32 PyTorch reference: transformers' Llama, the registered loss called once on the whole batch.

- FSDP2 (fp32) equals the reference to float32 round-off (loss and every gradient entry).
- Megatron reports the loss the reference formula gives on Megatron's own log-probs (to float
  round-off: aggregation and batch bookkeeping only), and its gradient equals the reference's to
  bfloat16 precision (verl's Megatron engine accepts only bf16/fp16 parameters: measured relative
  error 1.4-1.9%, cosine > 0.9998; tolerance 5%).

Nothing is mocked: the CUDA assumptions of megatron-core/mbridge are replaced by the project's
shims, which the second group of tests removes one at a time.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from tests.cpu_harness import assert_named_with_fix, isolated
from tests.scenario_megatron import bf16_exact_tiny, reference_loss_and_grads, whole_batch_loss

MISSING = [m for m in ("megatron.core", "mbridge") if importlib.util.find_spec(m.split(".")[0]) is None]
pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"needs the megatron-cpu extra (pip install -e '.[megatron-cpu]'); missing {MISSING}"
)

CASES = [
    {"name": "opmd", "preset": "opmd"},  # token-mean
    {"name": "pmd", "preset": "pmd_mean"},  # pmd's per-sequence quadratic
    {"name": "rec_oneside_is", "preset": "rec_oneside_is"},  # masked tokens, ρ-weighted
]
FSDP_TOL = 1e-4
MEGATRON_LOSS_TOL = 1e-4
MEGATRON_GRAD_TOL = 0.05


def _vector(grads: dict[str, list]) -> torch.Tensor:
    return torch.cat([torch.tensor(grads[name]) for name in sorted(grads)])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("megatron_equivalence")
    paths = bf16_exact_tiny(str(workdir))
    reference = {c["name"]: reference_loss_and_grads(paths["model_path"], paths["tokenizer_path"], c) for c in CASES}
    old = {name: r["old_log_probs"] for name, r in reference.items()}
    engines = {
        engine: isolated(
            "tests.scenario_megatron:engine_loss_and_grads",
            timeout=1500,
            workdir=str(workdir),
            engine=engine,
            model_path=paths["model_path"],
            tokenizer_path=paths["tokenizer_path"],
            cases=CASES,
            old_log_probs=old,
        )
        for engine in ("fsdp", "megatron")
    }
    return {"paths": paths, "reference": reference, **engines}


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_fsdp_and_megatron_engines_give_the_reference_loss_and_gradient(runs, case):
    name = case["name"]
    ref, fsdp, megatron = runs["reference"][name], runs["fsdp"][name], runs["megatron"][name]
    assert set(fsdp["grads"]) == set(megatron["grads"]) == set(ref["grads"])  # every HF parameter
    g_ref = _vector(ref["grads"])
    assert g_ref.norm() > 0

    # FSDP2 in fp32: the reference to float32 round-off.
    assert fsdp["loss"] == pytest.approx(ref["loss"], rel=FSDP_TOL, abs=1e-6)
    assert float((_vector(fsdp["grads"]) - g_ref).norm() / g_ref.norm()) < FSDP_TOL

    # Megatron: its loss is the whole-batch formula on its own log-probs (aggregation exact) ...
    mask = torch.tensor(ref["response_mask"])
    expected = whole_batch_loss(
        runs["paths"]["model_path"],
        runs["paths"]["tokenizer_path"],
        case,
        log_prob=torch.tensor(megatron["log_probs"]),
        old_log_prob=torch.tensor(ref["old_log_probs"]),
        advantages=torch.tensor(ref["advantages"]),
        mask=mask,
    )
    assert megatron["loss"] == pytest.approx(float(expected), rel=MEGATRON_LOSS_TOL, abs=1e-6)
    # ... and its bf16 log-probs and gradient are the reference's to bf16 precision.
    # (bf16 log-probs within 0.1 of fp32 ones, measured 0.032: no token crosses REC's clip edges,
    # which EQUIVALENCE_SHIFTS keep ≥ 0.13 away.)
    assert float((torch.tensor(megatron["log_probs"]) - torch.tensor(fsdp["log_probs"])).abs().max()) < 0.1
    g_meg = _vector(megatron["grads"])
    assert float((g_meg - g_ref).norm() / g_ref.norm()) < MEGATRON_GRAD_TOL
    assert float(torch.nn.functional.cosine_similarity(g_meg, g_ref, dim=0)) > 0.995


# Each shim of verl_offpolicy/cpu/megatron.py, removed alone: the error verl's Megatron engine then
# raises on the CPU, and the last file of megatron-core/mbridge/verl in its traceback (megatron-core
# 0.16.1, mbridge 0.15.1, verl 0.9.1).
WITHOUT_SHIM = {
    "rng_tracker": ("Torch not compiled with CUDA enabled", "megatron/core/tensor_parallel/random.py"),
    "local_layer_spec": ("name 'TENorm' is not defined", "megatron/core/models/gpt/gpt_layer_specs.py"),
    "local_spec_weight_names": ("Unsupported parameter name", "mbridge/core/bridge.py"),
    "cuda_device_remap": ("Torch not compiled with CUDA enabled", "mbridge/core/util.py"),
    "cuda_type_checks": ("Wrapped parameters must be one of", "megatron/core/optimizer/distrib_optimizer.py"),
    "bshd_attention_mask": ("must match the size of tensor", "megatron/core/transformer/utils.py"),
}


def test_every_shim_has_its_failure_listed():
    from verl_offpolicy.cpu.megatron import SHIMS

    assert set(SHIMS) == set(WITHOUT_SHIM)


@pytest.mark.slow
@pytest.mark.extended  # six fresh Megatron processes (~7 min): outside the default run's 30-minute budget
@pytest.mark.timeout(900)
@pytest.mark.parametrize("shim", sorted(WITHOUT_SHIM))
def test_the_megatron_engine_fails_on_the_cpu_without_each_shim(tmp_path, shim):
    message, where = WITHOUT_SHIM[shim]
    result = isolated(
        "tests.scenario_megatron:megatron_update_without_shim", timeout=800, workdir=str(tmp_path), omit=shim
    )
    assert result["ok"] is False, f"verl's Megatron engine ran without the {shim} shim: the shim is not needed"
    assert message in result["error"], result
    assert result["raised_in"].startswith(where), result


@pytest.mark.slow  # two fresh processes that import verl's Megatron engine
def test_the_shims_are_installed_only_when_a_cpu_process_builds_a_megatron_engine():
    gpu = isolated("tests.scenario_megatron:megatron_shim_isolation", timeout=300, cpu=False)
    assert gpu == {
        "megatron_engine_imported": True,
        "shim_module_imported": False,  # never imported outside VERL_PLATFORM=cpu
        "engine_init_wrapped": False,
        "tensor_cuda_remapped": False,
    }
    cpu = isolated("tests.scenario_megatron:megatron_shim_isolation", timeout=300)
    assert cpu == {
        "megatron_engine_imported": True,
        "shim_module_imported": True,
        "engine_init_wrapped": True,  # the shims come with the first engine ...
        "tensor_cuda_remapped": False,  # ... not before (an FSDP run imports this module too)
    }


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from verl_offpolicy.demo.tiny import build_tiny

    return build_tiny(tmp_path_factory.mktemp("megatron_guard") / "tiny")


def _megatron_problems(tiny, *overrides):
    from tests.actor_harness import compose_cpu_config
    from verl_offpolicy.cpu.guards import check_cpu_config

    cfg = compose_cpu_config(
        tiny["model_path"], tiny["tokenizer_path"], ["+algorithm=opmd", *overrides], engine="megatron"
    )
    return check_cpu_config(cfg)


def test_the_megatron_overlay_is_accepted(tiny):
    assert _megatron_problems(tiny) == []


MCORE = "actor_rollout_ref.actor.megatron"


@pytest.mark.parametrize(
    "override, key, fix",
    [
        (f"{MCORE}.vanilla_mbridge=false", f"{MCORE}.vanilla_mbridge=False", "TransformerEngine"),
        ("actor_rollout_ref.model.use_remove_padding=true", "use_remove_padding=True", "use_remove_padding=false"),
        (f"{MCORE}.param_offload=true", f"{MCORE}.param_offload=True", "param_offload=false"),
        (f"{MCORE}.optimizer_offload=true", f"{MCORE}.optimizer_offload=True", "optimizer_offload=false"),
        (f"{MCORE}.tensor_model_parallel_size=2", "tensor_model_parallel_size=2", "tensor_model_parallel_size=1"),
        (f"{MCORE}.pipeline_model_parallel_size=2", "pipeline_model_parallel_size=2", "pipeline_model_parallel_size=1"),
        (
            f"{MCORE}.override_transformer_config.attention_backend=flash",
            "attention_backend='flash'",
            "attention_backend=local",
        ),
        (
            f"{MCORE}.override_transformer_config.use_cpu_initialization=false",
            "use_cpu_initialization=False",
            "use_cpu_initialization=true",
        ),
        ("actor_rollout_ref.model.use_fused_kernels=true", "use_fused_kernels=True", "use_fused_kernels=false"),
    ],
)
def test_a_megatron_setting_that_cannot_run_on_the_cpu_is_named_with_its_fix(tiny, override, key, fix):
    assert_named_with_fix(_megatron_problems(tiny, override), key, fix)


@pytest.mark.parametrize(
    "engine, config_name, overlay, seed_key",
    [
        ("fsdp", "offpolicy_trainer", "+cpu=demo", "actor_rollout_ref.actor.fsdp_config.seed"),
        ("megatron", "offpolicy_megatron_trainer", "+cpu=megatron", "actor_rollout_ref.actor.megatron.seed"),
    ],
)
def test_demo_engine_switch_picks_the_primary_config_overlay_and_seed_key(
    engine, config_name, overlay, seed_key, monkeypatch
):
    import verl_offpolicy.demo.run as demo
    from verl_offpolicy.cli import main
    from verl_offpolicy.demo.command import CPU_ENGINES, cpu_engine
    from verl_offpolicy.demo.errors import DemoError

    seen = {}

    def fake_run_demo(**kwargs):
        seen.update(kwargs)
        raise DemoError("stopped by the test")

    monkeypatch.setattr(demo, "run_demo", fake_run_demo)
    assert main(["demo", *(["--engine", engine] if engine != "fsdp" else []), "--steps", "1"]) == 1
    assert seen["config_name"] == config_name
    # demo_command builds the main_ppo command line from the same table (run by the e2e tests below)
    assert cpu_engine(config_name) == engine
    assert CPU_ENGINES[engine][1:] == (overlay, seed_key)


# ------------------------------------------------------------------------------ end to end

E2E_STEPS = 3
E2E_TIMEOUT = 1200  # measured: 296 s for 3 steps on a busy 2-core machine (170 s of start-up)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.extended  # two Megatron main_ppo runs (~3 min of start-up each): outside the default run's budget
@pytest.mark.timeout(E2E_TIMEOUT + 300)
@pytest.mark.parametrize("preset", ["asymre", "rec_oneside_is"])
def test_two_presets_train_through_main_ppo_on_verls_megatron_engine(preset, tmp_path):
    """``verl-offpolicy demo --engine megatron``: stock main_ppo, offpolicy_megatron_trainer, +cpu=megatron.

    Rollout weights are refreshed every 2 steps with the behaviour anchor, so step 2 trains on the
    batch generated before step 1's update: its anchor log-ratio (Megatron's log-probs now minus at
    generation) is non-zero only if the Megatron engine's weights changed.
    """
    from verl_offpolicy.demo.command import CPU_ENGINES
    from verl_offpolicy.demo.run import run_demo

    result = run_demo(
        preset=preset,
        steps=E2E_STEPS,
        seed=0,
        output_dir=str(tmp_path / preset),
        timeout=E2E_TIMEOUT,
        config_name=CPU_ENGINES["megatron"][0],
        overrides=[
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "algorithm.offpolicy.sync_interval=2",
            "algorithm.offpolicy.ratio_anchor=behaviour",
        ],
    )
    metrics = {m["step"]: m for m in result.metrics}
    assert sorted(metrics) == list(range(1, E2E_STEPS + 1))
    for step, m in metrics.items():
        # our trainer's schedule: s = 2 -> versions 0, 0, 2 and staleness 0, 1, 0 (under verl's own name)
        staleness = m["training/off_policy/trajectory_staleness/mean"]
        assert (m["offpolicy/version"], staleness) == {1: (0, 0), 2: (0, 1), 3: (2, 0)}[step]
        # our rec loss (verl's vanilla loss logs no ratio statistics)
        assert {"actor/pg_clipfrac_upper", "actor/ratio_mean", "actor/ratio_max"} <= set(m)
        assert m["actor/grad_norm"] > 0 and math.isfinite(m["actor/pg_loss"])
        if staleness == 0:
            # the hf rollout got the Megatron engine's current weights (bf16 actor vs fp32 rollout;
            # measured ≤ 0.006). On the stale step 2 they differ by design (measured 0.64).
            assert m["training/rollout_probs_diff_max"] < 0.05
        if preset == "asymre":
            # our estimator: A = r − (r̄ + shift), token-mean ≈ −shift = +0.1 (GRPO's would be ≈ 0)
            assert m["critic/advantages/mean"] == pytest.approx(0.1, abs=0.03)
    # the weights moved between generating step 2's batch and training on it (measured −0.76 for
    # asymre), and the ratio against the behaviour policy is no longer 1
    assert abs(metrics[2]["offpolicy/anchor_log_ratio/mean"]) > 1e-3
    assert metrics[2]["actor/ratio_max"] > 1.0
    assert metrics[1]["actor/ratio_max"] == pytest.approx(1.0)  # fresh batch, same weights


TWO_RANK_STEPS = 6
TWO_RANK_VERSIONS = [0, 0, 0, 0, 0, 4]  # (4, 1), steps 1..6 (docs/scheduler.md)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.extended  # one Megatron main_ppo run with two ranks (~3-5 min): outside the default run's budget
@pytest.mark.timeout(E2E_TIMEOUT + 300)
def test_two_megatron_ranks_train_the_scheduled_versions_at_4_1(tmp_path):
    """``verl-offpolicy demo --engine megatron trainer.n_gpus_per_node=2``: two data-parallel Megatron ranks (two
    training worker processes, gloo) through the scheduler at (4, 1). Versions and the versions the rollout tagged
    equal the schedule; on the fresh step the rollout got the ranks' current weights (bf16 actor vs fp32 rollout)."""
    import re

    from verl_offpolicy.demo.command import CPU_ENGINES
    from verl_offpolicy.demo.run import run_demo

    result = run_demo(
        preset="opmd",
        steps=TWO_RANK_STEPS,
        seed=0,
        output_dir=str(tmp_path / "two_ranks"),
        timeout=E2E_TIMEOUT,
        config_name=CPU_ENGINES["megatron"][0],
        overrides=[
            "trainer.test_freq=-1",
            "trainer.n_gpus_per_node=2",
            "algorithm.offpolicy.sync_interval=4",
            "algorithm.offpolicy.sync_offset=1",
        ],
    )
    assert [m["step"] for m in result.metrics] == list(range(1, TWO_RANK_STEPS + 1))
    assert [int(m["offpolicy/version"]) for m in result.metrics] == TWO_RANK_VERSIONS
    assert [int(m["offpolicy/observed_version/max"]) for m in result.metrics] == TWO_RANK_VERSIONS
    assert result.metrics[0]["training/rollout_probs_diff_max"] < 0.05  # measured 0.0034
    assert all(m["actor/grad_norm"] > 0 and math.isfinite(m["actor/pg_loss"]) for m in result.metrics)
    workers = set(re.findall(r"\(WorkerDict pid=(\d+)", Path(result.log_path).read_text()))
    assert len(workers) == 2, workers  # two training ranks, each its own process
