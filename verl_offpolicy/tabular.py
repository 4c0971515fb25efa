"""Tabular testbed: the REGISTERED estimators and losses driven on softmax bandits.

One prompt, a softmax policy π = softmax(θ) over n arms, each "sequence" is one token (T = 1), and
gradient ascent on the logits θ (descent on the registered loss). Every advantage comes from
``verl.trainer.ppo.core_algos.get_adv_estimator_fn(name)`` with a real algorithm config and every
gradient from ``get_policy_loss_fn(loss_mode)`` with a real :class:`verl.workers.config.ActorConfig`
holding an :class:`~verl_offpolicy.glue.config.OffPolicyLossConfig` — the same functions verl's
trainer calls — so the dynamics below are those of the implementation, not of a re-derivation.

Expectations are exact: a batch holds each arm with a multiplicity proportional to its behaviour
probability (μ = [0.3, 0.6, 0.1] → counts [3, 6, 1]), so verl's token-mean over the batch is
E_{y∼μ}[ℓ(y)] and the group mean is V^μ. With exact expectations the dynamics are deterministic, so a
step whose gradient is exactly zero is a fixed point (:func:`train` stops there).

Used by ``tests/algorithms/test_algorithms_properties.py`` (the eight properties of ``docs/algorithms.md``) and by
``benchmarks/tabular_studies.py`` (the papers' bandit studies, with curves).
"""

from __future__ import annotations

import itertools
from typing import Callable, Optional

import numpy as np
import torch
import verl  # noqa: F401  (loads the verl.plugins entry point: registers our names)
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import agg_loss, get_adv_estimator_fn, get_policy_loss_fn, kl_penalty
from verl.workers.config import ActorConfig

from verl_offpolicy.glue.config import OffPolicyAlgoConfig, OffPolicyConfig, OffPolicyLossConfig
from verl_offpolicy.glue.validation import validate_parts

__all__ = [
    "F64",
    "REWARD",
    "MU",
    "V_MU",
    "MU_ARMS",
    "N_SAMPLES",
    "REWARD6",
    "REF_COUNTS",
    "PI_REF",
    "REF_ARMS",
    "actor",
    "agro_config",
    "pairwise_opmd_config",
    "estimate",
    "loss_gradient",
    "train",
    "expected_reward",
    "entropy",
    "kl",
    "sample_exactly",
    "sync_run",
    "regularised_optimum",
    "regularised_run",
    "all_groups",
    "agro_onpolicy_run",
]

F64 = torch.float64

# The three-arm off-policy bandit of docs/algorithms.md: rewards, fixed behaviour μ, V^μ, and μ as 10 samples.
REWARD = torch.tensor([0.0, 0.8, 1.0], dtype=F64)
MU = torch.tensor([0.3, 0.6, 0.1], dtype=F64)
V_MU = 0.58  # 0.3·0 + 0.6·0.8 + 0.1·1
MU_ARMS = torch.repeat_interleave(torch.arange(3), torch.tensor([3, 6, 1]))  # 10 samples, exactly μ

# Batch size of a refreshed behaviour (sync_run): counts closest to N·π.
N_SAMPLES = 20000

# The six-arm regularised bandit of docs/algorithms.md, property 6 (AGRO): data from π_ref only, exact.
REWARD6 = torch.tensor([0.0, 0.2, 0.4, 0.6, 0.8, 1.0], dtype=F64)
REF_COUNTS = torch.tensor([1, 2, 3, 4, 5, 5])
PI_REF = REF_COUNTS.to(F64) / REF_COUNTS.sum()
REF_ARMS = torch.repeat_interleave(torch.arange(6), REF_COUNTS)


def agro_config(beta: float, on_policy: bool) -> OffPolicyAlgoConfig:
    """The algorithm config of the ``agro``/``agro_onpolicy`` presets: KL-in-reward (kl, fixed β) and β."""
    return OffPolicyAlgoConfig(
        adv_estimator="agro",
        use_kl_in_reward=True,
        kl_penalty="kl",
        kl_ctrl={"type": "fixed", "kl_coef": beta},
        offpolicy=OffPolicyConfig(beta=beta, on_policy=on_policy),
    )


def pairwise_opmd_config(tau: float) -> OffPolicyAlgoConfig:
    """The algorithm config of the ``pairwise_opmd`` preset: KL-in-reward (kl, fixed coefficient τ) and τ."""
    return OffPolicyAlgoConfig(
        adv_estimator="pairwise_opmd",
        use_kl_in_reward=True,
        kl_penalty="kl",
        kl_ctrl={"type": "fixed", "kl_coef": tau},
        offpolicy=OffPolicyConfig(tau=tau),
    )


