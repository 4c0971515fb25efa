"""The conformance suite: every registered estimator and loss, driven by its family's examples.

Each family's ``FAMILY`` (glue/algorithms/<family>.py) gives one or more valid settings of every name it
registers with verl; a name added to a family is tested here the moment it has an example (and
:func:`test_every_registered_name_has_an_example` fails until it does). What every loss must do: equal verl's
``ppo_loss`` on the engine's nested batch, add up over micro-batches, scale with verl's IS weights, ignore
whatever sits under the mask (all-zero rows, gaps inside a response, non-finite padding), keep its metrics finite
on an empty batch and refuse float16. What every estimator must do: the singleton and equal-group advantages its
family derives by hand, exact zeros for a response without tokens, and an error naming the sample for a non-finite
reward. In the slow tier, one real FSDP2 update per loss example moves the actor the way the advantages point. A
family's own test file keeps the values derived by hand for that family.
"""

from __future__ import annotations

import copy
import functools
import math

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the verl.plugins entry point: registers our names)
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import (
    ADV_ESTIMATOR_REGISTRY,
    POLICY_LOSS_REGISTRY,
    get_adv_estimator_fn,
    get_policy_loss_fn,
)
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.utils.losses import ppo_loss

from tests.cpu_harness import isolated
from tests.loss_helpers import LOSS, PROMPT_LENS, call, compose_actor, engine_batch
from verl_offpolicy.core.losses import m2po_mask, token_log_ratio
from verl_offpolicy.glue import algorithms
from verl_offpolicy.glue.algorithms.m2po import mini_batch_scope
from verl_offpolicy.glue.compose import compose_main_ppo
from verl_offpolicy.glue.config import OffPolicyLossConfig
from verl_offpolicy.glue.registration import is_ours

F64 = torch.float64
ACTOR = "actor_rollout_ref.actor"
FAMILIES = algorithms.families()
LOSSES = {
    f"{name}-{example.label}" if example.label else name: (name, example)
    for family in FAMILIES
    for name, examples in family.losses.items()
    for example in examples
}
ESTIMATORS = {
    f"{name}-{i}" if i else name: (name, example)
    for family in FAMILIES
    for name, examples in family.estimators.items()
    for i, example in enumerate(examples)
}


def test_every_registered_name_has_an_example():
    """The names verl's registries hold (read from the decorators before any family imports) are exactly the
    families' names, each with at least one example."""
    losses = [name for family in FAMILIES for name in family.losses]
    estimators = [name for family in FAMILIES for name in family.estimators]
    assert sorted(losses) == sorted(algorithms.declared_names(algorithms.LOSS_DECORATOR)) and len(set(losses)) == len(
        losses
    )
    assert sorted(estimators) == sorted(algorithms.declared_names(algorithms.ESTIMATOR_DECORATOR))
    assert all(examples for family in FAMILIES for examples in (*family.losses.values(), *family.estimators.values()))
    assert all(is_ours(POLICY_LOSS_REGISTRY[name]) for name in losses)
    assert all(is_ours(ADV_ESTIMATOR_REGISTRY[name]) for name in estimators)
    assert len(LOSSES) >= 11 and len(ESTIMATORS) >= 9  # the scan sees every family


# ------------------------------------------------------------------------------------------------ losses


def _actor(case: str):
    """The example's ActorConfig, composed by Hydra from verl's stock ``ppo_trainer`` as a user's line would (a copy
    of the one composed for ``case`` first: a test may change its copy)."""
    config, agg = _composed_actor(case)
    return copy.deepcopy(config), agg


@functools.cache
def _composed_actor(case: str):
    name, example = LOSSES[case]
    agg = example.actor.get("loss_agg_mode", "token-mean")
    extra = [f"++{LOSS}.{k}={v}" for k, v in example.policy_loss.items()]
    extra += [f"{ACTOR}.{k}={v}" for k, v in example.actor.items() if k != "loss_agg_mode"]
    config = compose_actor(name, agg, extra)
    assert isinstance(config.policy_loss, OffPolicyLossConfig) and config.policy_loss.loss_mode == name
    return config, agg


