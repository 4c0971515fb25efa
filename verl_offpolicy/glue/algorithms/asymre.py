"""AsymRE (``adv_estimator=asymre``, docs/algo/asymre.md): its estimator adapter (its knob; no rule beyond its
check)."""

from __future__ import annotations

import torch
from verl.trainer.ppo.core_algos import register_adv_est

from verl_offpolicy.core import advantages as core
from verl_offpolicy.glue.algorithms.adapters import broadcast, prepare
from verl_offpolicy.glue.family import EstimatorExample, Family
from verl_offpolicy.glue.knobs import Knob, finite

OFFPOLICY_KNOBS = (Knob("shift", -0.1, "asymre: A = r − (r̄ + shift).", check=finite),)


@register_adv_est("asymre")
@torch.no_grad()
def compute_asymre_advantage(token_level_rewards, response_mask, index=None, config=None, **kwargs):
    """A_i = r_i − (r̄ + shift), shift = ``algorithm.offpolicy.shift``."""
    section, scores, group_ids = prepare("asymre", token_level_rewards, index, config, OFFPOLICY_KNOBS)
    advantage = core.asymre_advantage(scores, group_ids, section.shift)
    return broadcast("asymre", advantage, response_mask, token_level_rewards, index)


FAMILY = Family(
    "asymre",
    offpolicy_knobs=OFFPOLICY_KNOBS,
    # A = r − (r̄ + shift): equal rewards give −shift = 0.1; a singleton has baseline 0 (A = r)
    estimators={"asymre": (EstimatorExample({"shift": -0.1}, singleton="reward", equal_group=0.1),)},
)
