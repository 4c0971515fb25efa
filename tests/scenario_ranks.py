"""One batch trained by every loss family on 1 and on 2 training ranks (real FSDP2 ``TrainingWorker``s, gloo).

:func:`rank_updates` runs on every rank of a world (``tests.actor_harness.run_ranks`` starts a world of 1
and a world of 2 at once, 3 processes): per family it builds a fresh worker from the same tiny model,
trains this rank's share of :data:`RESPONSES` (verl's dispatch: rank r gets the r-th contiguous chunk)
in one optimizer step of the whole batch, and writes the gradient and the updated weights (rank 0, full
tensors) to ``<workdir>/w<size>/<family>.pt``. It returns per family the update's metrics and, for
``m2po``, the token mask its loss applied on this rank.

The batch makes a per-rank aggregation visible: rank 0 holds 4 short responses (10 tokens), rank 1
4 long ones (22 tokens), so a token mean over one rank's tokens weighs them differently from the mean
over all 32. The shifts log π − log π_old put M2PO's extreme and moderate tokens all on rank 0 (see
:data:`SHIFTS`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# family -> (preset of configs/algorithm, its loss_mode)
FAMILIES = {
    "rec": ("rec_oneside_is", "rec"),
    "opmd": ("opmd", "opmd"),
    "pmd": ("pmd_mean", "pmd"),
    "topr": ("topr", "topr"),
    "m2po": ("m2po", "m2po"),
    "pairwise_opmd": ("pairwise_opmd", "pairwise_opmd"),
    "agro": ("agro", "rec"),
}
# The cut is over M2PO's whole token pool here (pool `all`): the derivation below counts all 32 tokens; the
# trust-region pool, which drops the tokens whose ratio moves toward 1, has its own golden tests
# (tests/algorithms/test_algorithms_losses.py).
FAMILY_OVERRIDES = {"m2po": ["actor_rollout_ref.actor.policy_loss.m2po_token_pool=all"]}
# Responses (symbols of the tiny vocabulary) and their advantages; rows 0-3 go to rank 0, 4-7 to rank 1.
RESPONSES = [
    ["c", "d"],
    ["c", "c", "d"],
    ["d", "c"],
    ["d", "d", "c"],
    ["c", "c", "d", "d", "c", "c"],
    ["d", "c", "d", "c", "d"],
    ["c", "d", "c", "d", "c", "d"],
    ["d", "d", "c", "c", "d"],
]
ADVANTAGES = [1.0, -1.0, 0.5, -0.5, 1.0, -1.0, -0.5, 0.5]
PROMPT = ["a", "b"]
# log π − log π_old per token: ±0.05 ((log ρ)² = 0.0025) except, on rank 0, a moderate 0.7 (0.49) and the
# extremes 1, 1.5, −2 (1, 2.25, 4). M2PO's cut at 0.04 over all 32 tokens: without the 3 extremes the mean
# is (28·0.0025 + 0.49)/29 = 0.0193 ≤ 0.04, with the 1 it is 1.56/30 = 0.052 > 0.04: exactly the 3
# extremes go. Over rank 0's 10 tokens alone the moderate one would go too: (6·0.0025 + 0.49)/7 = 0.072.
SMALL = 0.05
SHIFTS = [
    [SMALL, 0.7],
    [1.0, 1.5, -2.0],
    [-SMALL, SMALL],
    [SMALL, -SMALL, SMALL],
    *[[SMALL * (-1) ** t for t in range(len(r))] for r in RESPONSES[4:]],
]
M2PO_MASKED = {(0, 1), (1, 0), (1, 1), (1, 2)}  # (row, token) not kept by a per-rank cut on rank 0 ...
M2PO_MASKED_GLOBAL = {(1, 0), (1, 1), (1, 2)}  # ... and by the cut over the whole mini-batch


def _spy_m2po_masks(log: list) -> None:
    """Record the keep mask of every m2po loss call (rows as lists of kept flags over the response tokens)."""
    from verl_offpolicy.core import losses as core

    original = core.m2po_loss

    def m2po_loss(log_prob, old_log_prob, advantages, mask, threshold):
        result = original(log_prob, old_log_prob, advantages, mask, threshold)
        keep = result[1]
        log.append(
            [
                [bool(k) for k, m in zip(row_keep.tolist(), row_mask.tolist()) if m]
                for row_keep, row_mask in zip(keep, mask)
            ]
        )
        return result

    core.m2po_loss = m2po_loss


def rank_updates(workdir: str, rank: int, world_size: int, families: list[str], lr: float = 1.0) -> dict[str, Any]:
    """This rank's part of one update per family (module docstring); returns {family: {...}}.

    The optimizer is SGD (verl's ``optim.optimizer``): its step is lr·(clipped gradient), so the updated
    weights agree to float precision when the gradients do. Adam's first step, about lr·sign(g) per
    weight, would hide a gradient off by a constant factor (a loss scaled by ``dp_size`` twice, say).
    """
    import time

    import torch

    started = time.monotonic()

    from tests.actor_harness import ActorHarness
    from verl_offpolicy.configs import preset_selector
    from verl_offpolicy.demo.tiny import build_tiny

    workdir = Path(workdir)
    out = workdir / f"w{world_size}"
    out.mkdir(parents=True, exist_ok=True)
    # every process its own copy (no race); build_tiny is deterministic and the test checks the start weights agree
    paths = build_tiny(workdir / f"tiny-w{world_size}r{rank}")
    masks: list = []
    _spy_m2po_masks(masks)
    per_rank = len(RESPONSES) // world_size
    rows = slice(rank * per_rank, (rank + 1) * per_rank)
    report: dict[str, Any] = {"imported_s": time.monotonic() - started}
    for family in families:
        preset, loss_mode = FAMILIES[family]
        harness = ActorHarness.create(
            workdir / f"w{world_size}r{rank}-{family}",
            loss_mode=loss_mode,
            lr=lr,
            overrides=[
                preset_selector(preset, "ppo_trainer"),
                "actor_rollout_ref.actor.optim.optimizer=SGD",
                *FAMILY_OVERRIDES.get(family, []),
            ],
            **paths,
        )
        harness.record_grads()
        tok = harness.tokenizer
        prompt = tok.convert_tokens_to_ids(PROMPT)
        responses = [tok.convert_tokens_to_ids(r) for r in RESPONSES[rows]]
        batch = harness.make_batch([prompt] * per_rank, responses, ADVANTAGES[rows])
        shifts = torch.zeros(batch["response_mask"].shape)
        for i, row in enumerate(SHIFTS[rows]):
            shifts[i, : len(row)] = torch.tensor(row)
        batch["old_log_probs"] = (harness.log_probs(batch) - shifts) * batch["response_mask"]
        before = harness.state_dict()
        masks.clear()
        metrics = harness.update(batch, mini_batch_size=len(RESPONSES))
        grads, after = harness.grads(), harness.state_dict()
        if rank == 0:
            torch.save({"before": before, "grads": grads, "after": after}, out / f"{family}.pt")
        report[family] = {
            "metrics": {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)},
            "m2po_keep": [row for call in masks for row in call],
            "seconds": time.monotonic() - started,
        }
        del harness
    return report
