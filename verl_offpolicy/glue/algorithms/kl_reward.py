"""Rules shared by the estimators whose reward carries verl's KL penalty (``agro``, ``pairwise_opmd``).

Their R = r − coef·log(π/π_ref) is verl's KL-in-reward, computed from ``old_log_prob`` before the
advantage: it must be configured as such (:func:`check_kl_in_reward`), read the proximal log-prob
(:func:`check_proximal_kl_reward`), and, where the estimator's coefficients are exact only at the
weights that computed them, feed one optimizer update per batch (:func:`one_update_per_batch_fixes`).
"""

from __future__ import annotations

from typing import Any

from verl_offpolicy.glue.knobs import ALGO_PREFIX, OffPolicyConfigError
from verl_offpolicy.glue.scheduler.knobs import ROLLOUT

AGRO_KL_PENALTIES = ("kl", "k1")


def check_kl_in_reward(algorithm: Any, coef: float, estimator: str, coef_key: str) -> None:
    """``estimator``'s R = r − coef·log(π/π_ref) must be verl's KL-in-reward: kl_penalty=kl, fixed kl_coef = coef.

    ``algorithm`` is verl's algorithm section (DictConfig, dataclass or dict); only the keys it has
    are checked (the composed config has them all). Raises ``ValueError`` listing what to set.
    """
    fixes = []
    if algorithm.get("use_kl_in_reward", True) is False:
        fixes.append(
            f"algorithm.use_kl_in_reward=true ({estimator} needs a reference policy and R = r − "
            f"{coef_key}·log(π/π_ref))"
        )
    kl_penalty = algorithm.get("kl_penalty", "kl")
    if kl_penalty not in AGRO_KL_PENALTIES:
        fixes.append(f"algorithm.kl_penalty=kl (got {kl_penalty})")
    kl_ctrl = algorithm.get("kl_ctrl", None) or {}
    if kl_ctrl.get("type", "fixed") != "fixed":
        fixes.append(f"algorithm.kl_ctrl.type=fixed (got {kl_ctrl.get('type')})")
    kl_coef = kl_ctrl.get("kl_coef", coef)
    if kl_coef != coef:
        fixes.append(
            f"algorithm.kl_ctrl.kl_coef={coef} to equal {ALGO_PREFIX}.{coef_key} (got kl_coef={kl_coef}); "
            f"the presets interpolate kl_coef from {coef_key}"
        )
    if fixes:
        raise ValueError(f"adv_estimator={estimator} is inconsistent; set " + "; ".join(fixes))


def check_proximal_kl_reward(view, estimator: str, coef: str) -> None:
    """R = r − coef·log(π/π_ref) of ``estimator`` needs old_log_prob = the proximal log-prob (log π at the
    trained weights).

    verl's bypass mode (and ``ratio_anchor=rollout``, which needs it) writes the rollout log-probs into
    old_log_probs before the KL penalty, so R would use a stale log π.
    """
    bypass, anchor = view.bypass, view.offpolicy.ratio_anchor
    if bypass or anchor == ROLLOUT:
        raise OffPolicyConfigError(
            f"adv_estimator={estimator} computes its reward R = r − {coef}·log(π/π_ref) from old_log_prob, which "
            "must be "
            "the proximal log-prob (log π at the weights being trained), but algorithm.rollout_correction.bypass_mode="
            f"{str(bypass).lower()} and algorithm.offpolicy.ratio_anchor={anchor} put the rollout "
            "log-probs there: set algorithm.rollout_correction.bypass_mode=false and "
            "algorithm.offpolicy.ratio_anchor=proximal"
        )


def one_update_per_batch_fixes(view) -> list[str]:
    """What to set for exactly one optimizer update per batch: one epoch, one mini-batch (= data.train_batch_size)."""
    actor = "actor_rollout_ref.actor"
    fixes = []
    epochs = view.select(f"{actor}.ppo_epochs", 1)
    if epochs != 1:
        fixes.append(f"set {actor}.ppo_epochs=1 (got {epochs})")
    train_batch = view.select("data.train_batch_size")
    mini_batch = view.select(f"{actor}.ppo_mini_batch_size")
    if train_batch is not None and mini_batch is not None and mini_batch < train_batch:
        fixes.append(
            f"set {actor}.ppo_mini_batch_size={train_batch} (= data.train_batch_size; got {mini_batch}, i.e. "
            f"{train_batch / mini_batch:g} optimizer updates per batch)"
        )
    return fixes
