"""Calling our registered losses as verl does, shared by the loss tests: directly on padded tensors
(:func:`call`) and through verl's ``ppo_loss`` with the engine's nested batch (:func:`engine_batch`)."""

from __future__ import annotations

import torch
import verl  # noqa: F401  (loads the verl.plugins entry point: registers our names)
from tensordict import TensorDict
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass

from verl_offpolicy.glue.compose import compose_main_ppo

LOSS = "actor_rollout_ref.actor.policy_loss"
PROMPT_LENS = [3, 1, 2, 4, 2]
RESPONSE_LENS = [5, 2, 4, 3, 3]


def compose_actor(loss_mode, agg, extra=()):
    overrides = [
        f"{LOSS}._target_=verl_offpolicy.glue.config.OffPolicyLossConfig",
        f"{LOSS}.loss_mode={loss_mode}",
        f"actor_rollout_ref.actor.loss_agg_mode={agg}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.n=2",
        *extra,
    ]
    cfg = compose_main_ppo("ppo_trainer", overrides)
    return omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


METRICS = {
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_upper",
    "actor/pg_clipfrac_lower",
    "actor/ratio_mean",
    "actor/ratio_max",
    "actor/ppo_kl",
}
# each loss's fraction of tokens clipped, masked or truncated (docs/algorithms.md), written out
FRACTIONS = {
    "rec": "actor/offpolicy/rec/clipped_frac",
    "m2po": "actor/offpolicy/m2po/masked_frac",
    "topr": "actor/offpolicy/topr/truncated_frac",
}


def call(config, old, log_prob, adv, mask, agg="token-sum", *, weights=None):
    """Registered loss and its gradient w.r.t. log_prob."""
    log_prob = log_prob.clone().requires_grad_(True)
    loss, metrics = get_policy_loss_fn(config.policy_loss.loss_mode)(
        old_log_prob=old,
        log_prob=log_prob,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode=agg,
        config=config,
        rollout_is_weights=weights,
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    expected = METRICS | (
        {FRACTIONS[config.policy_loss.loss_mode]} if config.policy_loss.loss_mode in FRACTIONS else set()
    )
    assert set(metrics) == expected and all(type(v) is float for v in metrics.values())
    return loss.detach(), grad, metrics


def nested(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def engine_batch(seed):
    """(model_output, data, padded inputs of the loss) as the engine builds them for ppo_loss."""
    g = torch.Generator().manual_seed(seed)
    batch = len(PROMPT_LENS)
    prompts = [torch.randint(0, 100, (n,), generator=g) for n in PROMPT_LENS]
    responses = [torch.randint(0, 100, (n,), generator=g) for n in RESPONSE_LENS]
    masks = [torch.ones(n, dtype=torch.long) for n in RESPONSE_LENS]
    masks[1] = torch.zeros(2, dtype=torch.long)  # a response whose mask is all zero
    masks[3][1] = 0  # a masked (e.g. tool) token inside a response
    old = [-torch.rand(n, generator=g) * 2 for n in RESPONSE_LENS]
    adv = [torch.randn((), generator=g).expand(n) * m for n, m in zip(RESPONSE_LENS, masks, strict=True)]

    # model log-probs over prompt+response; the response token k is predicted at position p − 1 + k
    full = [-torch.rand(p + n, generator=g) * 2 for p, n in zip(PROMPT_LENS, RESPONSE_LENS, strict=True)]
    for p, n, row, o in zip(PROMPT_LENS, RESPONSE_LENS, full, old, strict=True):
        row[p - 1 : p - 1 + n] = o + 0.3 * torch.randn(n, generator=g)
    values = torch.cat(full).requires_grad_(True)
    offsets = torch.tensor([0] + PROMPT_LENS).cumsum(0) + torch.tensor([0] + RESPONSE_LENS).cumsum(0)
    model_output = {"log_probs": torch.nested.nested_tensor_from_jagged(values, offsets=offsets)}

    data = TensorDict(
        {
            "prompts": nested(prompts),
            "responses": nested(responses),
            "response_mask": nested(masks),
            "old_log_probs": nested(old),
            "advantages": nested(adv),
        },
        batch_size=[batch],
    )
    num_tokens = int(sum(m.sum() for m in masks))
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=num_tokens, global_batch_size=batch)
    tu.assign_non_tensor(data, max_response_len=max(RESPONSE_LENS))

    width = max(RESPONSE_LENS)

    def pad(rows):
        return torch.stack([torch.nn.functional.pad(r, (0, width - r.numel())) for r in rows])

    response_positions = [
        sum(PROMPT_LENS[:i]) + sum(RESPONSE_LENS[:i]) + PROMPT_LENS[i] - 1 + torch.arange(n)
        for i, n in enumerate(RESPONSE_LENS)
    ]
    padded = {
        "old": pad(old),
        "adv": pad(adv),
        "mask": pad(masks).bool(),
        "positions": response_positions,
        "num_tokens": num_tokens,
    }
    return model_output, data, values, padded
