"""verl's Megatron engine on the CPU (opt-in): the shims megatron-core and mbridge need without CUDA.

verl's Megatron engine (``verl/workers/engine/megatron/transformer_impl.py``) runs on the CPU with
megatron-core 0.16.1 and the pure-Python ``mbridge`` (``actor_rollout_ref.actor.megatron.vanilla_mbridge=true``;
Megatron-Bridge, verl's default, needs TransformerEngine) once the CUDA assumptions below are
replaced. Each shim is one function, named in :data:`SHIMS`, installed by :func:`install` only in a
process with ``VERL_PLATFORM=cpu`` (:func:`verl_offpolicy.cpu.platform.cpu_selected`) when it builds
its first Megatron engine (:func:`install_on_engine_build`); on a GPU cluster this module is never
imported (:func:`verl_offpolicy.cpu.registration.register_megatron_shims` returns at once outside the
CPU platform). ``tests/cpu/test_megatron_cpu.py`` removes each shim and checks the error it prevents.

What cannot work on the CPU is rejected at startup by
:func:`verl_offpolicy.cpu.engine_guards.check_megatron_cpu_config`, naming the key and the value to set;
the ``+cpu=megatron`` overlay (``verl_offpolicy/configs/cpu/megatron.yaml``) sets all of it.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from verl_offpolicy.glue.patching import patch_once

# ------------------------------------------------------------------------------------------------
# Shims (each: what CUDA assumption, where, what replaces it)
# ------------------------------------------------------------------------------------------------


def _cpu_get_rng_state(device: Any = "cuda", clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
    return torch.get_rng_state()


def _cpu_set_rng_state(new_state: torch.Tensor, device: Any = -1, graph_safe: bool = False) -> None:
    torch.set_rng_state(new_state)


def shim_rng_tracker() -> None:
    """Megatron's RNG tracker keeps its named states on the CPU generator instead of CUDA's.

    ``megatron/core/tensor_parallel/random.py``: ``model_parallel_cuda_manual_seed`` (called by verl's
    ``verl/workers/engine/megatron/utils.py:set_random_seed`` when the engine is built) adds three
    named RNG states with ``CudaRNGStatesTracker.add`` (``torch.cuda.get_rng_state()``, random.py:235,
    raises "Torch not compiled with CUDA enabled"), and ``fork`` (random.py:250-277) swaps them with
    ``_get_cuda_rng_state``/``_set_cuda_rng_state``. The module's two helpers are rebound to the CPU
    generator and the tracker class to a subclass whose ``add`` seeds the CPU generator.
    """
    import megatron.core.tensor_parallel.random as mrandom

    if patch_once(mrandom, "CudaRNGStatesTracker", _cpu_rng_tracker):
        mrandom._get_cuda_rng_state = _cpu_get_rng_state
        mrandom._set_cuda_rng_state = _cpu_set_rng_state


def _cpu_rng_tracker(base: type) -> type:
    class CPURNGStatesTracker(base):  # type: ignore[misc, valid-type]
        """``CudaRNGStatesTracker`` over ``torch``'s CPU generator."""

        def add(self, name: str, seed: int) -> None:
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            self.seeds_.add(seed)
            if name in self.states_:
                raise Exception(f"cpu rng state {name} already exists")
            original = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(original)

    return CPURNGStatesTracker


def shim_local_layer_spec() -> None:
    """mbridge builds the GPT layers from megatron-core's local spec instead of TransformerEngine's.

    ``mbridge/core/llm_bridge.py:149`` calls ``get_gpt_decoder_block_spec(config,
    use_transformer_engine=True)``; without TransformerEngine that fails at
    ``megatron/core/models/gpt/gpt_layer_specs.py:527`` (``NameError: name 'TENorm' is not defined``).
    The name is rebound in ``llm_bridge`` to a wrapper that passes ``use_transformer_engine=False``:
    megatron-core's own torch modules (RMSNorm, SwiGLU MLP, ``DotProductAttention``).
    """
    import mbridge.core.llm_bridge as llm_bridge

    def local_spec(original):
        @functools.wraps(original)
        def get_gpt_decoder_block_spec(config, use_transformer_engine: bool = False, *args, **kwargs):
            return original(config, False, *args, **kwargs)

        return get_gpt_decoder_block_spec

    patch_once(llm_bridge, "get_gpt_decoder_block_spec", local_spec)


# Local-spec parameter (without TE the layer norms are modules of their own) -> HF name template.
LOCAL_SPEC_NORMS = {
    "input_layernorm.weight": "model.layers.{layer_number}.input_layernorm.weight",
    "pre_mlp_layernorm.weight": "model.layers.{layer_number}.post_attention_layernorm.weight",
}


