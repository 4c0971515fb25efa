"""Typed configs of verl-offpolicy, validated where verl builds them.

- ``algorithm.offpolicy`` (:class:`OffPolicyConfig`): every estimator hyperparameter and the
  scheduler knobs, one place each. Presets interpolate ``algorithm.offpolicy.tau`` into the loss.
- ``algorithm`` (:class:`OffPolicyAlgoConfig`): verl's ``AlgoConfig`` plus that section.
- ``actor_rollout_ref.actor.policy_loss`` (:class:`OffPolicyLossConfig`): verl's
  ``PolicyLossConfig`` plus the parameters of the ``opmd``/``pmd``/``rec`` losses. verl converts it
  on the driver in ``validate_config`` (``ActorConfig``), so ``__post_init__`` fails at startup.

Errors name the full key and the allowed values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from verl.trainer.config import AlgoConfig
from verl.workers.config import PolicyLossConfig

from verl_offpolicy.core.schedule import Schedule, check_schedule
from verl_offpolicy.glue.registration import ADV_ESTIMATORS, POLICY_LOSSES, require_registration

OPMD_BASELINES = ("mean", "logavgexp")
RATIO_ANCHORS = ("behaviour", "rollout", "proximal")
CLIP_MODES = ("none", "one-side", "two-side", "ring", "gspo-one-side")
WEIGHTS = ("none", "importance_sampling", "gspo_importance_sampling")
REGULARIZERS = ("none", "forward-kl", "k2", "k2_seq")
# The default τ of each consumer (docs/algorithms.md), used while ``tau`` is left unset (null).
DEFAULT_TAU = {"opmd": 1.0, "pmd_partition": 0.01, "pmd": 0.01}

ALGO_PREFIX = "algorithm.offpolicy"
LOSS_PREFIX = "actor_rollout_ref.actor.policy_loss"


def _check_choice(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is not valid; allowed values: {', '.join(allowed)}")


def _check_number(key: str, value: Any, *, positive: bool = False, non_negative: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{key} must be > 0, got {value!r}")
    if non_negative and value < 0:
        raise ValueError(f"{key} must be >= 0, got {value!r}")


@dataclass
class OffPolicyConfig:
    """``algorithm.offpolicy``: estimator hyperparameters and the staleness scheduler.

    Args:
        tau: temperature τ of ``opmd`` (logavgexp baseline), ``pmd_partition`` and the ``opmd``/``pmd`` losses;
            null = each one's default (opmd 1.0, pmd_partition 0.01, pmd 0.01).
        baseline: ``opmd`` estimator baseline, ``mean`` (r̄) or ``logavgexp`` (τ·(logsumexp(r/τ) − log K)).
        shift: ``asymre`` baseline shift (A = r − (r̄ + shift)).
        seed: ``red_drop`` seed; the drop is reproducible from (seed, uid).
        temperature: ``red_weight`` temperature T.
        beta: ``agro`` β; must equal ``algorithm.kl_ctrl.kl_coef``.
        on_policy: ``agro`` adds the on-policy likelihood-ratio term.
        sync_interval: s ≥ 1, rollout weights refreshed every s training steps.
        sync_offset: d ≥ 0, batches generated before training starts.
        ratio_anchor: what ``old_log_prob`` means in the loss: ``behaviour``, ``rollout`` or ``proximal``.
        partition_clamp: ``pmd_partition`` floor c ∈ (0, 1) of the leave-one-out partition term,
            A_i = −τ·max(log((1/(K−1))·Σ_{j≠i} exp((r_j − r_i)/τ)), log c) (OpenKimi: 1e-8); null = exact.
    """

    tau: float | None = None
    baseline: str = "mean"
    shift: float = -0.1
    seed: int = 0
    temperature: float = 1.0
    beta: float = 0.1
    on_policy: bool = False
    sync_interval: int = 1
    sync_offset: int = 0
    ratio_anchor: str = "proximal"
    partition_clamp: float | None = None

    def __post_init__(self):
        if self.tau is not None:
            _check_number(f"{ALGO_PREFIX}.tau", self.tau)
        _check_choice(f"{ALGO_PREFIX}.baseline", self.baseline, OPMD_BASELINES)
        _check_number(f"{ALGO_PREFIX}.shift", self.shift)
        _check_number(f"{ALGO_PREFIX}.temperature", self.temperature, positive=True)
        _check_number(f"{ALGO_PREFIX}.beta", self.beta, positive=True)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"{ALGO_PREFIX}.seed must be an integer, got {self.seed!r}")
        if not isinstance(self.on_policy, bool):
            raise ValueError(f"{ALGO_PREFIX}.on_policy must be true or false, got {self.on_policy!r}")
        check_schedule(self.sync_interval, self.sync_offset)
        _check_choice(f"{ALGO_PREFIX}.ratio_anchor", self.ratio_anchor, RATIO_ANCHORS)
        clamp = self.partition_clamp
        if clamp is not None and (isinstance(clamp, bool) or not isinstance(clamp, int | float) or not 0 < clamp < 1):
            raise ValueError(
                f"{ALGO_PREFIX}.partition_clamp must be null (exact form) or a number in (0, 1) "
                f"(OpenKimi: 1e-8), got {clamp!r}"
            )

    @property
    def schedule(self) -> Schedule:
        """The (sync_interval, sync_offset) pair as the one :class:`Schedule` value the trainer holds."""
        return Schedule(self.sync_interval, self.sync_offset)

    def tau_for(self, consumer: str) -> float:
        """τ as ``consumer`` (an estimator name) uses it: the set value, else the spec's default."""
        return DEFAULT_TAU.get(consumer, 1.0) if self.tau is None else self.tau

    def check_for_estimator(self, adv_estimator: str) -> None:
        """Checks that depend on which estimator reads this section."""
        if adv_estimator == "pmd_partition" or (adv_estimator == "opmd" and self.baseline == "logavgexp"):
            _check_number(
                f"{ALGO_PREFIX}.tau (used by adv_estimator={adv_estimator})", self.tau_for(adv_estimator), positive=True
            )


