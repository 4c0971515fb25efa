"""The PMD presets against OpenKimi: the partition floor of ``ploo`` and several updates per batch.

OpenKimi's ``ploo`` (openkimi/pmd/core_algos.py, ``compute_partition_loo_outcome_advantage``) is
restated below as a per-sample loop (:func:`_openkimi_ploo`) for comparison; its runs use
train_batch_size 512 and ppo_mini_batch_size 32 (16 optimizer updates per batch).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the verl.plugins entry point: registers our names)
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import omega_conf_to_dataclass, validate_config

from tests.hydra_utils import VALID_SIZES
from verl_offpolicy.glue.compose import compose_main_ppo
from verl_offpolicy.glue.validation import validate_offpolicy_config

F64 = torch.float64
TAU = 0.01


def run(rewards, uids, **offpolicy):
    """The registered ``pmd_partition`` estimator on one-token responses; per-sequence A [B]."""
    token_rewards = torch.as_tensor(rewards, dtype=F64).unsqueeze(-1)
    config = OmegaConf.create({"adv_estimator": "pmd_partition", "offpolicy": offpolicy})
    advantages, _ = get_adv_estimator_fn("pmd_partition")(
        token_level_rewards=token_rewards,
        response_mask=torch.ones_like(token_rewards),
        index=np.array(uids, dtype=object),
        config=config,
    )
    return advantages[:, 0]


def _openkimi_ploo(rewards, uids, tau):
    """OpenKimi's ploo, one sample at a time: baseline M + τ·log(max(Σ_{j≠i} exp((r_j − M)/τ)/(K−1), 1e-8))."""
    rewards = [float(r) for r in rewards]
    out = []
    for i, uid in enumerate(uids):
        group = [r for r, u in zip(rewards, uids, strict=True) if u == uid]
        if len(group) == 1:
            out.append(rewards[i])
            continue
        top = max(group)
        partition = sum(math.exp((r - top) / tau) for r in group) - math.exp((rewards[i] - top) / tau)
        out.append(rewards[i] - (top + tau * math.log(max(partition / (len(group) - 1), 1e-8))))
    return torch.tensor(out, dtype=F64)


# ------------------------------------------------------------------ partition_clamp


def test_lone_correct_answer_with_and_without_the_clamp():
    rewards, uids = [1.0, 0.0, 0.0, 0.0], ["g"] * 4
    # clamp 1e-8: the correct answer's leave-one-out term log mean_{j≠i} exp((0 − 1)/0.01) = −100 is floored
    # at ln 1e-8, A = 0.01·ln(1e8) = 0.18421; a wrong answer: −0.01·ln((e^100 + 2)/3) = −1 + 0.01·ln 3
    wrong = -1.0 + TAU * math.log(3.0)
    clamped = run(rewards, uids, tau=TAU, partition_clamp=1e-8)
    torch.testing.assert_close(clamped, torch.tensor([TAU * math.log(1e8), wrong, wrong, wrong], dtype=F64))
    assert clamped[0].item() == pytest.approx(0.18421, abs=1e-5)
    # exact form (null): the other rewards are all 0, so A = 1 − 0.01·ln(mean e^0) = 1
    exact = run(rewards, uids, tau=TAU, partition_clamp=None)
    torch.testing.assert_close(exact, torch.tensor([1.0, wrong, wrong, wrong], dtype=F64))


