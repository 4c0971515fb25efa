"""Integer and bool rewards give floating-point advantages, for every registered estimator (values by hand)."""

from __future__ import annotations

import math

import pytest
import torch
import verl  # noqa: F401  (loads the verl.plugins entry point: registers our names)

from verl_offpolicy.core import advantages as core_adv
from verl_offpolicy.glue.registration import ADV_ESTIMATORS

F64 = torch.float64


# ---------------------------------------------------------------- integer rewards


def _expected_integer_advantages():
    """A for r = [3, 0, 0, 0] in one group, per estimator, derived by hand (r̄ = 0.75, d = r − r̄)."""
    e3 = math.exp(3.0)
    d = [2.25, -0.75, -0.75, -0.75]
    # logavgexp, τ = 1: b = ln((e³ + 3)/4), A = r − b
    b = math.log((e3 + 3) / 4)
    return {
        # opmd, mean baseline: A = d
        ("opmd", "mean"): d,
        ("opmd", "logavgexp"): [3 - b, -b, -b, -b],
        # pmd_partition, τ = 1: A_0 = 3 − ln((1+1+1)/3) = 3; A_i = 0 − ln((e³ + 1 + 1)/3) for the others
        ("pmd_partition",): [3.0] + [-math.log((e3 + 2) / 3)] * 3,
        # asymre, shift 0.1: A = d − 0.1
        ("asymre",): [2.15, -0.85, -0.85, -0.85],
        # red_weight, T = 1: A = d·e^d
        ("red_weight",): [x * math.exp(x) for x in d],
        # agro off-policy: D_i = r_i − mean of the others: 3 − 0 = 3, 0 − 1 = −1
        ("agro", "off"): [3.0, -1.0, -1.0, -1.0],
        # agro on-policy, β = 1: A = D − (D² − c)/2, c_i = K/(K−1)·s²_{−i}: i = 0: others 0,0,0 → c = 0,
        # A = 3 − 9/2 = −1.5; i ≥ 1: others 3,0,0, mean 1, s² = (4+1+1)/2 = 3, c = 4/3·3 = 4 → A = −1 − (1−4)/2 = 0.5
        ("agro", "on"): [-1.5, 0.5, 0.5, 0.5],
        # pairwise_opmd, τ = 1: A = 2·K·τ·d/(1+τ)² = 2·4·d/4 = 2d
        ("pairwise_opmd",): [4.5, -1.5, -1.5, -1.5],
        # topr, raw reward, c = 0: A = r (no group statistic; 'signed' takes 0/1 rewards only)
        ("topr",): [3.0, 0.0, 0.0, 0.0],
        # oapl, β1 = 1: V̂* = ln((e³ + 3)/4) = b (the logavgexp baseline, the sample itself included), A = r − b
        ("oapl",): [3 - b, -b, -b, -b],
    }


def _core_call(key, scores, ids):
    name = key[0]
    if name == "opmd":
        return core_adv.opmd_advantage(scores, ids, baseline=key[1], tau=1.0)
    if name == "pmd_partition":
        return core_adv.pmd_partition_advantage(scores, ids, tau=1.0)
    if name == "asymre":
        return core_adv.asymre_advantage(scores, ids, shift=0.1)
    if name == "red_weight":
        return core_adv.red_weight_advantage(scores, ids, temperature=1.0)
    if name == "agro":
        return core_adv.agro_advantage(scores, ids, beta=1.0, on_policy=key[1] == "on")
    if name == "pairwise_opmd":
        return core_adv.pairwise_opmd_advantage(scores, ids, tau=1.0)
    if name == "topr":
        return core_adv.topr_advantage(scores, 0.0, "raw")
    if name == "oapl":
        return core_adv.oapl_advantage(scores, ids, beta1=1.0)
    raise AssertionError(name)


def test_every_registered_estimator_is_covered():
    covered = {key[0] for key in _expected_integer_advantages()} | {"red_drop"}
    assert covered == set(ADV_ESTIMATORS)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
@pytest.mark.parametrize("key", list(_expected_integer_advantages()), ids=lambda key: "-".join(key))
def test_integer_rewards_give_float_advantages(key, dtype):
    # before: the integer dtype (segment_max's −inf fill cannot be an integer) or a truncated [2, 0, 0, 0]
    scores = torch.tensor([3, 0, 0, 0], dtype=dtype)
    got = _core_call(key, scores, torch.zeros(4, dtype=torch.long))
    assert got.is_floating_point()
    torch.testing.assert_close(got, torch.tensor(_expected_integer_advantages()[key], dtype=got.dtype))


def test_bool_rewards_give_float_advantages():
    # r = [1, 0, 0, 0] (correct / wrong), opmd mean: r̄ = 0.25, A = [0.75, −0.25, −0.25, −0.25]
    got = core_adv.opmd_advantage(torch.tensor([True, False, False, False]), torch.zeros(4, dtype=torch.long))
    torch.testing.assert_close(got, torch.tensor([0.75, -0.25, -0.25, -0.25], dtype=F64))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool], ids=str)
def test_red_drop_integer_rewards(dtype):
    # r = [1, 0, 0, 0]: r̄ = 0.25, one positive, three negatives, so two negatives are dropped (A = 0) and one
    # is kept; mean of the kept rewards (1 + 0)/2 = 0.5 → A = 0.5 for the positive, −0.5 for the kept negative
    scores = torch.tensor([1, 0, 0, 0]).to(dtype)
    got = core_adv.red_drop_advantage(scores, torch.zeros(4, dtype=torch.long), torch.tensor([12345]))
    assert got.is_floating_point()
    assert got[0].item() == 0.5
    assert sorted(got[1:].tolist()) == [-0.5, 0.0, 0.0]


def test_integer_rewards_through_verls_registry():
    # opmd, mean baseline, r = [3, 0, 0, 0] in one group as int64 token rewards: A = [2.25, −0.75, −0.75, −0.75]
    import numpy as np
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    token_rewards = torch.tensor([[3], [0], [0], [0]])
    advantages, _ = get_adv_estimator_fn("opmd")(
        token_level_rewards=token_rewards,
        response_mask=torch.ones_like(token_rewards),
        index=np.array(["u"] * 4, dtype=object),
        config=OmegaConf.create({"adv_estimator": "opmd", "offpolicy": {}}),
    )
    assert advantages[:, 0].tolist() == [2.25, -0.75, -0.75, -0.75]
