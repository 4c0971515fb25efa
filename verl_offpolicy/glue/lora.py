"""Startup rules of verl's LoRA keys (``actor_rollout_ref.model.lora_rank``, ``lora_alpha``, ``lora.merge``) that
are pure config, on every machine: verl takes each of these values without a word.

- ``lora_rank`` an integer >= 0: verl enables LoRA at ``> 0``, so a negative rank silently trains every parameter,
  and a float rank slipped past the merge rules;
- ``lora.merge`` a boolean;
- with LoRA on, ``lora_alpha`` a number > 0: the adapter's update is scaled by alpha / rank, so 0 trains nothing.

What needs the model's or the adapter's files is checked when they are on this machine (a GPU cluster's paths may
be its nodes' only): ``target_modules`` names a module of the model at ``model.path`` (matched by peft's own rule,
the model built on the meta device), and a ``lora_adapter_path`` that exists is a saved peft adapter
(:func:`check_lora_files`). The CPU path's guard also requires the adapter folder to exist (nothing is downloaded
there). LoRA with the rollout on a pool of its own: ``scheduler.checks.check_lora_disaggregated``.
"""

from __future__ import annotations

import math
import os

from omegaconf import OmegaConf

from verl_offpolicy.glue.knobs import OffPolicyConfigError

MODEL = "actor_rollout_ref.model"


def _refuse(key: str, got, fix: str) -> None:
    raise OffPolicyConfigError(f"{key}={got!r}: {fix}")


def check_lora_values(view) -> None:
    """``lora_rank`` an integer >= 0, ``lora.merge`` a boolean, and with LoRA on ``lora_alpha`` a number > 0."""
    rank = view.select(f"{MODEL}.lora_rank", 0)
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 0):
        _refuse(
            f"{MODEL}.lora_rank",
            rank,
            "must be an integer: 0 (no LoRA) or the adapter's rank > 0 (verl reads any "
            "other value as no LoRA or passes it to peft unchecked; a negative rank trains every parameter)",
        )
    merge = view.select(f"{MODEL}.lora.merge", False)
    if not isinstance(merge, bool):
        _refuse(f"{MODEL}.lora.merge", merge, "must be true or false")
    if not rank:
        return
    alpha = view.select(f"{MODEL}.lora_alpha", 16)
    if not (isinstance(alpha, int | float) and not isinstance(alpha, bool) and math.isfinite(alpha) and alpha > 0):
        _refuse(
            f"{MODEL}.lora_alpha",
            alpha,
            f"the adapter's update is scaled by lora_alpha / lora_rank, so it must be a "
            f"number > 0 (0 trains nothing); e.g. {MODEL}.lora_alpha=16",
        )


def model_module_names(model_path) -> dict[str, bool] | None:
    """The module names of the HF model folder ``model_path`` (built on the meta device: no weights are read), each
    with whether it is a ``torch.nn.Linear``; None if the folder or its config cannot be read here."""
    if not model_path or not os.path.isfile(os.path.join(os.path.expanduser(str(model_path)), "config.json")):
        return None
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(os.path.expanduser(str(model_path)))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception:  # noqa: BLE001 - a model this check cannot build is verl's to report
        return None
    return {name: isinstance(module, torch.nn.Linear) for name, module in model.named_modules() if name}


def check_lora_files(view) -> None:
    """With LoRA on: a ``lora_adapter_path`` that exists here holds a saved peft adapter; without one,
    ``target_modules`` names at least one module of the model at ``model.path`` when that folder is here."""
    rank = view.select(f"{MODEL}.lora_rank", 0)
    if not rank:
        return
    adapter = view.select(f"{MODEL}.lora_adapter_path")
    if adapter is not None:
        folder = os.path.expanduser(str(adapter))
        if os.path.exists(folder) and not os.path.isfile(os.path.join(folder, "adapter_config.json")):
            _refuse(
                f"{MODEL}.lora_adapter_path",
                adapter,
                "is not a saved peft adapter (no adapter_config.json in it); point it at the folder peft's "
                "save_pretrained wrote, or null to train a new adapter",
            )
        return  # the saved adapter's own target modules apply
    targets = view.select(f"{MODEL}.target_modules", "all-linear")
    if OmegaConf.is_config(targets):
        targets = OmegaConf.to_container(targets, resolve=True)
    if targets == "all-linear":
        return
    modules = model_module_names(view.select(f"{MODEL}.path"))
    if modules is None:
        return
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists

    try:
        config = LoraConfig(r=rank, target_modules=targets, exclude_modules=view.select(f"{MODEL}.exclude_modules"))
        matched = any(check_target_module_exists(config, name) for name in modules)
    except (TypeError, ValueError) as exc:
        _refuse(f"{MODEL}.target_modules", targets, f"peft does not take it ({exc})")
    if not matched:
        leaves = sorted({name.rsplit(".", 1)[-1] for name, linear in modules.items() if linear})
        _refuse(
            f"{MODEL}.target_modules",
            targets,
            f"names no module of the model at {MODEL}.path (peft would refuse it in the worker); its linear "
            f"modules: {', '.join(leaves)}, or all-linear",
        )


RULES = (check_lora_values, check_lora_files)