def offpolicy_section(algorithm_config: Any) -> OffPolicyConfig:
    """Build and validate ``algorithm.offpolicy`` from verl's algorithm config (DictConfig or dataclass)."""
    section = algorithm_config.get("offpolicy", None) if algorithm_config is not None else None
    if section is None:
        return OffPolicyConfig()
    if isinstance(section, OffPolicyConfig):
        return section
    from omegaconf import DictConfig, OmegaConf

    values = OmegaConf.to_container(section, resolve=True) if isinstance(section, DictConfig) else dict(section)
    known = set(OffPolicyConfig.__dataclass_fields__)
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {ALGO_PREFIX}; allowed keys: {', '.join(sorted(known))}")
    return OffPolicyConfig(**values)


@dataclass
class OffPolicyAlgoConfig(AlgoConfig):
    """verl's ``AlgoConfig`` with the ``offpolicy`` section (select with ``algorithm._target_``)."""

    offpolicy: OffPolicyConfig = field(default_factory=OffPolicyConfig)

    def __post_init__(self):
        if not isinstance(self.offpolicy, OffPolicyConfig):  # hydra.instantiate passes the section as a dict
            object.__setattr__(self, "offpolicy", offpolicy_section({"offpolicy": self.offpolicy}))
        if self.adv_estimator in ADV_ESTIMATORS:
            require_registration("adv_estimator", self.adv_estimator)
        self.offpolicy.check_for_estimator(self.adv_estimator)