def test_clamped_estimator_matches_openkimi_ploo():
    rewards = [1.0, 0.0, 0.0, 0.0, 0.5, 0.2, 0.9, 1.0, 1.0, 0.0, 0.0, 0.3, 0.97, 0.95, 0.0]
    uids = ["a"] * 4 + ["b"] * 3 + ["c"] * 4 + ["s"] + ["d"] * 3
    for tau in (TAU, 0.1):
        ours = run(rewards, uids, tau=tau, partition_clamp=1e-8)
        torch.testing.assert_close(ours, _openkimi_ploo(rewards, uids, tau), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("value", ["0", "1", "1.5", "-1e-8"])
def test_partition_clamp_outside_the_open_unit_interval_is_rejected(value):
    cfg = compose_main_ppo(
        "offpolicy_trainer", ["algorithm=pmd_partition", *VALID_SIZES, f"algorithm.offpolicy.partition_clamp={value}"]
    )
    with pytest.raises(
        ValueError, match=r"algorithm\.offpolicy\.partition_clamp must be null \(exact form\) or a number in \(0, 1\)"
    ):
        validate_offpolicy_config(cfg)


def test_preset_sets_openkimis_clamp_and_null_restores_the_exact_form():
    cfg = compose_main_ppo("offpolicy_trainer", ["algorithm=pmd_partition", *VALID_SIZES])
    assert cfg.algorithm.offpolicy.partition_clamp == 1e-8
    validate_offpolicy_config(cfg)
    cfg = compose_main_ppo(
        "offpolicy_trainer", ["algorithm=pmd_partition", *VALID_SIZES, "algorithm.offpolicy.partition_clamp=null"]
    )
    validate_offpolicy_config(cfg)
    assert cfg.algorithm.offpolicy.partition_clamp is None


# ------------------------------------------------------------------ several updates per batch

SIZES_WITHOUT_MINI_BATCH = [o for o in VALID_SIZES if "ppo_mini_batch_size" not in o]


@pytest.mark.parametrize("preset", ["pmd_mean", "pmd_partition"])
@pytest.mark.parametrize("train_batch_size,mini_batch_size", [(512, 32), (96, 6), (16, 1), (8, 1), (50, 2)])
def test_pmd_presets_split_each_batch_into_several_updates(preset, train_batch_size, mini_batch_size):
    # OpenKimi: 512 prompts in mini-batches of 32 (16 updates); elsewhere the largest mini-batch giving ≥ 16
    # updates that divides the batch (96 → 6; 50 → 2, i.e. 25 updates), one prompt per update below 32 prompts
    overrides = [f"algorithm={preset}", *SIZES_WITHOUT_MINI_BATCH, f"data.train_batch_size={train_batch_size}"]
    cfg = compose_main_ppo("offpolicy_trainer", overrides)
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == mini_batch_size
    assert cfg.actor_rollout_ref.actor.ppo_epochs == 1
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    validate_offpolicy_config(cfg)


def _sequence_log_probs(table, responses):
    """log π(y_t) of a position-wise softmax policy: table [T, V] of logits, responses [B, T] → [B, T]."""
    return torch.log_softmax(table, -1).gather(-1, responses.t()).t()


def test_delta_is_nonzero_on_the_later_updates_of_a_batch():
    # pmd_mean through the registered pmd loss with the preset's actor config: a batch of 16 prompts × 2
    # responses splits into 16 updates of one prompt; old_log_prob = the behaviour log-probs of the batch.
    overrides = ["algorithm=pmd_mean", *SIZES_WITHOUT_MINI_BATCH, "actor_rollout_ref.rollout.n=2"]
    cfg = compose_main_ppo("offpolicy_trainer", overrides)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    # the same preset with another τ, to see whether τ changes the gradient
    other_tau = compose_main_ppo("offpolicy_trainer", [*overrides, "algorithm.offpolicy.tau=1.0"])
    other_actor = omega_conf_to_dataclass(other_tau.actor_rollout_ref.actor)
    assert (actor.policy_loss.tau, other_actor.policy_loss.tau) == (0.01, 1.0)
    n = cfg.actor_rollout_ref.rollout.n
    per_update = actor.ppo_mini_batch_size * n
    loss_fn = get_policy_loss_fn(actor.policy_loss.loss_mode)

    generator = torch.Generator().manual_seed(0)
    length, vocab = 3, 5
    responses = torch.randint(vocab, (cfg.data.train_batch_size * n, length), generator=generator)
    advantages = torch.randn(len(responses), 1, generator=generator, dtype=F64).expand(-1, length)
    mask = torch.ones(len(responses), length, dtype=torch.bool)
    table = torch.zeros(length, vocab, dtype=F64, requires_grad=True)
    optimizer = torch.optim.Adam([table], lr=1e-2)
    with torch.no_grad():
        old_log_prob = _sequence_log_probs(table, responses)

    deltas, tau_matters = [], []
    for start in (0, per_update):  # the first two optimizer updates of the batch
        rows = slice(start, start + per_update)
        log_prob = _sequence_log_probs(table, responses[rows])
        deltas.append((log_prob - old_log_prob[rows]).sum(-1).abs().max().item())
        grads = []
        for config in (actor, other_actor):
            loss, _ = loss_fn(old_log_prob[rows], log_prob, advantages[rows], mask[rows], config.loss_agg_mode, config)
            grads.append(torch.autograd.grad(loss, table, retain_graph=True)[0])
        tau_matters.append((grads[0] - grads[1]).abs().max().item())
        optimizer.zero_grad()
        loss, _ = loss_fn(old_log_prob[rows], log_prob, advantages[rows], mask[rows], actor.loss_agg_mode, actor)
        loss.backward()
        optimizer.step()
    assert actor.ppo_mini_batch_size == 1 and per_update == 2
    # first update: Δ = 0, the gradient −(A − τΔ)∇Δ/|y| does not depend on τ (REINFORCE)
    assert deltas[0] == 0.0 and tau_matters[0] < 1e-12  # (rounding of τ·(A/τ) only)
    # second update: the first one moved the weights, so Δ ≠ 0 and the τ·Δ term changes the gradient
    assert deltas[1] > 1e-3 and tau_matters[1] > 1e-4


def test_preset_mini_batch_that_verl_cannot_split_into_micro_batches_is_rejected():
    # train 16 → 1 prompt per update × rollout.n 4 = 4 responses over 2 GPUs = 2 per rank: micro-batch 4 cannot split it
    overrides = [
        "algorithm=pmd_mean",
        *SIZES_WITHOUT_MINI_BATCH,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    ]
    cfg = compose_main_ppo("offpolicy_trainer", overrides)
    with pytest.raises(ValueError, match=r"ppo_micro_batch_size_per_gpu to a divisor of 2"):
        validate_offpolicy_config(cfg)
    # the same micro-batch with a mini-batch that splits: accepted
    validate_offpolicy_config(
        compose_main_ppo("offpolicy_trainer", [*overrides, "actor_rollout_ref.actor.ppo_mini_batch_size=16"])
    )
