"""Typed configs of verl-offpolicy, validated where verl builds them.

- ``algorithm.offpolicy`` (:class:`OffPolicyConfig`): every estimator hyperparameter and the
  scheduler knobs, one place each. Presets interpolate ``algorithm.offpolicy.tau`` into the loss.
- ``algorithm`` (:class:`OffPolicyAlgoConfig`): verl's ``AlgoConfig`` plus that section.
- ``actor_rollout_ref.actor.policy_loss`` (:class:`OffPolicyLossConfig`): verl's
  ``PolicyLossConfig`` plus the parameters of the ``opmd``/``pmd``/``rec`` losses. verl converts it
  on the driver in ``validate_config`` (``ActorConfig``), so ``__post_init__`` fails at startup.

Errors name the full key and the allowed values. :class:`ConfigView` is a whole composed config as the
startup rules of every part read it (:mod:`verl_offpolicy.glue.validation`); the rules that combine
sections live with their owners (``glue/algorithms/<family>.py``, ``glue/scheduler/checks.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from verl.trainer.config import AlgoConfig
from verl.workers.config import PolicyLossConfig

from verl_offpolicy.core.advantages import TOPR_REWARDS
from verl_offpolicy.core.losses import M2PO_TOKEN_POOLS
from verl_offpolicy.core.schedule import Schedule, check_schedule
from verl_offpolicy.glue.registration import ADV_ESTIMATORS, POLICY_LOSSES, require_registration

OPMD_BASELINES = ("mean", "logavgexp")
RATIO_ANCHORS = ("behaviour", "rollout", "proximal")
CLIP_MODES = ("none", "one-side", "two-side", "ring", "gspo-one-side")
WEIGHTS = ("none", "importance_sampling", "gspo_importance_sampling")
REGULARIZERS = ("none", "forward-kl", "k2", "k2_seq")
# The default τ of each consumer (docs/algorithms.md), used while ``tau`` is left unset (null).
DEFAULT_TAU = {"opmd": 1.0, "pmd_partition": 0.01, "pmd": 0.01, "pairwise_opmd": 1.0}

ALGO_PREFIX = "algorithm.offpolicy"
LOSS_PREFIX = "actor_rollout_ref.actor.policy_loss"
# How the presets set the loss's τ (offpolicy_shared/common.yaml): one hyperparameter, set as algorithm.offpolicy.tau.
TAU_INTERPOLATION = "${" + ALGO_PREFIX + ".tau}"


def _check_choice(key: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is not valid; allowed values: {', '.join(allowed)}")


def check_number(key: str, value: Any, *, positive: bool = False, non_negative: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{key} must be > 0, got {value!r}")
    if non_negative and value < 0:
        raise ValueError(f"{key} must be >= 0, got {value!r}")


def resolve_tau(tau: float | None, consumer: str) -> float:
    """τ as ``consumer`` (an estimator or loss name) uses it: ``tau`` if set, else ``DEFAULT_TAU[consumer]``."""
    return DEFAULT_TAU.get(consumer, 1.0) if tau is None else tau


@dataclass
class OffPolicyConfig:
    """``algorithm.offpolicy``: estimator hyperparameters and the staleness scheduler.

    Args:
        tau: temperature τ of ``opmd`` (logavgexp baseline), ``pmd_partition``, ``pairwise_opmd`` (also its KL
            coefficient) and the ``opmd``/``pmd`` losses; null = each one's default (opmd 1.0, pmd_partition
            0.01, pmd 0.01, pairwise_opmd 1.0).
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
        topr_baseline: ``topr`` scalar baseline c (A_i = R_i − c; TOPR's default 0).
        topr_reward: ``topr`` reward R_i: signed (2r_i − 1, 0/1 rewards as TOPR's ±1) or raw (r_i).
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
    topr_baseline: float = 0.0
    topr_reward: str = "signed"

    def __post_init__(self):
        if self.tau is not None:
            check_number(f"{ALGO_PREFIX}.tau", self.tau)
        _check_choice(f"{ALGO_PREFIX}.baseline", self.baseline, OPMD_BASELINES)
        check_number(f"{ALGO_PREFIX}.shift", self.shift)
        check_number(f"{ALGO_PREFIX}.temperature", self.temperature, positive=True)
        check_number(f"{ALGO_PREFIX}.beta", self.beta, positive=True)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"{ALGO_PREFIX}.seed must be an integer, got {self.seed!r}")
        if not isinstance(self.on_policy, bool):
            raise ValueError(f"{ALGO_PREFIX}.on_policy must be true or false, got {self.on_policy!r}")
        check_schedule(self.sync_interval, self.sync_offset)
        check_number(f"{ALGO_PREFIX}.topr_baseline", self.topr_baseline)
        _check_choice(f"{ALGO_PREFIX}.topr_reward", self.topr_reward, TOPR_REWARDS)
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
        """τ as ``consumer`` (an estimator name) uses it (:func:`resolve_tau`)."""
        return resolve_tau(self.tau, consumer)

    def estimator_reads_tau(self, adv_estimator: str) -> bool:
        """True if ``adv_estimator`` reads τ: ``pmd_partition``, ``pairwise_opmd``, and ``opmd`` with the
        ``logavgexp`` baseline."""
        return adv_estimator in ("pmd_partition", "pairwise_opmd") or (
            adv_estimator == "opmd" and self.baseline == "logavgexp"
        )

    def check_for_estimator(self, adv_estimator: str) -> None:
        """Checks that depend on which estimator reads this section."""
        if self.estimator_reads_tau(adv_estimator):
            check_number(
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
            as Trinity-RFT), k2_seq (sequence-level c·(Σ_t (log π_t − log π_old,t))²/|y| per response: the
            length normalisation is OpenKimi's; Kimi k1.5's objective has no 1/|y|).
        regularizer_coef: c ≥ 0.
        ring_clip_ratio_low: ε′_low of ``ring`` (≥ the actor's clip_ratio_low).
        ring_clip_ratio_high: ε′_high of ``ring`` (≥ the actor's clip_ratio_high).
        m2po_threshold: ``m2po`` budget τ_M2 > 0 of the second moment mean (log ρ_t)² over the mini-batch
            (default 0.04, the M2PO authors' setting).
        m2po_token_pool: the tokens ``m2po`` may mask: trust_region (the harmful tokens, (A > 0 ∧ ρ > 1) ∨
            (A < 0 ∧ ρ < 1), M2PO's Algorithm 1 and the authors' code; default) or all; others are never masked.
    """

    tau: float | None = None
    clip_mode: str = "none"
    weight: str = "none"
    regularizer: str = "none"
    regularizer_coef: float = 0.0
    ring_clip_ratio_low: float = 0.6
    ring_clip_ratio_high: float = 2.0
    m2po_threshold: float = 0.04
    m2po_token_pool: str = "trust_region"

    def __post_init__(self):
        if self.loss_mode in POLICY_LOSSES:
            require_registration("policy_loss", self.loss_mode)
        check_loss_tau(self.loss_mode, self.resolved_tau)
        _check_choice(f"{LOSS_PREFIX}.clip_mode", self.clip_mode, CLIP_MODES)
        _check_choice(f"{LOSS_PREFIX}.weight", self.weight, WEIGHTS)
        _check_choice(f"{LOSS_PREFIX}.regularizer", self.regularizer, REGULARIZERS)
        check_number(f"{LOSS_PREFIX}.regularizer_coef", self.regularizer_coef, non_negative=True)
        check_number(f"{LOSS_PREFIX}.ring_clip_ratio_low", self.ring_clip_ratio_low, non_negative=True)
        check_number(f"{LOSS_PREFIX}.ring_clip_ratio_high", self.ring_clip_ratio_high, non_negative=True)
        check_number(f"{LOSS_PREFIX}.m2po_threshold", self.m2po_threshold, positive=True)
        _check_choice(f"{LOSS_PREFIX}.m2po_token_pool", self.m2po_token_pool, M2PO_TOKEN_POOLS)


    @property
    def resolved_tau(self) -> float:
        """τ as this loss uses it (:func:`resolve_tau` for ``loss_mode``)."""
        return resolve_tau(self.tau, self.loss_mode)


def check_loss_tau(loss_mode: str, tau: Any, *, interpolated: bool = False) -> None:
    """τ of the loss ``loss_mode``: > 0 for ``pmd`` (it divides by τ), ≥ 0 otherwise. The error names the
    loss's key, or ``algorithm.offpolicy.tau`` if the loss reads it from there (``interpolated``, the presets' form)."""
    if interpolated:
        key = f"{ALGO_PREFIX}.tau (read by loss_mode={loss_mode} as {LOSS_PREFIX}.tau)"
    else:
        key = f"{LOSS_PREFIX}.tau (loss_mode=pmd)" if loss_mode == "pmd" else f"{LOSS_PREFIX}.tau"
    check_number(key, tau, positive=loss_mode == "pmd", non_negative=loss_mode != "pmd")


# ---------------------------------------------------------------------- the view the startup rules read


class OffPolicyConfigError(ValueError):
    """An inconsistent verl-offpolicy configuration; the message says what to change."""


def select(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg``'s value at the dotted ``key`` (``default`` if absent)."""
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key, default=default)


def loss_section(cfg: Any) -> OffPolicyLossConfig | None:
    """The actor's policy-loss section as our typed config, or None if it is not ours."""
    from omegaconf import OmegaConf

    node = select(cfg, "actor_rollout_ref.actor.policy_loss")
    if node is None:
        return None
    values = OmegaConf.to_container(node, resolve=True)
    target = values.pop("_target_", "")
    if not target.endswith("OffPolicyLossConfig"):
        if values.get("loss_mode") in POLICY_LOSSES:
            raise OffPolicyConfigError(
                f"{LOSS_PREFIX}.loss_mode={values['loss_mode']} is a verl-offpolicy loss but {LOSS_PREFIX}._target_ "
                f"is {target!r}: set {LOSS_PREFIX}._target_=verl_offpolicy.glue.config.OffPolicyLossConfig "
                "or use a preset (+algorithm=<preset>)"
            )
        return None
    values.pop("rollout_correction", None)  # verl's own nested dataclass, validated by verl
    raw_tau = OmegaConf.to_container(node, resolve=False).get("tau")
    if raw_tau == TAU_INTERPOLATION:  # the presets' form: the user sets algorithm.offpolicy.tau, so name that key
        loss_mode = values.get("loss_mode", "vanilla")
        check_loss_tau(loss_mode, resolve_tau(values.get("tau"), loss_mode), interpolated=True)
    return OffPolicyLossConfig(**values)


@dataclass(frozen=True)
class ConfigView:
    """A whole composed config as the startup rules read it: the raw config and its typed sections.

    Every rule group (``RULES`` of :mod:`verl_offpolicy.glue.algorithms`, ...) is a tuple of functions
    ``rule(view) -> None`` that raise :class:`OffPolicyConfigError` (or the section's ``ValueError``).
    """

    cfg: Any
    offpolicy: OffPolicyConfig
    loss: OffPolicyLossConfig | None  # None: the policy loss is verl's own

    @classmethod
    def of(cls, cfg: Any) -> "ConfigView":
        """Build and validate the typed sections (``algorithm.offpolicy`` first, then the policy loss)."""
        offpolicy = offpolicy_section(select(cfg, "algorithm"))
        offpolicy.check_for_estimator(select(cfg, "algorithm.adv_estimator"))
        return cls(cfg, offpolicy, loss_section(cfg))

    def select(self, key: str, default: Any = None) -> Any:
        return select(self.cfg, key, default)

    @property
    def adv_estimator(self) -> str | None:
        return self.select("algorithm.adv_estimator")

    @property
    def trainer_mode(self) -> str | None:
        return self.select("trainer.v1.trainer_mode")

    @property
    def loss_mode(self) -> str | None:
        """The selected policy loss, ours or verl's."""
        return self.loss.loss_mode if self.loss is not None else self.select(f"{LOSS_PREFIX}.loss_mode")

    @property
    def bypass(self) -> bool:
        """verl's ``algorithm.rollout_correction.bypass_mode`` (the rollout log-probs in old_log_prob)."""
        return bool(self.select("algorithm.rollout_correction.bypass_mode", False))