@dataclass
class OffPolicyLossConfig(PolicyLossConfig):
    """verl's ``PolicyLossConfig`` plus the parameters of the ``opmd``, ``pmd`` and ``rec`` losses.

    Args:
        tau: ``opmd`` loss: ℓ = −A·log π/(1+τ), τ ≥ 0 (default 1.0). ``pmd`` loss: ½τ(A/τ − Δ)²/|y|, τ > 0
            (default 0.01). null = that default.
        clip_mode: ``rec`` token mask: none, one-side, two-side, ring, gspo-one-side.
        weight: ``rec`` token weight: none, importance_sampling (ρ_t), gspo_importance_sampling (ρ̄_i).
        regularizer: ``rec`` regulariser: none, forward-kl (−c·log π), k2 (token-level c·(log π_t − log π_old,t)²,
            as Trinity-RFT), k2_seq (sequence-level c·(Σ_t (log π_t − log π_old,t))²/|y| per response, as Kimi k1.5).
        regularizer_coef: c ≥ 0.
        ring_clip_ratio_low: ε′_low of ``ring`` (≥ the actor's clip_ratio_low).
        ring_clip_ratio_high: ε′_high of ``ring`` (≥ the actor's clip_ratio_high).
    """

    tau: float | None = None
    clip_mode: str = "none"
    weight: str = "none"
    regularizer: str = "none"
    regularizer_coef: float = 0.0
    ring_clip_ratio_low: float = 0.6
    ring_clip_ratio_high: float = 2.0

    def __post_init__(self):
        if self.loss_mode in POLICY_LOSSES:
            require_registration("policy_loss", self.loss_mode)
        if self.loss_mode == "pmd":
            _check_number(f"{LOSS_PREFIX}.tau (loss_mode=pmd)", self.resolved_tau, positive=True)
        else:
            _check_number(f"{LOSS_PREFIX}.tau", self.resolved_tau, non_negative=True)
        _check_choice(f"{LOSS_PREFIX}.clip_mode", self.clip_mode, CLIP_MODES)
        _check_choice(f"{LOSS_PREFIX}.weight", self.weight, WEIGHTS)
        _check_choice(f"{LOSS_PREFIX}.regularizer", self.regularizer, REGULARIZERS)
        _check_number(f"{LOSS_PREFIX}.regularizer_coef", self.regularizer_coef, non_negative=True)
        _check_number(f"{LOSS_PREFIX}.ring_clip_ratio_low", self.ring_clip_ratio_low, non_negative=True)
        _check_number(f"{LOSS_PREFIX}.ring_clip_ratio_high", self.ring_clip_ratio_high, non_negative=True)


    @property
    def resolved_tau(self) -> float:
        """τ as this loss uses it: the set value, else the spec's default for ``loss_mode``."""
        return DEFAULT_TAU.get(self.loss_mode, 1.0) if self.tau is None else self.tau


AGRO_KL_PENALTIES = ("kl", "k1")


def check_agro_reward(algorithm: Any, beta: float) -> None:
    """AGRO's R = r − β·log(π/π_ref) must be verl's KL-in-reward: kl_penalty=kl, fixed coefficient β.

    ``algorithm`` is verl's algorithm section (DictConfig, dataclass or dict); only the keys it has
    are checked (the composed config has them all). Raises ``ValueError`` listing what to set.
    """
    fixes = []
    if algorithm.get("use_kl_in_reward", True) is False:
        fixes.append("algorithm.use_kl_in_reward=true (AGRO needs a reference policy and R = r − β·log(π/π_ref))")
    kl_penalty = algorithm.get("kl_penalty", "kl")
    if kl_penalty not in AGRO_KL_PENALTIES:
        fixes.append(f"algorithm.kl_penalty=kl (got {kl_penalty})")
    kl_ctrl = algorithm.get("kl_ctrl", None) or {}
    if kl_ctrl.get("type", "fixed") != "fixed":
        fixes.append(f"algorithm.kl_ctrl.type=fixed (got {kl_ctrl.get('type')})")
    kl_coef = kl_ctrl.get("kl_coef", beta)
    if kl_coef != beta:
        fixes.append(
            f"algorithm.kl_ctrl.kl_coef={beta} to equal {ALGO_PREFIX}.beta (got kl_coef={kl_coef}); "
            "the presets interpolate kl_coef from beta"
        )
    if fixes:
        raise ValueError("adv_estimator=agro is inconsistent; set " + "; ".join(fixes))


def check_clip_ratios(clip_ratio_low: float, clip_ratio_high: float, loss_config: OffPolicyLossConfig) -> None:
    """Checks that need the actor's ε: non-negative ε, and ring ε′ ≥ ε."""
    _check_number("actor_rollout_ref.actor.clip_ratio_low", clip_ratio_low, non_negative=True)
    _check_number("actor_rollout_ref.actor.clip_ratio_high", clip_ratio_high, non_negative=True)
    if loss_config.clip_mode == "ring":
        if loss_config.ring_clip_ratio_low < clip_ratio_low:
            raise ValueError(
                f"{LOSS_PREFIX}.ring_clip_ratio_low={loss_config.ring_clip_ratio_low} must be >= "
                f"actor_rollout_ref.actor.clip_ratio_low={clip_ratio_low} (ring ε′ ≥ ε)"
            )
        if loss_config.ring_clip_ratio_high < clip_ratio_high:
            raise ValueError(
                f"{LOSS_PREFIX}.ring_clip_ratio_high={loss_config.ring_clip_ratio_high} must be >= "
                f"actor_rollout_ref.actor.clip_ratio_high={clip_ratio_high} (ring ε′ ≥ ε)"
            )