def _batch(seed=0, b=5, t=4):
    """Log-probs near their old values (ρ within e^±1), one all-zero mask row (row 2), ragged lengths."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g, dtype=F64) * 2
    log_prob = old + 0.4 * torch.randn(b, t, generator=g, dtype=F64)
    mask = torch.arange(t) < torch.tensor([4, 2, 0, 3, 1]).unsqueeze(-1)
    adv = torch.randn(b, 1, generator=g, dtype=F64) * mask
    return old, log_prob, adv, mask


def _micro_masks(config, old, log_prob, adv, mask, parts):
    """m2po's whole-mini-batch masks split by micro-batch (what the engine's pre-pass hands each call); [] else."""
    if config.policy_loss.loss_mode != "m2po":
        return None
    keep = m2po_mask(
        token_log_ratio(log_prob, old, mask),
        adv,
        mask,
        config.policy_loss.m2po_threshold,
        config.policy_loss.m2po_token_pool,
    )
    return [keep[s] for s in parts]


@pytest.mark.parametrize("case", list(LOSSES))
def test_loss_through_verls_ppo_loss_equals_the_registered_function(case):
    """verl's ``ppo_loss`` on the engine's nested (jagged) batch, with a fully masked response and a masked token
    inside one (loss_helpers.engine_batch), equals the registered function on padded tensors; the gradient reaches
    the model output at the response tokens under the mask only; our metrics reach verl's Metric objects."""
    config, agg = _actor(case)
    model_output, data, values, padded = engine_batch(seed=len(case))
    loss, metrics = ppo_loss(config, model_output, data)
    (grad,) = torch.autograd.grad(loss, values)

    direct_values = values.detach().clone().requires_grad_(True)
    width = padded["old"].shape[1]
    log_prob = torch.stack(
        [torch.nn.functional.pad(direct_values[pos], (0, width - pos.numel())) for pos in padded["positions"]]
    )
    config.global_batch_info.clear()
    config.global_batch_info.update(
        dp_size=1, batch_num_tokens=padded["num_tokens"], global_batch_size=len(PROMPT_LENS), loss_scale_factor=None
    )
    direct, direct_metrics = get_policy_loss_fn(config.policy_loss.loss_mode)(
        padded["old"], log_prob, padded["adv"], padded["mask"], agg, config
    )
    (direct_grad,) = torch.autograd.grad(direct, direct_values)

    torch.testing.assert_close(loss, direct)
    torch.testing.assert_close(grad, direct_grad)
    assert grad.abs().sum() > 0
    response_token = torch.zeros_like(values, dtype=torch.bool)
    for pos, m in zip(padded["positions"], padded["mask"], strict=True):
        response_token[pos] = m[: pos.numel()]
    assert torch.all(grad[~response_token] == 0)
    for name, value in direct_metrics.items():
        assert metrics[name].values == [pytest.approx(value)]
    assert metrics["actor/pg_loss"].values == [pytest.approx(direct.item())]


def test_verls_own_policy_loss_config_with_our_loss_says_what_to_set():
    """Our loss_mode but verl's own PolicyLossConfig: the first step says what to set."""
    cfg = compose_main_ppo("ppo_trainer", [f"{LOSS}.loss_mode=rec", f"{ACTOR}.ppo_micro_batch_size_per_gpu=2"])
    config = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    model_output, data, _, _ = engine_batch(seed=0)
    with pytest.raises(TypeError, match=r"_target_=verl_offpolicy.glue.config.OffPolicyLossConfig.*\+algorithm=<name>"):
        ppo_loss(config, model_output, data)


@pytest.mark.parametrize("case", list(LOSSES))
def test_micro_batches_sum_to_the_global_loss(case):
    """With verl's global_batch_info, the micro-batches' losses and gradients add up to the whole batch's."""
    config, agg = _actor(case)
    old, log_prob, adv, mask = _batch(seed=4)
    whole, whole_grad, _ = call(config, old, log_prob, adv, mask, agg)
    parts = (slice(0, 2), slice(2, 5))
    masks = _micro_masks(config, old, log_prob, adv, mask, parts)
    num_sequences = int((mask.sum(-1) > 0).sum())
    config.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=num_sequences)
    try:
        if masks is None:
            results = [call(config, old[s], log_prob[s], adv[s], mask[s], agg) for s in parts]
        else:
            with mini_batch_scope(config, masks):
                results = [call(config, old[s], log_prob[s], adv[s], mask[s], agg) for s in parts]
    finally:
        config.global_batch_info.clear()
    torch.testing.assert_close(results[0][0] + results[1][0], whole)
    torch.testing.assert_close(torch.cat([results[0][1], results[1][1]]), whole_grad)


