"""One real FSDP2 actor update per loss (ours and verl's ``vanilla``), run in a fresh
``VERL_PLATFORM=cpu`` process (``isolated("tests.scenario_losses:<function>")``); results are JSON.

- :func:`offpolicy_loss_updates`: one update per verl-offpolicy loss case, weights and log-probs before/after.
- :func:`m2po_micro_batch_updates`: ``m2po`` with different micro-batch sizes from identical weights.
- :func:`demo_vanilla_update`: one update with verl's ``vanilla`` loss.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Optional

from tests.actor_harness import ActorHarness

LOSS_TARGET = "actor_rollout_ref.actor.policy_loss._target_=verl_offpolicy.glue.config.OffPolicyLossConfig"


def _repeat_c_tokens(harness) -> tuple[list[int], list[int], list[int]]:
    """Token ids of the prompt ``repeat c`` (chat template) and the responses ``c c </s>`` and ``d d </s>``."""
    tok = harness.tokenizer
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "repeat c"}], add_generation_prompt=True, tokenize=True
    )
    if hasattr(prompt, "keys"):
        prompt = prompt["input_ids"]
    return prompt, tok.convert_tokens_to_ids(["c", "c", "</s>"]), tok.convert_tokens_to_ids(["d", "d", "</s>"])


def offpolicy_loss_updates(workdir: str, cases: list[dict[str, Any]], lr: float = 1e-2) -> dict[str, Any]:
    """For each case {"name", "loss_mode", "overrides", "old_log_prob_shift"}: one real FSDP2 update.

    Batch: prompt ``repeat c``; responses ``c c </s>`` with A = +1 and ``d d </s>`` with A = −1.
    ``old_log_prob_shift`` sets old_log_prob = log π − shift (ρ = e^shift on every token; 0 = on-policy).
    Returns, per case, how far the weights moved and the sequence log-probs before and after.
    """
    report = {}
    harness = None
    for case in cases:
        harness = ActorHarness.create(
            Path(workdir) / case["name"],
            loss_mode=case["loss_mode"],
            lr=lr,
            overrides=[LOSS_TARGET, *case.get("overrides", [])],
        )
        prompt, good, bad = _repeat_c_tokens(harness)
        batch = harness.make_batch([prompt] * 4, [good, bad, good, bad], [1.0, -1.0, 1.0, -1.0])
        before_lp = harness.log_probs(batch)
        batch["old_log_probs"] = (before_lp - float(case.get("old_log_prob_shift", 0.0))) * batch["response_mask"]
        before = harness.state_dict()
        metrics = harness.update(batch)
        after = harness.state_dict()
        after_lp = harness.log_probs(batch)
        report[case["name"]] = {
            "max_abs_change": max(float((after[k] - before[k]).abs().max()) for k in before),
            "good_before": float(before_lp.sum(-1)[0::2].mean()),
            "good_after": float(after_lp.sum(-1)[0::2].mean()),
            "bad_before": float(before_lp.sum(-1)[1::2].mean()),
            "bad_after": float(after_lp.sum(-1)[1::2].mean()),
            "metrics": {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)},
        }
    return report


# Extra shifts log π − log π_old of the m2po batch (8 responses × 3 tokens, advantages +1, −1, +1, ...,
# micro-batches of 2 responses). Harmful tokens (M2PO's trust-region pool): ρ > 1 with A = +1, ρ < 1 with
# A = −1. Every token has (log ρ)² = 0.0025 (+0.05 on A = +1 rows, −0.05 on A = −1 rows, all harmful) except,
# all in the first micro-batch, row 0's moderate 0.5 (0.25, harmful) and row 1's 2.5, −1, −1.5: the 2.5
# (6.25, the largest; A = −1 with ρ > 1) is outside the pool, the −1 (1) and −1.5 (2.25) are in it.
# Over the mini-batch's pool: 20 × 0.0025 + 0.25 → mean 0.0143 ≤ 0.04, adding the 1 → 0.0591 > 0.04, so
# exactly the −1 and −1.5 go (2 of 24); the 2.5 stays. Within the first micro-batch alone (pool 2 × 0.0025,
# 0.25, 1, 2.25: 2 × 0.0025 + 0.25 → mean 0.085 > 0.04) the moderate token would go too (3 of 24).
M2PO_SHIFTS = [[0.05, 0.05, 0.5], [2.5, -1.0, -1.5]] + [[0.05, 0.05, 0.05], [-0.05, -0.05, -0.05]] * 3
M2PO_MASKED_TOKENS = 2


def m2po_micro_batch_updates(workdir: str, micro_batch_sizes: list[int], lr: float = 1e-2) -> dict[str, Any]:
    """One real FSDP2 update with ``m2po`` per micro-batch size, from identical weights and data.

    Returns, per size, the metrics of the update and the updated weights' max distance from those of the
    first size, and how far the first update moved the weights.
    """
    import torch

    report: dict[str, Any] = {}
    first_after = None
    for size in micro_batch_sizes:
        harness = ActorHarness.create(Path(workdir) / f"micro{size}", loss_mode="m2po", lr=lr, overrides=[LOSS_TARGET])
        prompt, good, bad = _repeat_c_tokens(harness)
        batch = harness.make_batch([prompt] * 8, [good, bad] * 4, [1.0, -1.0] * 4)
        shifts = torch.tensor(M2PO_SHIFTS)
        batch["old_log_probs"] = (harness.log_probs(batch) - shifts) * batch["response_mask"]
        before = harness.state_dict()
        metrics = harness.update(batch, micro_batch_size=size)
        after = harness.state_dict()
        entry = {"metrics": {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}}
        if first_after is None:
            first_after = after
            entry["max_abs_change"] = max(float((after[k] - before[k]).abs().max()) for k in before)
        entry["max_abs_diff_from_first"] = max(float((after[k] - first_after[k]).abs().max()) for k in after)
        report[str(size)] = entry
    return report


def demo_vanilla_update(workdir: Optional[str] = None, lr: float = 1e-2) -> dict[str, Any]:
    """One real update with verl's ``vanilla`` loss; returns what changed (used by the tests).

    Prompts ``repeat c``, responses ``c c </s>`` (advantage +1) and ``d d </s>`` (advantage -1):
    after the update the log-prob of the positive responses must rise and the negative ones fall.
    """
    workdir = workdir or tempfile.mkdtemp(prefix="vo-harness-")
    harness = ActorHarness.create(workdir, loss_mode="vanilla", lr=lr)
    tok = harness.tokenizer
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "repeat c"}], add_generation_prompt=True, tokenize=True
    )
    if isinstance(prompt, dict) or hasattr(prompt, "keys"):
        prompt = prompt["input_ids"]
    good = tok.convert_tokens_to_ids(["c", "c", "</s>"])
    bad = tok.convert_tokens_to_ids(["d", "d", "</s>"])
    batch = harness.make_batch([prompt] * 4, [good, bad, good, bad], [1.0, -1.0, 1.0, -1.0])
    before_weights = harness.state_dict()
    before_lp = harness.log_probs(batch)
    metrics = harness.update(batch)
    after_weights = harness.state_dict()
    after_lp = harness.log_probs(batch)
    changed = {name: float((after_weights[name] - before_weights[name]).abs().max()) for name in before_weights}
    seq_before = before_lp.sum(-1)
    seq_after = after_lp.sum(-1)
    return {
        "num_params": len(before_weights),
        "num_changed": sum(v > 0 for v in changed.values()),
        "max_abs_change": max(changed.values()),
        "good_logp_before": float(seq_before[0::2].mean()),
        "good_logp_after": float(seq_after[0::2].mean()),
        "bad_logp_before": float(seq_before[1::2].mean()),
        "bad_logp_after": float(seq_after[1::2].mean()),
        "metrics": {k: (float(v) if isinstance(v, int | float) else str(v)) for k, v in metrics.items()},
    }