def shim_local_spec_weight_names() -> None:
    """mbridge maps the local spec's two layer-norm parameters to their Hugging Face names.

    With TransformerEngine the norms are fused into the next linear layer
    (``self_attention.linear_qkv.layer_norm_weight``, ``mlp.linear_fc1.layer_norm_weight``, the only
    names in mbridge's ``_ATTENTION_MAPPING``/``_MLP_MAPPING``, ``mbridge/core/bridge.py:524-590`` and
    ``mbridge/models/llama.py``); the local spec has ``decoder.layers.N.input_layernorm.weight`` and
    ``decoder.layers.N.pre_mlp_layernorm.weight``, for which ``Bridge._weight_name_mapping_mcore_to_hf``
    (bridge.py:649) raises ``NotImplementedError: Unsupported parameter name``. The wrapper maps them
    (:data:`LOCAL_SPEC_NORMS`) and defers every other name to mbridge.
    """
    from mbridge.core.bridge import Bridge

    def with_local_norms(original):
        @functools.wraps(original)
        def _weight_name_mapping_mcore_to_hf(self, mcore_weights_name: str) -> list[str]:
            parts = mcore_weights_name.split(".")
            if len(parts) == 5 and parts[:2] == ["decoder", "layers"]:
                template = LOCAL_SPEC_NORMS.get(".".join(parts[3:]))
                if template is not None:
                    return [template.format(layer_number=parts[2])]
            return original(self, mcore_weights_name)

        return _weight_name_mapping_mcore_to_hf

    patch_once(Bridge, "_weight_name_mapping_mcore_to_hf", with_local_norms)


def _module_cuda(self, device: Any = None):
    return self


def _tensor_cuda(self, device: Any = None, non_blocking: bool = False, memory_format: Any = None):
    return self


def _cpu_current_device() -> torch.device:
    return torch.device("cpu")