@pytest.mark.parametrize("case", list(LOSSES))
def test_is_weights_scale_the_loss(case):
    """verl's rollout IS weights multiply the per-token loss: weights of 1 change nothing, weights of c scale the
    loss and its gradient by c (every aggregation is linear in the per-token loss)."""
    config, agg = _actor(case)
    old, log_prob, adv, mask = _batch(seed=5)
    plain, plain_grad, _ = call(config, old, log_prob, adv, mask, agg)
    ones, ones_grad, _ = call(config, old, log_prob, adv, mask, agg, weights=torch.ones_like(old))
    torch.testing.assert_close((ones, ones_grad), (plain, plain_grad))
    scaled, scaled_grad, _ = call(config, old, log_prob, adv, mask, agg, weights=torch.full_like(old, 2.5))
    torch.testing.assert_close((scaled, scaled_grad), (2.5 * plain, 2.5 * plain_grad))
    assert plain_grad.abs().sum() > 0


@pytest.mark.parametrize("case", list(LOSSES))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_an_all_zero_mask_response_contributes_nothing(case, agg):
    config, _ = _actor(case)
    old, log_prob, adv, mask = _batch(seed=3)
    log_prob[2] = 50.0  # garbage on the fully padded response (ratio e^50 would overflow a weight)
    loss, grad, metrics = call(config, old, log_prob, adv, mask, agg)
    assert torch.isfinite(loss) and torch.isfinite(grad).all() and all(math.isfinite(v) for v in metrics.values())
    assert torch.all(grad[2] == 0)
    keep = torch.tensor([0, 1, 3, 4])
    loss_without, grad_without, _ = call(config, old[keep], log_prob[keep], adv[keep], mask[keep], agg)
    torch.testing.assert_close(loss, loss_without)
    torch.testing.assert_close(grad[keep], grad_without)


@pytest.mark.parametrize("case", list(LOSSES))
def test_a_gap_inside_a_response_is_ignored_whatever_it_holds(case):
    """A masked token inside a response (a tool output): any value there, NaN and ±inf included, gives the same
    loss and gradient, and that token gets no gradient."""
    config, agg = _actor(case)
    old, log_prob, adv, mask = _batch(seed=6)
    mask[0, 1] = mask[3, 1] = False  # rows 0 (4 tokens) and 3 (3 tokens): a gap in the middle
    adv = adv * mask
    expected, expected_grad, _ = call(config, old, log_prob, adv, mask, agg)
    for value in (50.0, -1e4, math.nan, math.inf, -math.inf):
        gapped_old, gapped = old.clone(), log_prob.clone()
        gapped_old[~mask] = value
        gapped[~mask] = -value if math.isfinite(value) else value
        loss, grad, metrics = call(config, gapped_old, gapped, adv, mask, agg)
        torch.testing.assert_close((loss, grad), (expected, expected_grad), msg=f"masked value {value}")
        assert torch.all(grad[~mask] == 0) and all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("case", list(LOSSES))
def test_an_empty_batch_keeps_its_metrics_finite(case):
    config, _ = _actor(case)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    _, grad, metrics = call(config, torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), mask, "token-mean")
    assert all(math.isfinite(v) for v in metrics.values()) and torch.all(grad == 0)


@pytest.mark.parametrize("case", list(LOSSES))
def test_float16_log_probs_are_refused_naming_the_loss(case):
    config, agg = _actor(case)
    one = torch.full((1, 1), -1.0, dtype=torch.float16)
    with pytest.raises(TypeError, match=rf"loss_mode={config.policy_loss.loss_mode}: log_prob is float16.*float32"):
        call(config, one, one.clone(), torch.ones(1, 1, dtype=torch.float16), torch.ones(1, 1, dtype=torch.bool), agg)