def actor(loss_mode: str, clip: tuple[float, float] = (0.2, 0.2), rollout_n: int = 1, **loss_kw) -> ActorConfig:
    """A real ActorConfig with our OffPolicyLossConfig (``loss_kw``: clip_mode, weight, tau, ...)."""
    return ActorConfig(
        strategy="fsdp",
        rollout_n=rollout_n,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio_low=clip[0],
        clip_ratio_high=clip[1],
        policy_loss=OffPolicyLossConfig(loss_mode=loss_mode, **loss_kw),
    )


def estimate(name, arms, rewards=REWARD, config=None, sample_rewards=None, **offpolicy):
    """Registered estimator on one group (one uid) of one-token responses; returns A [B, 1].

    The reward of sample i is ``rewards[arms[i]]``, or ``sample_rewards[i]`` when given. Without
    ``config`` the algorithm config is ``{adv_estimator: name, norm_adv_by_std_in_grpo: false,
    offpolicy: <offpolicy kwargs>}`` (grpo thus has no std normalisation: A = r − r̄).
    """
    token_rewards = (rewards[arms] if sample_rewards is None else sample_rewards).unsqueeze(-1)
    if config is None:
        config = OmegaConf.create({"adv_estimator": name, "norm_adv_by_std_in_grpo": False, "offpolicy": offpolicy})
        validate_parts(algorithm=config)  # the startup rules (a passed config is validated by its caller)
    kwargs = {"norm_adv_by_std_in_grpo": False} if name == "grpo" else {}
    advantages, _ = get_adv_estimator_fn(name)(
        token_level_rewards=token_rewards,
        response_mask=torch.ones_like(token_rewards),
        index=np.zeros(len(arms), dtype=np.int64),
        config=config,
        **kwargs,
    )
    return advantages


def loss_gradient(config, theta, arms, behaviour, advantages, *, agg="token-mean", weights=None, extra=None):
    """∂(registered loss)/∂θ for the batch ``arms`` with old_log_prob = log behaviour.

    ``weights`` is passed as ``rollout_is_weights`` [B, 1]; ``extra(log_prob, mask)`` is added to the
    loss (e.g. a KL loss).
    """
    theta = theta.detach().requires_grad_(True)
    log_prob = torch.log_softmax(theta, 0)[arms].unsqueeze(-1)
    old = torch.log(behaviour)[arms].unsqueeze(-1)
    mask = torch.ones_like(old, dtype=torch.bool)
    loss, _ = get_policy_loss_fn(config.policy_loss.loss_mode)(
        old, log_prob, advantages, mask, agg, config, rollout_is_weights=weights
    )
    if extra is not None:
        loss = loss + extra(log_prob, mask)
    (grad,) = torch.autograd.grad(loss, theta)
    return grad


def train(
    config,
    advantages,
    steps: int,
    lr: float,
    *,
    behaviour: torch.Tensor = MU,
    theta: Optional[torch.Tensor] = None,
    arms: torch.Tensor = MU_ARMS,
    agg: str = "token-mean",
    history: Optional[list] = None,
):
    """Gradient ascent on the logits with fixed data ``arms`` from ``behaviour``.

    Returns (θ, steps taken); stops at an exact fixed point (zero gradient), which the deterministic
    dynamics never leave. If ``history`` is a list, π is appended before the first and after every step.
    """
    validate_parts(actor=config, loss_agg_mode=agg)
    theta = torch.log(behaviour) if theta is None else theta
    if history is not None:
        history.append(torch.softmax(theta, 0))
    for step in range(steps):
        grad = loss_gradient(config, theta, arms, behaviour, advantages, agg=agg)
        if not grad.any():
            return theta, step
        theta = theta - lr * grad
        if history is not None:
            history.append(torch.softmax(theta, 0))
    return theta, steps


def expected_reward(theta, rewards=REWARD) -> float:
    return float(torch.softmax(theta, 0) @ rewards)