# torch factory functions that megatron-core calls with ``device='cuda'`` (41 literal sites in
# optimizer/, distributed/, tensor_parallel/, pipeline_parallel/ and utils.py of megatron-core 0.16.1).
FACTORY_FUNCTIONS = ("tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "rand", "randn", "randint")


def _is_cuda_device(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)


def _on_cpu(factory: Callable) -> Callable:
    """``factory`` with a CUDA ``device`` (``'cuda'``, ``'cuda:N'``, an index) replaced by the CPU."""

    @functools.wraps(factory)
    def wrapper(*args, **kwargs):
        if _is_cuda_device(kwargs.get("device")):
            kwargs["device"] = "cpu"
            kwargs.pop("pin_memory", None)  # pinning needs an accelerator
        return factory(*args, **kwargs)

    return wrapper


def shim_cuda_device_remap() -> None:
    """A CUDA device means the CPU: ``torch.cuda.current_device()``, ``.cuda()``, ``device='cuda'``.

    megatron-core and mbridge place tensors on CUDA in ~570 places: ``device=torch.cuda.current_device()``
    (e.g. ``megatron/core/utils.py``'s ``GlobalMemoryBuffer.get_tensor``), ``.cuda(...)`` (e.g.
    ``mbridge/core/util.py:151`` ``model_module.cuda(torch.cuda.current_device())``) and literal
    ``device='cuda'`` (e.g. ``megatron/core/optimizer/optimizer.py:485``, ``clip_grads.py:90``,
    ``pipeline_parallel/schedules.py:596``); on a CPU-only torch each raises "Torch not compiled with
    CUDA enabled". Rather than patch call sites, the entry points are rebound: ``current_device``
    returns ``torch.device('cpu')``, ``Tensor.cuda``/``Module.cuda`` return their object unchanged
    (everything lives on the CPU) and the factories of :data:`FACTORY_FUNCTIONS` map a CUDA
    ``device`` to ``'cpu'`` (dropping ``pin_memory``). Only in a process without CUDA
    (``torch.cuda.is_available()`` is False), where every one of these calls would have raised.
    """
    if torch.cuda.is_available():
        raise RuntimeError("the CPU device remap must not be installed in a process that has CUDA")
    if not patch_once(torch.Tensor, "cuda", lambda _: _tensor_cuda):
        return
    patch_once(torch.cuda, "current_device", lambda _: _cpu_current_device)
    patch_once(torch.nn.Module, "cuda", lambda _: _module_cuda)
    for name in FACTORY_FUNCTIONS:
        patch_once(torch, name, _on_cpu)


def _cpu_type_reports_cuda(original_type: Callable) -> Callable:
    def type_(self, dtype: Any = None, non_blocking: bool = False, **kwargs):
        if dtype is None and not kwargs and self.device.type == "cpu":
            name = original_type(self)  # 'torch.FloatTensor'
            return name.replace("torch.", "torch.cuda.", 1)
        return original_type(self, dtype, non_blocking, **kwargs)

    return type_


def _with_cuda_type_names(fn: Callable) -> Callable:
    """``fn`` during which ``Tensor.type()`` of a CPU tensor returns the CUDA name of its type."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        original_type = torch.Tensor.type
        torch.Tensor.type = _cpu_type_reports_cuda(original_type)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.Tensor.type = original_type

    return wrapper


def shim_cuda_type_checks() -> None:
    """megatron-core's optimizer accepts CPU parameters where it checks for CUDA tensor type names.

    ``megatron/core/optimizer/distrib_optimizer.py:361,420`` (``DistributedOptimizer.__init__`` ->
    ``_build_model_and_main_param_groups``: "TypeError: Wrapped parameters must be one of
    torch.cuda.FloatTensor, torch.cuda.HalfTensor, or torch.cuda.BFloat16Tensor. Received
    torch.BFloat16Tensor"), ``distrib_optimizer.py:582``, ``optimizer/optimizer.py:671,690``
    (``Float16OptimizerWithFloat16Params.__init__``) and ``optimizer/clip_grads.py:167``
    (``clip_grad_by_total_norm_fp32``: ``assert param.grad.type() == 'torch.cuda.FloatTensor'``)
    classify parameters by ``Tensor.type()``. Those three functions are wrapped so that, while they
    run, ``Tensor.type()`` (no argument) of a CPU tensor answers the CUDA name of the same dtype;
    ``Tensor.type`` is restored when they return and is untouched everywhere else.
    """
    from megatron.core.optimizer import clip_grads, distrib_optimizer, optimizer

    if not patch_once(clip_grads, "clip_grad_by_total_norm_fp32", _with_cuda_type_names):
        return
    for cls in (distrib_optimizer.DistributedOptimizer, optimizer.Float16OptimizerWithFloat16Params):
        patch_once(cls, "__init__", _with_cuda_type_names)
    optimizer.clip_grad_by_total_norm_fp32 = (
        clip_grads.clip_grad_by_total_norm_fp32
    )  # imported by name (optimizer.py:50)


def causal_padding_mask(keep: torch.Tensor) -> torch.Tensor:
    """Megatron's boolean mask [B, 1, S, S] (True = masked) from verl's key mask [B, S] (True = token).

    masked[b, 0, q, k] = (k > q) or not keep[b, k]: causal self-attention over the real tokens.
    """
    seq = keep.shape[-1]
    future = torch.ones(seq, seq, dtype=torch.bool, device=keep.device).triu(1)
    return future[None, None] | ~keep.bool()[:, None, None, :]


def shim_bshd_attention_mask() -> None:
    """megatron-core's local attention gets a causal padding mask from verl's padded (bshd) batches.

    With ``use_remove_padding=false`` (packed sequences need TransformerEngine's attention) verl's
    ``gptmodel_forward_model_engine`` passes the key mask of ``preprocess_bshd_engine``
    (``verl/models/mcore/util.py:708``, [B, S], True = token) as ``attention_mask``
    (``verl/models/mcore/model_forward.py:451``). TransformerEngine reads that as a padding mask;
    megatron-core's ``DotProductAttention`` (``megatron/core/transformer/dot_product_attention.py:210``)
    expects [B, 1, S, S] with True = masked and, given any mask, no longer adds the causal one
    (``megatron/core/fusions/fused_softmax.py:320-329``): it fails with "The size of tensor a (S) must
    match the size of tensor b (B)". ``DotProductAttention.forward`` is wrapped to turn a 2-D mask
    into :func:`causal_padding_mask` (causal self-attention only; anything else is rejected).
    """
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    def with_padding_mask(original):
        @functools.wraps(original)
        def forward(self, query, key, value, attention_mask, *args, **kwargs):
            if attention_mask is not None and attention_mask.dim() == 2:
                if self.attn_mask_type != AttnMaskType.causal:
                    raise NotImplementedError(
                        "verl-offpolicy's CPU Megatron path supports causal self-attention only (got "
                        f"{self.attn_mask_type})"
                    )
                attention_mask = causal_padding_mask(attention_mask)
            return original(self, query, key, value, attention_mask, *args, **kwargs)

        return forward

    patch_once(DotProductAttention, "forward", with_padding_mask)


# Every shim, in install order (one name per CUDA assumption; the tests cover each by name).
SHIMS: dict[str, Callable[[], None]] = {
    "rng_tracker": shim_rng_tracker,
    "local_layer_spec": shim_local_layer_spec,
    "local_spec_weight_names": shim_local_spec_weight_names,
    "cuda_device_remap": shim_cuda_device_remap,
    "cuda_type_checks": shim_cuda_type_checks,
    "bshd_attention_mask": shim_bshd_attention_mask,
}


def install(only: tuple[str, ...] | None = None) -> bool:
    """Install the shims (all, or the names in ``only``) in a CPU process. Returns True if installed.

    A no-op outside ``VERL_PLATFORM=cpu``. Normally run by :func:`install_on_engine_build` when the
    first Megatron engine of the process is built.
    """
    from verl_offpolicy.cpu.platform import cpu_selected

    if not cpu_selected():
        return False
    for name, shim in SHIMS.items():
        if only is None or name in only:
            shim()
    return True


def install_on_engine_build() -> None:
    """Make verl's ``MegatronEngine.__init__`` install the shims first (CPU processes only).

    verl imports its Megatron engine module in every process (``verl/workers/engine/__init__.py``),
    FSDP runs included; the shims are installed only in a process that builds a Megatron engine.
    Called by :func:`verl_offpolicy.cpu.registration.register_megatron_shims` right after verl imports
    ``verl.workers.engine.megatron.transformer_impl``.
    """
    from verl.workers.engine.megatron.transformer_impl import MegatronEngine

    def installing_first(original):
        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            install()
            original(self, *args, **kwargs)

        return __init__

    patch_once(MegatronEngine, "__init__", installing_first)
