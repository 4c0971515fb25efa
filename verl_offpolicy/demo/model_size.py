"""The trained model's size for a demo's ``summary.json``: ``parameters``, ``trainable_parameters``, ``lora_rank``.

verl logs only the total ("PeftModelForCausalLM contains 93.50K parameters"). Here the model is built as verl's
FSDP engine builds it, from the run's composed config (``hydra/.hydra/config.yaml``): the model's config on
the meta device (no weights), wrapped by PEFT with verl's ``LoraConfig`` when ``actor_rollout_ref.model.lora_rank
> 0`` (``transformer_impl.py``: rank, alpha, target and excluded modules, no bias), and its parameters counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional


def model_size(composed_config: str | Path) -> Optional[dict[str, Any]]:
    """The counts of the run whose composed config is at ``composed_config``, or None if it is not there."""
    from omegaconf import OmegaConf

    path = Path(composed_config)
    if not path.is_file():
        return None
    model = OmegaConf.to_container(OmegaConf.load(path).actor_rollout_ref.model, resolve=False)
    return count_parameters(model)


def count_parameters(model: dict[str, Any]) -> dict[str, Any]:
    """``{"parameters", "trainable_parameters", "lora_rank"}`` of verl's ``actor_rollout_ref.model`` section."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model["path"])
    with torch.device("meta"):
        module = AutoModelForCausalLM.from_config(config)
    rank = int(model.get("lora_rank") or 0)
    if rank > 0:
        from peft import LoraConfig, TaskType, get_peft_model

        module = get_peft_model(
            module,
            LoraConfig(
                task_type=TaskType.CAUSAL_LM,
                r=rank,
                lora_alpha=model.get("lora_alpha", 16),
                target_modules=model.get("target_modules"),
                exclude_modules=model.get("exclude_modules"),
                bias="none",
            ),
        )
    parameters = list(module.parameters())
    return {
        "parameters": sum(p.numel() for p in parameters),
        "trainable_parameters": sum(p.numel() for p in parameters if p.requires_grad),
        "lora_rank": rank,
    }