def entropy(p: torch.Tensor) -> float:
    """Shannon entropy (nats) of a probability vector (0·log 0 = 0)."""
    return float(-(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum())


def kl(p: torch.Tensor, q: torch.Tensor) -> float:
    """KL(p‖q) = Σ p·(log p − log q)."""
    return float((p * (p.log() - q.log())).sum())


def sample_exactly(probs: torch.Tensor, n: int = N_SAMPLES) -> torch.Tensor:
    """Counts of ``n`` draws closest to n·probs (largest remainder)."""
    raw = probs * n
    counts = torch.floor(raw).long()
    counts[torch.argsort(raw - counts, descending=True)[: n - int(counts.sum())]] += 1
    return counts


def sync_run(
    config,
    estimator: str,
    phases: int,
    *,
    sync_interval: int = 1000,
    lr: float = 1.0,
    rewards: torch.Tensor = REWARD,
    theta: Optional[torch.Tensor] = None,
    n_samples: int = N_SAMPLES,
    history: Optional[list] = None,
    **offpolicy,
) -> torch.Tensor:
    """Behaviour refreshed to π every ``sync_interval`` steps; returns the final π.

    At each refresh a new batch of ``n_samples`` responses is drawn from π (exact counts,
    :func:`sample_exactly`) and the registered estimator (``offpolicy``: its parameters) runs on the
    full batch; then ``sync_interval`` ascent steps follow with old_log_prob = log behaviour (the
    behaviour ratio anchor). The loss runs on the n distinct arms with ``rollout_is_weights`` =
    n·count/N, which makes verl's token-mean equal the full-batch mean. A step with an exactly zero
    gradient is a fixed point until the next refresh. With ``history``, π is appended before the first
    and after every step (held constant over skipped fixed-point steps).
    """
    validate_parts(actor=config)
    n_arms = len(rewards)
    theta = torch.log(MU) if theta is None else theta
    arms = torch.arange(n_arms)
    if history is not None:
        history.append(torch.softmax(theta, 0))
    for _ in range(phases):
        behaviour = torch.softmax(theta, 0)
        counts = sample_exactly(behaviour, n_samples)
        batch = torch.repeat_interleave(arms, counts)
        per_sample = estimate(estimator, batch, rewards=rewards, **offpolicy)[:, 0]
        advantages = torch.zeros(n_arms, dtype=F64).index_put_((batch,), per_sample).unsqueeze(-1)
        weights = (n_arms * counts.to(F64) / n_samples).unsqueeze(-1)
        for step in range(sync_interval):
            grad = loss_gradient(config, theta, arms, behaviour, advantages, weights=weights)
            if not grad.any():  # exact fixed point until the next refresh
                if history is not None:
                    history.extend([torch.softmax(theta, 0)] * (sync_interval - step))
                break
            theta = theta - lr * grad
            if history is not None:
                history.append(torch.softmax(theta, 0))
    return torch.softmax(theta, 0)


def regularised_optimum(beta: float, rewards: torch.Tensor = REWARD6, pi_ref: torch.Tensor = PI_REF) -> torch.Tensor:
    """π* ∝ π_ref·exp(r/β), the maximiser of E_π[r] − β·KL(π‖π_ref)."""
    logits = torch.log(pi_ref) + rewards / beta
    return torch.softmax(logits, 0)


def regularised_run(
    method: str,
    beta: float,
    steps: int,
    lr: float,
    *,
    rewards: torch.Tensor = REWARD6,
    ref_counts: torch.Tensor = REF_COUNTS,
    history: Optional[list] = None,
):
    """KL-regularised bandit with data from π_ref only (exact counts); returns (θ, last gradient).

    ``method``:
    - ``agro``: verl's KL-in-reward at the current (proximal) weights, R = r − β·kl_penalty(log π,
      log π_ref, "kl"), the registered ``agro`` estimator (off-policy, config with kl_ctrl fixed β)
      and the ``rec`` loss (no mask, no weight) with seq-mean-token-sum, as in the ``agro`` preset.
    - ``pairwise_opmd``: the same KL-in-reward with coefficient τ = ``beta``, the registered ``pairwise_opmd``
      estimator (A_i = 2Kτ(a_i − ā)/(1+τ)²) and loss, as in the ``pairwise_opmd`` preset.
    - ``k2``: the GRPO-style alternative: mean baseline on the raw reward (``grpo`` without std) and
      the ``rec`` loss plus β·k2 KL loss (verl's kl_penalty "k2", token-mean), as verl's use_kl_loss.

    θ starts at log π_ref. With ``history``, π is appended before the first and after every step.
    """
    arms = torch.repeat_interleave(torch.arange(len(rewards)), ref_counts)
    pi_ref = ref_counts.to(F64) / ref_counts.sum()
    ref_log_prob = torch.log(pi_ref)[arms].unsqueeze(-1)
    config = actor("pairwise_opmd" if method == "pairwise_opmd" else "rec")
    theta = torch.log(pi_ref)
    if history is not None:
        history.append(torch.softmax(theta, 0))
    extra: Optional[Callable] = None
    if method == "agro":
        algo = agro_config(beta, on_policy=False)
        validate_parts(algorithm=algo, actor=config, loss_agg_mode="seq-mean-token-sum")
    elif method == "pairwise_opmd":
        algo = pairwise_opmd_config(beta)
        validate_parts(algorithm=algo, actor=config, loss_agg_mode="seq-mean-token-sum")
    elif method == "k2":
        advantages = estimate("grpo", arms, rewards=rewards)

        def k2_kl_loss(log_prob, mask):
            return beta * agg_loss(kl_penalty(log_prob, ref_log_prob, "k2"), mask, "token-mean")

        extra = k2_kl_loss

    else:
        raise ValueError(f"method must be 'agro', 'pairwise_opmd' or 'k2', got {method!r}")
    grad = torch.zeros_like(theta)
    for _ in range(steps):
        if method in ("agro", "pairwise_opmd"):
            log_prob = torch.log_softmax(theta, 0)[arms].unsqueeze(-1)
            token_rewards = rewards[arms].unsqueeze(-1) - beta * kl_penalty(log_prob, ref_log_prob, "kl")
            advantages = estimate(method, arms, config=algo, sample_rewards=token_rewards[:, 0])
            grad = loss_gradient(config, theta, arms, pi_ref, advantages, agg="seq-mean-token-sum")
        else:
            grad = loss_gradient(config, theta, arms, pi_ref, advantages, extra=extra)
        theta = theta - lr * grad
        if history is not None:
            history.append(torch.softmax(theta, 0))
    return theta, grad


def all_groups(n_arms: int, k: int) -> torch.Tensor:
    """Every ordered K-tuple of arms [n_arms**k, k]: the groups of K i.i.d. responses, enumerated."""
    return torch.tensor(list(itertools.product(range(n_arms), repeat=k)))


def agro_onpolicy_run(
    p_correct: float, beta: float, steps: int, lr: float, k: int = 4, history: Optional[list] = None
) -> torch.Tensor:
    """On-policy AGRO on a 2-arm bandit (arm 0 wrong, r = 0; arm 1 correct, r = 1), exact expectations.

    π starts at π_ref = [1 − p, p]. Each step enumerates every group of K responses from the current
    π (:func:`all_groups`, weight Π_i π(y_i)), forms verl's KL-in-reward R = r − β·kl_penalty(log π,
    log π_ref, "kl") at the current weights, runs the registered ``agro`` estimator with
    ``on_policy=true`` (one uid per group) and descends the registered ``rec`` loss
    (seq-mean-token-sum, as the ``agro_onpolicy`` preset) with ``rollout_is_weights`` that make the
    batch mean the expectation over groups. Returns the final π.
    """
    rewards = torch.tensor([0.0, 1.0], dtype=F64)
    pi_ref = torch.tensor([1.0 - p_correct, p_correct], dtype=F64)
    algo = agro_config(beta, on_policy=True)
    groups = all_groups(2, k)
    arms = groups.flatten()
    uids = np.repeat(np.arange(len(groups)), k)
    ref_log_prob = torch.log(pi_ref)[arms].unsqueeze(-1)
    config = actor("rec", rollout_n=k)
    validate_parts(algorithm=algo, actor=config, loss_agg_mode="seq-mean-token-sum")
    theta = torch.log(pi_ref)
    if history is not None:
        history.append(torch.softmax(theta, 0))
    for _ in range(steps):
        pi = torch.softmax(theta, 0)
        log_prob = torch.log(pi)[arms].unsqueeze(-1)
        token_rewards = rewards[arms].unsqueeze(-1) - beta * kl_penalty(log_prob, ref_log_prob, "kl")
        advantages, _ = get_adv_estimator_fn("agro")(
            token_level_rewards=token_rewards, response_mask=torch.ones_like(token_rewards), index=uids, config=algo
        )
        weights = (len(groups) * pi[groups].prod(-1)).repeat_interleave(k).unsqueeze(-1)
        theta = theta - lr * loss_gradient(
            config, theta, arms, pi, advantages, agg="seq-mean-token-sum", weights=weights
        )
        if history is not None:
            history.append(torch.softmax(theta, 0))
    return torch.softmax(theta, 0)
