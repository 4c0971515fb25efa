"""REC (``loss_mode=rec``, docs/algo/rec.md): its knobs, its loss adapter and the clip-ratio rules.

ε_low/ε_high are the actor's (``clip_ratio_low``/``clip_ratio_high``, falling back to ``clip_ratio``,
:func:`clip_ratios`); ``ring`` needs ε′ ≥ ε, and the sequence-ratio modes (``gspo-one-side``,
``gspo_importance_sampling``) need a sequence-level ``loss_agg_mode``.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor
from verl.trainer.ppo.core_algos import register_policy_loss

from verl_offpolicy.core import losses as core
from verl_offpolicy.glue.algorithms.adapters import aggregate, as_metrics, check_dtype, our_loss_config
from verl_offpolicy.glue.family import Family, LossExample
from verl_offpolicy.glue.knobs import LOSS_PREFIX, Knob, OffPolicyConfigError, check_number, non_negative

REC = "rec"
CLIP_MODES = ("none", "one-side", "two-side", "ring", "gspo-one-side")
WEIGHTS = ("none", "importance_sampling", "gspo_importance_sampling")
REGULARIZERS = ("none", "forward-kl", "k2", "k2_seq")

LOSS_KNOBS = (
    Knob("clip_mode", "none", "rec token mask: " + " | ".join(CLIP_MODES) + ".", choices=CLIP_MODES),
    Knob(
        "weight",
        "none",
        "rec token weight: none | importance_sampling (ρ_t) | gspo_importance_sampling (ρ̄_i).",
        choices=WEIGHTS,
    ),
    Knob(
        "regularizer",
        "none",
        "rec regulariser: none | forward-kl (−c·log π) | k2 (token-level c·(log π_t − log π_old,t)², as Trinity-RFT) "
        "| k2_seq (sequence-level c·(Σ_t (log π_t − log π_old,t))²/|y| per response; the 1/|y| is OpenKimi's "
        "normalisation).",
        choices=REGULARIZERS,
    ),
    Knob("regularizer_coef", 0.0, "Coefficient c ≥ 0 of the regulariser.", check=non_negative),
    Knob("ring_clip_ratio_low", 0.6, "ring ε′_low (must be ≥ the actor's clip_ratio_low).", check=non_negative),
    Knob("ring_clip_ratio_high", 2.0, "ring ε′_high (must be ≥ the actor's clip_ratio_high).", check=non_negative),
)
SEQUENCE_LEVEL_AGG_MODES = ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
ACTOR = "actor_rollout_ref.actor"

# ---------------------------------------------------------------------- rules


def clip_ratios(actor: Any) -> tuple[float, float]:
    """(ε_low, ε_high) of an actor config (verl's ``ActorConfig`` or its DictConfig section):
    ``clip_ratio_low`` / ``clip_ratio_high``, each falling back to ``clip_ratio`` when null."""
    clip_ratio = getattr(actor, "clip_ratio", None)
    low, high = getattr(actor, "clip_ratio_low", None), getattr(actor, "clip_ratio_high", None)
    return (clip_ratio if low is None else low), (clip_ratio if high is None else high)


def check_clip_ratios(clip_ratio_low: float, clip_ratio_high: float, loss_config: Any) -> None:
    """Checks that need the actor's ε: non-negative ε, and ring ε′ ≥ ε."""
    check_number("actor_rollout_ref.actor.clip_ratio_low", clip_ratio_low, non_negative=True)
    check_number("actor_rollout_ref.actor.clip_ratio_high", clip_ratio_high, non_negative=True)
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


def check_actor_clip_ratios(view) -> None:
    """:func:`check_clip_ratios` on the composed config, for every loss of ours (ε ≥ 0; ring ε′ ≥ ε)."""
    if view.loss is not None:
        check_clip_ratios(*clip_ratios(view.select(ACTOR)), view.loss)


def check_sequence_ratio_aggregation(view) -> None:
    """REC with the sequence ratio ρ̄_i (gspo-one-side, gspo_importance_sampling) aggregates per sequence."""
    loss = view.loss
    if loss is None or loss.loss_mode != REC:
        return
    agg = view.select(f"{ACTOR}.loss_agg_mode")
    gspo = loss.clip_mode == "gspo-one-side" or loss.weight == "gspo_importance_sampling"
    if gspo and agg not in SEQUENCE_LEVEL_AGG_MODES:
        raise OffPolicyConfigError(
            f"{LOSS_PREFIX}.clip_mode={loss.clip_mode}, weight={loss.weight} uses the sequence ratio ρ̄_i, so "
            f"{ACTOR}.loss_agg_mode must be sequence-level ({', '.join(SEQUENCE_LEVEL_AGG_MODES)}), got {agg}; "
            f"set {ACTOR}.loss_agg_mode=seq-mean-token-mean"
        )


# ---------------------------------------------------------------------- loss


@register_policy_loss("rec")
def compute_policy_loss_rec(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """ℓ_t = −M_t·w_t·A·log π_t + reg_t (``policy_loss.clip_mode``, ``weight``, ``regularizer``)."""
    loss_config = our_loss_config("rec", config)
    check_dtype("rec", log_prob)
    clip_low, clip_high = clip_ratios(config)  # checked at startup (check_actor_clip_ratios)
    mask = response_mask.bool()
    terms = core.rec_loss(
        log_prob,
        old_log_prob,
        advantages,
        mask,
        clip_mode=loss_config.clip_mode,
        weight=loss_config.weight,
        regularizer=loss_config.regularizer,
        regularizer_coef=loss_config.regularizer_coef,
        clip_ratio_low=clip_low,
        clip_ratio_high=clip_high,
        ring_clip_ratio_low=loss_config.ring_clip_ratio_low,
        ring_clip_ratio_high=loss_config.ring_clip_ratio_high,
    )
    loss = aggregate(terms.loss, mask, loss_agg_mode, config, rollout_is_weights)
    metrics = core.ratio_metrics(terms.log_ratio, terms.ratio, mask, terms.keep, terms.band_ratio)
    return loss, as_metrics(metrics, FAMILY.loss_fraction_metric(REC))


FAMILY = Family(
    REC,
    loss_knobs=LOSS_KNOBS,
    first_rules=(check_actor_clip_ratios,),  # ε of the actor, for every loss of ours (any may set clip_mode)
    loss_rules=(check_sequence_ratio_aggregation,),
    loss_fractions={REC: "clipped"},
    losses={
        REC: (
            LossExample(
                {
                    "clip_mode": "one-side",
                    "weight": "importance_sampling",
                    "regularizer": "k2",
                    "regularizer_coef": 0.1,
                },
                {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2},
                label="one-side-is-k2",
            ),
            LossExample(
                {"clip_mode": "gspo-one-side", "weight": "gspo_importance_sampling"},
                {"clip_ratio_low": 0.05, "clip_ratio_high": 0.05, "loss_agg_mode": "seq-mean-token-mean"},
                label="gspo-is",
            ),
            LossExample({"clip_mode": "two-side"}, label="two-side"),
            LossExample(
                {
                    "clip_mode": "ring",
                    "ring_clip_ratio_low": 0.5,
                    "ring_clip_ratio_high": 1.5,
                    "regularizer": "forward-kl",
                    "regularizer_coef": 0.05,
                },
                label="ring-forward-kl",
            ),
            LossExample(actor={"loss_agg_mode": "seq-mean-token-sum"}, label="none-seq-sum"),
        )
    },
)