# -------------------------------------------------------------------------------------------- estimators


def _estimate(case: str, rewards, uids, dtype=F64, mask=None):
    """The registered estimator on responses of one token each (or ``mask``'s), with the example's knobs."""
    name, example = ESTIMATORS[case]
    token_rewards = torch.as_tensor(rewards, dtype=dtype)
    token_rewards = token_rewards.unsqueeze(-1) if token_rewards.dim() == 1 else token_rewards
    mask = torch.ones_like(token_rewards) if mask is None else mask
    config = OmegaConf.create({"adv_estimator": name, "offpolicy": dict(example.offpolicy)})
    advantages, returns = get_adv_estimator_fn(name)(
        token_level_rewards=token_rewards, response_mask=mask, index=np.array(uids, dtype=object), config=config
    )
    assert advantages.shape == token_rewards.shape and torch.equal(advantages, returns)
    return advantages


@pytest.mark.parametrize("case", list(ESTIMATORS))
def test_a_singleton_gets_what_its_family_derives(case):
    rewards = [0.7, -2.0, 5.0]
    a = _estimate(case, rewards, ["a", "b", "c"])[:, 0]
    singleton = ESTIMATORS[case][1].singleton
    assert singleton in ("reward", "zero")
    expected = torch.tensor(rewards, dtype=F64) if singleton == "reward" else torch.zeros(3, dtype=F64)
    torch.testing.assert_close(a, expected)


@pytest.mark.parametrize("case", list(ESTIMATORS))
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_an_equal_group_gets_exactly_what_its_family_derives(case, dtype):
    """0.1·3/3 ≠ 0.1 in floating point and 1e4 beside it: the values must still be exact."""
    rewards = torch.tensor([0.1, 0.1, 0.1, 1e4, 1e4], dtype=dtype)
    a = _estimate(case, rewards, ["a", "a", "a", "b", "b"], dtype=dtype)[:, 0]
    equal = ESTIMATORS[case][1].equal_group
    expected = rewards if equal == "reward" else torch.full_like(a, equal)
    assert torch.equal(a, expected), a


@pytest.mark.parametrize("case", list(ESTIMATORS))
def test_a_response_without_tokens_gets_exactly_zero(case):
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]], dtype=F64)
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]], dtype=F64)
    a = _estimate(case, rewards, ["g", "g", "g"], mask=mask)
    assert torch.isfinite(a).all() and torch.all(a[1] == 0) and torch.all(a[:, 1][[2]] == 0)


@pytest.mark.parametrize("case", list(ESTIMATORS))
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_reward_names_the_sample(case, bad):
    with pytest.raises(ValueError, match=r"batch position 2 \(uid 'prompt-b'\)"):
        _estimate(case, [0.0, 1.0, bad, 1.0], ["prompt-a", "prompt-a", "prompt-b", "prompt-b"])


# ---------------------------------------------------------------------------- a real FSDP2 update (slow)


def _worker_case(case: str) -> dict:
    name, example = LOSSES[case]
    overrides = [f"++{LOSS}.{k}={v}" for k, v in example.policy_loss.items()]
    overrides += [f"{ACTOR}.{k}={v}" for k, v in example.actor.items()]
    return {"name": case, "loss_mode": name, "overrides": overrides}


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_each_loss_moves_a_real_fsdp2_actor_the_way_the_advantages_point(tmp_path):
    """On-policy (ρ = 1): a +1-advantage response becomes more likely, a −1 one less likely, nothing is clipped."""
    cases = [_worker_case(case) for case in LOSSES]
    report = isolated("tests.scenario_losses:offpolicy_loss_updates", timeout=1700, workdir=str(tmp_path), cases=cases)
    for case in LOSSES:
        r = report[case]
        assert r["max_abs_change"] > 0, case
        assert r["good_after"] > r["good_before"], (case, r)
        assert r["bad_after"] < r["bad_before"], (case, r)
        assert r["metrics"]["actor/pg_clipfrac"] == 0.0, (case, r)
