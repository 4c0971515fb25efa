"""Startup rules of verl's LoRA keys (``actor_rollout_ref.model.lora_rank``, ``lora_alpha``, ``lora.merge``) that
are pure config, on every machine: verl takes each of these values without a word.

- ``lora_rank`` an integer >= 0: verl enables LoRA at ``> 0``, so a negative rank silently trains every parameter,
  and a float rank slipped past the merge rules;
- ``lora.merge`` a boolean;
- with LoRA on, ``lora_alpha`` a number > 0: the adapter's update is scaled by alpha / rank, so 0 trains nothing.

What needs the model's or the adapter's files (``target_modules`` naming a module of the model, a local
``lora_adapter_path``) is checked where those files are: the CPU path's guard (``cpu/guards.py``). LoRA with the
rollout on a pool of its own: ``scheduler.checks.check_lora_disaggregated``.
"""

from __future__ import annotations

import math

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


RULES = (check_lora_values,)
