"""Each loss through verl's real ``ppo_loss`` with an ``ActorConfig`` composed by Hydra from verl's
stock ``ppo_trainer`` config (our loss selected by overriding ``policy_loss._target_``).

``ppo_loss`` receives what the engine hands it: nested (jagged) model log-probs over prompt+response
tokens, nested prompts/responses/masks/old log-probs/advantages, and the global batch info as
non-tensor data. Its loss must equal the registered function called directly on padded tensors,
and the gradient must reach the model output.
"""

from __future__ import annotations

import pytest
import torch

import verl  # noqa: F401  (loads the verl.plugins entry point: registers our names)
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.utils.losses import ppo_loss
from verl_offpolicy.glue.compose import compose_main_ppo
from verl_offpolicy.glue.config import OffPolicyLossConfig

from tests.loss_helpers import LOSS, PROMPT_LENS, compose_actor, engine_batch

CASES = {
    "opmd": ("opmd", "token-mean", [f"+{LOSS}.tau=0.5"]),
    "pmd": ("pmd", "seq-mean-token-mean", [f"+{LOSS}.tau=0.01"]),
    "rec-one-side-is-k2": (
        "rec",
        "token-mean",
        [f"+{LOSS}.clip_mode=one-side", f"+{LOSS}.weight=importance_sampling", f"+{LOSS}.regularizer=k2",
         f"+{LOSS}.regularizer_coef=0.1"],
    ),
    "rec-two-side": ("rec", "token-mean", [f"+{LOSS}.clip_mode=two-side"]),
    "rec-ring-forward-kl": (
        "rec",
        "token-mean",
        [f"+{LOSS}.clip_mode=ring", f"+{LOSS}.ring_clip_ratio_low=0.5", f"+{LOSS}.ring_clip_ratio_high=1.5",
         f"+{LOSS}.regularizer=forward-kl", f"+{LOSS}.regularizer_coef=0.05"],
    ),
    "rec-gspo-is": (
        "rec",
        "seq-mean-token-mean",
        [f"+{LOSS}.clip_mode=gspo-one-side", f"+{LOSS}.weight=gspo_importance_sampling",
         "actor_rollout_ref.actor.clip_ratio_low=0.05", "actor_rollout_ref.actor.clip_ratio_high=0.05"],
    ),
    "rec-none-seq-sum": ("rec", "seq-mean-token-sum", []),
}


@pytest.mark.parametrize("case", list(CASES))
def test_loss_through_verl_ppo_loss(case):
    loss_mode, agg, extra = CASES[case]
    config = compose_actor(loss_mode, agg, extra)
    assert isinstance(config.policy_loss, OffPolicyLossConfig) and config.policy_loss.loss_mode == loss_mode

    model_output, data, values, padded = engine_batch(seed=len(case))
    loss, metrics = ppo_loss(config, model_output, data)
    (grad,) = torch.autograd.grad(loss, values)

    # the registered function on padded tensors with the same global batch info
    direct_values = values.detach().clone().requires_grad_(True)
    width = padded["old"].shape[1]
    log_prob = torch.stack(
        [torch.nn.functional.pad(direct_values[pos], (0, width - pos.numel())) for pos in padded["positions"]]
    )
    config.global_batch_info.clear()
    config.global_batch_info.update(
        dp_size=1, batch_num_tokens=padded["num_tokens"], global_batch_size=len(PROMPT_LENS), loss_scale_factor=None
    )
    direct, direct_metrics = get_policy_loss_fn(loss_mode)(
        padded["old"], log_prob, padded["adv"], padded["mask"], agg, config
    )
    (direct_grad,) = torch.autograd.grad(direct, direct_values)

    torch.testing.assert_close(loss, direct)
    torch.testing.assert_close(grad, direct_grad)
    assert grad.abs().sum() > 0  # the gradient reaches the model output
    # only response tokens with mask 1 receive gradient
    response_token = torch.zeros_like(values, dtype=torch.bool)
    for pos, m in zip(padded["positions"], padded["mask"], strict=True):
        response_token[pos] = m[: pos.numel()]
    assert torch.all(grad[~response_token] == 0)
    for name, value in direct_metrics.items():  # our metrics reach verl's Metric objects unchanged
        assert metrics[name].values == [pytest.approx(value)]
    assert metrics["actor/pg_loss"].values == [pytest.approx(direct.item())]


def test_plain_policy_loss_target_fails_with_instructions():
    # our loss_mode but verl's own PolicyLossConfig: the first step must say what to set
    cfg = compose_main_ppo("ppo_trainer", [f"{LOSS}.loss_mode=rec", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"])
    config = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    model_output, data, _, _ = engine_batch(seed=0)
    with pytest.raises(TypeError, match=r"_target_=verl_offpolicy.glue.config.OffPolicyLossConfig.*\+algorithm=<name>"):
        ppo_loss(config, model_output, data)
