"""RED (``adv_estimator=red_weight`` / ``red_drop``, docs/algo/red.md): the estimator adapters (its knobs; no
rule beyond their checks)."""

from __future__ import annotations

import zlib

import numpy as np
import torch
from torch import Tensor
from verl.trainer.ppo.core_algos import register_adv_est

from verl_offpolicy.core import advantages as core
from verl_offpolicy.glue.algorithms.adapters import broadcast, prepare
from verl_offpolicy.glue.family import EstimatorExample, Family
from verl_offpolicy.glue.knobs import Knob, integer, positive

OFFPOLICY_KNOBS = (
    Knob("seed", 0, "red_drop: the negatives dropped are reproducible from (seed, uid).", check=integer),
    Knob("temperature", 1.0, "red_weight: A = (r − r̄)·exp((r − r̄)/temperature).", check=positive),
)


@register_adv_est("red_weight")
@torch.no_grad()
def compute_red_weight_advantage(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    """A_i = (r_i − r̄)·exp(min((r_i − r̄)/T, 20)), T = ``algorithm.offpolicy.temperature``."""
    section, scores, group_ids = prepare("red_weight", token_level_rewards, index, config, OFFPOLICY_KNOBS)
    advantage = core.red_weight_advantage(scores, group_ids, section.temperature)
    return broadcast("red_weight", advantage, response_mask, token_level_rewards, index)


def _layout(seed: int, index: np.ndarray, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """(group seeds [G], occurrence of each sample in its group [B]) for ``red_drop``.

    A group's seed is the CRC-32 of (seed, uid), stable across processes and runs. The stable sort
    by group id is numpy's (a radix sort for < 2¹⁶ groups).
    """
    ids = group_ids.cpu().numpy()
    counts = np.bincount(ids)
    order = np.argsort(ids.astype(np.uint16 if counts.size <= 2**16 else np.int64), kind="stable")
    first = order[(np.cumsum(counts) - counts)[counts > 0]]
    prefix = zlib.crc32(f"{seed}\x00".encode())
    seeds = np.zeros(counts.size, dtype=np.int64)
    seeds[counts > 0] = [zlib.crc32(uid.encode(), prefix) for uid in map(str, index[first])]
    device = group_ids.device
    occurrence = core.occurrence_in_group(group_ids, torch.from_numpy(order).to(device))
    return torch.from_numpy(seeds).to(device), occurrence


@register_adv_est("red_drop")
@torch.no_grad()
def compute_red_drop_advantage(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    """RED-Drop: surplus negatives dropped (A = 0) reproducibly from (``algorithm.offpolicy.seed``, uid)."""
    section, scores, group_ids = prepare("red_drop", token_level_rewards, index, config, OFFPOLICY_KNOBS)
    seeds, occurrence = _layout(section.seed, np.asarray(index), group_ids)
    advantage = core.red_drop_advantage(scores, group_ids, seeds, occurrence)
    return broadcast("red_drop", advantage, response_mask, token_level_rewards, index)


FAMILY = Family(
    "red",
    offpolicy_knobs=OFFPOLICY_KNOBS,
    # red_weight: A = d·exp(d/T), d = r − r̄ = 0 for equal rewards; red_drop drops negatives only (d < 0), so equal
    # rewards keep A = d = 0; a singleton has no group: A = r in both
    estimators={
        "red_weight": (EstimatorExample({"temperature": 1.0}, singleton="reward", equal_group=0.0),),
        "red_drop": (EstimatorExample({"seed": 0}, singleton="reward", equal_group=0.0),),
    },
)
