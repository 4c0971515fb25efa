"""Startup validation of a whole verl config that uses verl-offpolicy, on the driver.

:func:`validate_offpolicy_config` checks the typed sections (``algorithm.offpolicy``, the policy
loss) and the combinations no single section can see, each with a message that says what to
change. It runs

- as a Hydra callback (:class:`verl_offpolicy.glue.startup.StartupValidation`, installed by every
  preset and our primary configs) before ``verl.trainer.main_ppo`` starts Ray or any worker, and
- again in the scheduler trainer's constructor, for configs built without Hydra.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from verl_offpolicy.glue.config import (
    LOSS_PREFIX,
    OffPolicyLossConfig,
    check_agro_reward,
    check_clip_ratios,
    check_kl_in_reward,
    check_tau_coupling,
    clip_ratios,
    offpolicy_section,
)
from verl_offpolicy.glue.registration import ADV_ESTIMATORS, POLICY_LOSSES, TRAINERS, require_registration
from verl_offpolicy.glue.resolvers import MINI_BATCH_RESOLVER

SCHEDULER_TRAINER = "offpolicy"
# Engines whose forward_backward_batch carries m2po's whole-mini-batch pre-pass (glue/m2po.py).
M2PO_STRATEGIES = ("fsdp", "fsdp2")
# verl's own asynchronous trainers (threshold-bounded staleness, partial rollouts): see _check_verl_async.
VERL_ASYNC_TRAINERS = ("colocate_async", "separate_async")
SEQUENCE_LEVEL_AGG_MODES = ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


class OffPolicyConfigError(ValueError):
    """An inconsistent verl-offpolicy configuration; the message says what to change."""


def _select(cfg: DictConfig, key: str, default: Any = None) -> Any:
    return OmegaConf.select(cfg, key, default=default)


def _loss_config(cfg: DictConfig) -> OffPolicyLossConfig | None:
    """The actor's policy-loss section as our typed config, or None if it is not ours."""
    node = _select(cfg, "actor_rollout_ref.actor.policy_loss")
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
    return OffPolicyLossConfig(**values)


def validate_offpolicy_config(cfg: DictConfig) -> None:
    """Raise :class:`OffPolicyConfigError` (or the section's ``ValueError``) on the first problem found."""
    adv_estimator = _select(cfg, "algorithm.adv_estimator")
    trainer_mode = _select(cfg, "trainer.v1.trainer_mode")
    if adv_estimator in ADV_ESTIMATORS:
        require_registration("adv_estimator", adv_estimator)
    if trainer_mode in TRAINERS:
        require_registration("trainer", trainer_mode)

    offpolicy = offpolicy_section(_select(cfg, "algorithm"))
    offpolicy.check_for_estimator(adv_estimator)

    actor = "actor_rollout_ref.actor"
    loss = _loss_config(cfg)
    if loss is not None:
        check_clip_ratios(*clip_ratios(_select(cfg, actor)), loss)
        check_tau_coupling(offpolicy, adv_estimator, loss)
        agg = _select(cfg, f"{actor}.loss_agg_mode")
        gspo = loss.clip_mode == "gspo-one-side" or loss.weight == "gspo_importance_sampling"
        if loss.loss_mode == "rec" and gspo and agg not in SEQUENCE_LEVEL_AGG_MODES:
            raise OffPolicyConfigError(
                f"{LOSS_PREFIX}.clip_mode={loss.clip_mode}, weight={loss.weight} uses the sequence ratio ρ̄_i, so "
                f"{actor}.loss_agg_mode must be sequence-level ({', '.join(SEQUENCE_LEVEL_AGG_MODES)}), got {agg}; "
                f"set {actor}.loss_agg_mode=seq-mean-token-mean"
            )

        strategy = _select(cfg, f"{actor}.strategy", "fsdp")
        if loss.loss_mode == "m2po" and strategy not in M2PO_STRATEGIES:
            raise OffPolicyConfigError(
                f"{LOSS_PREFIX}.loss_mode=m2po chooses its mask over the whole mini-batch with a pre-pass of verl's "
                f"FSDP engine, which {actor}.strategy={strategy} does not run: set {actor}.strategy to one of "
                f"{', '.join(M2PO_STRATEGIES)} or choose another loss"
            )

    if adv_estimator == "agro":
        check_agro_reward(_select(cfg, "algorithm"), offpolicy.beta)
        _check_proximal_kl_reward(cfg, offpolicy, "agro", "β")
        if offpolicy.on_policy:
            _check_agro_onpolicy_data(cfg, offpolicy)

    _check_pairwise_opmd(cfg, offpolicy, adv_estimator, loss)
    _check_rollout_correction(cfg, offpolicy, adv_estimator, loss)
    _check_preset_mini_batch(cfg)
    _check_scheduler(cfg, offpolicy, trainer_mode)


PAIRWISE_OPMD = "pairwise_opmd"
ROLLOUT_CORRECTION = "algorithm.rollout_correction"


def _check_rollout_correction(cfg: DictConfig, offpolicy, adv_estimator: str | None, loss: OffPolicyLossConfig | None) -> None:
    """Which of verl's ``algorithm.rollout_correction`` settings combine with our anchors, losses and estimators.

    verl 0.9.1's v1 trainer computes the IS weights (TIS, IcePop/MIS: ``rollout_is``) and rejection masks
    (``rollout_rs``, e.g. Geo-RS) only in decoupled mode (bypass_mode=false), from π_old/π_rollout with π_old
    the proximal log-prob, and only when the batch has the rollout log-probs; our losses multiply their
    per-token loss by the weights. In bypass mode it only puts the rollout log-probs in old_log_prob (the
    legacy trainer also swaps the loss for its own ``bypass_mode`` loss). Rejected, naming both keys: a
    setting verl would silently skip, a correction applied twice (the IS weight π_prox/π_rollout already
    covers the gap that a rollout anchor, or a behaviour anchor on stale batches, puts in the loss's
    ratio), and any reweighting of pairwise_opmd (its exact group gradient has no per-sample weight).
    """
    rollout_is = _select(cfg, f"{ROLLOUT_CORRECTION}.rollout_is")
    rollout_rs = _select(cfg, f"{ROLLOUT_CORRECTION}.rollout_rs")
    bypass = bool(_select(cfg, f"{ROLLOUT_CORRECTION}.bypass_mode", False))
    ours = loss is not None and loss.loss_mode in POLICY_LOSSES
    loss_mode = loss.loss_mode if loss is not None else _select(cfg, f"{LOSS_PREFIX}.loss_mode")
    corrections = [f"{ROLLOUT_CORRECTION}.{key}={value}" for key, value in (("rollout_is", rollout_is), ("rollout_rs", rollout_rs)) if value is not None]
    if corrections and not _select(cfg, "actor_rollout_ref.rollout.calculate_log_probs", False):
        raise OffPolicyConfigError(
            f"{' and '.join(corrections)} need the inference engine's log-probs, but "
            "actor_rollout_ref.rollout.calculate_log_probs=false (verl would skip the correction silently): "
            "set actor_rollout_ref.rollout.calculate_log_probs=true"
        )
    if bypass and ours:
        if not _select(cfg, "trainer.use_v1", False):
            raise OffPolicyConfigError(
                f"{ROLLOUT_CORRECTION}.bypass_mode=true with trainer.use_v1=false replaces {LOSS_PREFIX}.loss_mode="
                f"{loss_mode} by verl's own bypass_mode loss: set trainer.use_v1=true or bypass_mode=false"
            )
        if corrections:
            raise OffPolicyConfigError(
                f"{ROLLOUT_CORRECTION}.bypass_mode=true with {' and '.join(corrections)}: verl computes these only in "
                f"decoupled mode or inside its own bypass_mode loss, so {LOSS_PREFIX}.loss_mode={loss_mode} would train "
                f"without them; set {ROLLOUT_CORRECTION}.bypass_mode=false (decoupled) or remove the correction"
            )
        loss_type = _select(cfg, f"{ROLLOUT_CORRECTION}.loss_type", "ppo_clip")
        if loss_type != "ppo_clip":
            raise OffPolicyConfigError(
                f"{ROLLOUT_CORRECTION}.loss_type={loss_type} selects verl's bypass_mode loss, which "
                f"{LOSS_PREFIX}.loss_mode={loss_mode} replaces: remove it (leave ppo_clip) or use verl's loss"
            )
    if adv_estimator == PAIRWISE_OPMD and corrections:
        raise OffPolicyConfigError(
            f"algorithm.adv_estimator={PAIRWISE_OPMD} with {' and '.join(corrections)}: the pairwise gradient is exact "
            "for any data without a per-sample weight or rejection (fully off-policy); remove the correction"
        )
    if bypass or rollout_is is None:
        return
    stale = offpolicy.sync_interval != 1 or offpolicy.sync_offset != 0
    if offpolicy.ratio_anchor == "rollout" or (offpolicy.ratio_anchor == "behaviour" and stale):
        where = "the rollout log-probs" if offpolicy.ratio_anchor == "rollout" else "the behaviour log-probs of stale batches"
        raise OffPolicyConfigError(
            f"{ROLLOUT_CORRECTION}.rollout_is={rollout_is} weights by π_proximal/π_rollout, and "
            f"algorithm.offpolicy.ratio_anchor={offpolicy.ratio_anchor} measures the loss's ratio against {where}: the "
            "gap between the two policies would be corrected twice. Set algorithm.offpolicy.ratio_anchor=proximal "
            f"(verl's decoupled three-policy form) or {ROLLOUT_CORRECTION}.rollout_is=null"
        )


def _check_pairwise_opmd(cfg: DictConfig, offpolicy, adv_estimator: str | None, loss: OffPolicyLossConfig | None) -> None:
    """pairwise_opmd's estimator and loss only make sense together, with exact group coefficients.

    The estimator's A_i = 2Kτ(a_i − ā)/(1+τ)² is the gradient coefficient of Σ_{i<j}(a_i − a_j)² at the
    proximal weights, where verl's KL-in-reward computes a_i: exact for one optimizer update per batch
    (one mini-batch, one epoch); later updates of the same batch would use coefficients of older weights.
    """
    loss_mode = loss.loss_mode if loss is not None else _select(cfg, f"{LOSS_PREFIX}.loss_mode")
    if (adv_estimator == PAIRWISE_OPMD) != (loss_mode == PAIRWISE_OPMD):
        raise OffPolicyConfigError(
            f"algorithm.adv_estimator={adv_estimator} and {LOSS_PREFIX}.loss_mode={loss_mode}: pairwise OPMD needs "
            f"both set to {PAIRWISE_OPMD} (the loss's gradient identity uses the estimator's group coefficients)"
        )
    if adv_estimator != PAIRWISE_OPMD:
        return
    check_kl_in_reward(_select(cfg, "algorithm"), offpolicy.tau_for(PAIRWISE_OPMD), PAIRWISE_OPMD, "tau")
    _check_proximal_kl_reward(cfg, offpolicy, PAIRWISE_OPMD, "τ")
    fixes = _one_update_per_batch_fixes(cfg)
    if fixes:
        raise OffPolicyConfigError(
            f"adv_estimator={PAIRWISE_OPMD} computes each group's coefficients once per batch, at the weights of its "
            "first optimizer update; later updates would follow stale coefficients: " + "; ".join(fixes)
        )


def _one_update_per_batch_fixes(cfg: DictConfig) -> list[str]:
    """What to set for exactly one optimizer update per batch: one epoch, one mini-batch (= data.train_batch_size)."""
    actor = "actor_rollout_ref.actor"
    fixes = []
    epochs = _select(cfg, f"{actor}.ppo_epochs", 1)
    if epochs != 1:
        fixes.append(f"set {actor}.ppo_epochs=1 (got {epochs})")
    train_batch = _select(cfg, "data.train_batch_size")
    mini_batch = _select(cfg, f"{actor}.ppo_mini_batch_size")
    if train_batch is not None and mini_batch is not None and mini_batch < train_batch:
        fixes.append(
            f"set {actor}.ppo_mini_batch_size={train_batch} (= data.train_batch_size; got {mini_batch}, i.e. "
            f"{train_batch / mini_batch:g} optimizer updates per batch)"
        )
    return fixes


def _check_preset_mini_batch(cfg: DictConfig) -> None:
    """A mini-batch from the presets' resolver (PMD: ≥ 16 updates per batch) must split into verl's micro-batches.

    verl asserts at the first update that each update's responses (ppo_mini_batch_size × rollout.n)
    divide by the data-parallel size and, per rank, by ppo_micro_batch_size_per_gpu (FSDP, no dynamic
    batch size). Only checked when the mini-batch size is the preset's (a size set explicitly is the user's).
    """
    actor = "actor_rollout_ref.actor"
    node = _select(cfg, actor)
    if node is None:
        return
    raw = OmegaConf.to_container(node, resolve=False).get("ppo_mini_batch_size")
    if not (isinstance(raw, str) and MINI_BATCH_RESOLVER in raw) or _select(cfg, f"{actor}.use_dynamic_bsz", False):
        return
    if _select(cfg, f"{actor}.strategy", "fsdp") not in ("fsdp", "fsdp2"):
        return
    mini = _select(cfg, f"{actor}.ppo_mini_batch_size")
    n = _select(cfg, "actor_rollout_ref.rollout.n", 1)
    gpus = _select(cfg, "trainer.nnodes", 1) * _select(cfg, "trainer.n_gpus_per_node", 1)
    ranks = max(1, gpus // (_select(cfg, f"{actor}.ulysses_sequence_parallel_size", 1) or 1))
    micro = _select(cfg, f"{actor}.ppo_micro_batch_size_per_gpu")
    responses = mini * n
    if responses % ranks == 0 and (not micro or (responses // ranks) % micro == 0):
        return
    raise OffPolicyConfigError(
        f"{actor}.ppo_mini_batch_size={mini} (the preset's split of data.train_batch_size="
        f"{_select(cfg, 'data.train_batch_size')} into several optimizer updates) × actor_rollout_ref.rollout.n={n} = "
        f"{responses} responses per update do not split into {ranks} data-parallel rank(s) × "
        f"{actor}.ppo_micro_batch_size_per_gpu={micro}: set {actor}.ppo_micro_batch_size_per_gpu to a divisor of "
        f"{responses // ranks if responses % ranks == 0 else 'the responses per rank'}, set {actor}.ppo_mini_batch_size "
        f"explicitly, or set {actor}.use_dynamic_bsz=true"
    )


def _check_proximal_kl_reward(cfg: DictConfig, offpolicy, estimator: str, coef: str) -> None:
    """R = r − coef·log(π/π_ref) of ``estimator`` needs old_log_prob = the proximal log-prob (log π at the trained weights).

    verl's bypass mode (and ``ratio_anchor=rollout``, which needs it) writes the rollout log-probs into
    old_log_probs before the KL penalty, so R would use a stale log π.
    """
    bypass = bool(_select(cfg, "algorithm.rollout_correction.bypass_mode", False))
    if bypass or offpolicy.ratio_anchor == "rollout":
        raise OffPolicyConfigError(
            f"adv_estimator={estimator} computes its reward R = r − {coef}·log(π/π_ref) from old_log_prob, which must be "
            "the proximal log-prob (log π at the weights being trained), but algorithm.rollout_correction.bypass_mode="
            f"{str(bypass).lower()} and algorithm.offpolicy.ratio_anchor={offpolicy.ratio_anchor} put the rollout "
            "log-probs there: set algorithm.rollout_correction.bypass_mode=false and "
            "algorithm.offpolicy.ratio_anchor=proximal"
        )


def _check_agro_onpolicy_data(cfg: DictConfig, offpolicy) -> None:
    """On-policy AGRO's likelihood-ratio term is unbiased only on fresh samples of the policy being updated.

    Every optimizer update must see responses generated by the weights it starts from: no staleness
    (sync_interval = 1, sync_offset = 0), the proximal anchor, one mini-batch (verl splits
    data.train_batch_size prompts into mini-batches of actor.ppo_mini_batch_size prompts) and one epoch;
    and K ≥ 2 responses per prompt for the leave-one-out baseline.
    """
    fixes = []
    if offpolicy.sync_interval != 1:
        fixes.append(f"set algorithm.offpolicy.sync_interval=1 (got {offpolicy.sync_interval})")
    if offpolicy.sync_offset != 0:
        fixes.append(f"set algorithm.offpolicy.sync_offset=0 (got {offpolicy.sync_offset})")
    if offpolicy.ratio_anchor != "proximal":
        fixes.append(f"set algorithm.offpolicy.ratio_anchor=proximal (got {offpolicy.ratio_anchor})")
    fixes += _one_update_per_batch_fixes(cfg)
    n = _select(cfg, "actor_rollout_ref.rollout.n", 1)
    if n < 2:
        fixes.append(f"set actor_rollout_ref.rollout.n >= 2 (got {n}; the baseline needs other responses)")
    if fixes:
        raise OffPolicyConfigError(
            "on-policy AGRO (algorithm.offpolicy.on_policy=true) needs fresh on-policy samples at every update "
            "(its variance term is unbiased only then): " + "; ".join(fixes) + ", or use the off-policy form "
            "(algorithm.offpolicy.on_policy=false, preset agro)"
        )


def _check_verl_async(cfg: DictConfig, offpolicy, trainer_mode: str) -> None:
    """What a preset can keep under verl's ``colocate_async``/``separate_async`` trainers.

    Their staleness is bounded by a threshold, not scheduled, and a sync aborts in-flight requests and
    resumes them under the new weights, so one response can span two versions: no single set of
    generating weights exists to compute a ``behaviour`` anchor at. The token-level behaviour log-probs
    are the rollout's own (``ratio_anchor=rollout``, which verl provides as ``rollout_correction.bypass_mode``).
    """
    prefix = f"trainer.v1.trainer_mode={trainer_mode} (verl's asynchronous trainer)"
    if offpolicy.sync_interval != 1 or offpolicy.sync_offset != 0:
        raise OffPolicyConfigError(
            f"{prefix} bounds staleness by trainer.v1.sampler.max_off_policy_threshold and cannot follow "
            f"algorithm.offpolicy.sync_interval={offpolicy.sync_interval}, sync_offset={offpolicy.sync_offset}: set "
            f"sync_interval=1 sync_offset=0, or trainer.v1.trainer_mode={SCHEDULER_TRAINER} for a scheduled staleness"
        )
    if offpolicy.ratio_anchor == "behaviour":
        raise OffPolicyConfigError(
            f"{prefix} cannot provide algorithm.offpolicy.ratio_anchor=behaviour: partial rollouts are resumed under "
            "new weights, so a response has no single generating version to recompute log-probs at; set "
            "ratio_anchor=rollout with algorithm.rollout_correction.bypass_mode=true (the rollout's own log-probs, "
            "token by token) or ratio_anchor=proximal"
        )
    bypass = bool(_select(cfg, "algorithm.rollout_correction.bypass_mode", False))
    if (offpolicy.ratio_anchor == "rollout") != bypass:
        raise OffPolicyConfigError(
            f"{prefix} puts the rollout log-probs into old_log_prob exactly when "
            f"algorithm.rollout_correction.bypass_mode=true: set ratio_anchor=rollout together with bypass_mode=true, "
            f"or proximal with bypass_mode=false (got ratio_anchor={offpolicy.ratio_anchor}, bypass_mode={bypass})"
        )
    if offpolicy.on_policy:
        raise OffPolicyConfigError(
            f"{prefix} trains on responses of earlier weights (and partial rollouts), but "
            "algorithm.offpolicy.on_policy=true (on-policy AGRO) needs fresh samples at every update; use preset agro "
            "(off-policy form) or trainer.v1.trainer_mode=offpolicy"
        )


def _check_overlapped(cfg: DictConfig, offpolicy) -> None:
    """The scheduler's overlapped mode (``hybrid_engine=false``): a rollout pool, a weight transport, an anchor."""
    rollout = "actor_rollout_ref.rollout"
    prefix = f"trainer.v1.trainer_mode={SCHEDULER_TRAINER} with actor_rollout_ref.hybrid_engine=false (overlapped mode)"
    for key in ("nnodes", "n_gpus_per_node"):
        value = _select(cfg, f"{rollout}.{key}", 0)
        if not isinstance(value, int) or value < 1:
            raise OffPolicyConfigError(f"{prefix} runs the rollout on a pool of its own: set {rollout}.{key} >= 1 (got {value})")
    backend = _select(cfg, f"{rollout}.checkpoint_engine.backend")
    if backend == "naive":
        raise OffPolicyConfigError(
            f"{prefix} pushes weights to the rollout pool through a checkpoint engine, and naive only serves a "
            f"colocated rollout: set {rollout}.checkpoint_engine.backend to verl's nccl/nixl/... on GPUs, or "
            f"cpu_mailbox on the CPU path (+cpu_rollout=standalone)"
        )
    if offpolicy.ratio_anchor == "behaviour":
        raise OffPolicyConfigError(
            f"{prefix} cannot provide algorithm.offpolicy.ratio_anchor=behaviour: when a batch arrives the trainer "
            "has already moved past the weights that generated it; set ratio_anchor=rollout (each batch is generated "
            "entirely at one version here, so the rollout's log-probs are the behaviour policy's) or proximal"
        )


def _check_scheduler(cfg: DictConfig, offpolicy, trainer_mode: str | None) -> None:
    """Staleness control and non-proximal ratio anchors are provided by the ``offpolicy`` trainer."""
    if bool(_select(cfg, "trainer.use_v1", False)) and trainer_mode in VERL_ASYNC_TRAINERS:
        _check_verl_async(cfg, offpolicy, trainer_mode)
        return
    needs_scheduler = (
        offpolicy.sync_interval != 1 or offpolicy.sync_offset != 0 or offpolicy.ratio_anchor != "proximal"
    )
    uses_scheduler = bool(_select(cfg, "trainer.use_v1", False)) and trainer_mode == SCHEDULER_TRAINER
    if needs_scheduler and not uses_scheduler:
        raise OffPolicyConfigError(
            f"algorithm.offpolicy.sync_interval={offpolicy.sync_interval}, sync_offset={offpolicy.sync_offset}, "
            f"ratio_anchor={offpolicy.ratio_anchor} need verl-offpolicy's scheduler: set trainer.use_v1=true and "
            f"trainer.v1.trainer_mode={SCHEDULER_TRAINER} (got use_v1={_select(cfg, 'trainer.use_v1')}, "
            f"trainer_mode={trainer_mode})"
        )
    if not uses_scheduler:
        return
    if not _select(cfg, "actor_rollout_ref.hybrid_engine", True):
        _check_overlapped(cfg, offpolicy)
    unsupported = {
        "algorithm.filter_groups.enable": "DAPO group filtering refills groups, which would break the per-version batches",
        "skip.rollout_tq.enable": "rollout skipping replays dumped rollouts instead of the scheduled generation",
    }
    for key, why in unsupported.items():
        if _select(cfg, key, False):
            raise OffPolicyConfigError(
                f"{key}=true is not supported with trainer.v1.trainer_mode={SCHEDULER_TRAINER} ({why}); set {key}=false"
            )
    if _select(cfg, "trainer.v1.sampler.custom_sampler.path"):
        raise OffPolicyConfigError(
            f"trainer.v1.sampler.custom_sampler is set, but trainer.v1.trainer_mode={SCHEDULER_TRAINER} uses its own "
            "sampler (the staleness FIFO); remove trainer.v1.sampler.custom_sampler.path/name"
        )
    if _select(cfg, "algorithm.rollout_correction.bypass_mode", False) and offpolicy.ratio_anchor != "rollout":
        raise OffPolicyConfigError(
            "algorithm.rollout_correction.bypass_mode=true already sets old_log_prob to the rollout log-probs; "
            f"set algorithm.offpolicy.ratio_anchor=rollout or bypass_mode=false (got ratio_anchor={offpolicy.ratio_anchor})"
        )
    if offpolicy.ratio_anchor == "rollout" and not _select(cfg, "actor_rollout_ref.rollout.calculate_log_probs", False):
        raise OffPolicyConfigError(
            "algorithm.offpolicy.ratio_anchor=rollout needs the inference engine's log-probs: "
            "set actor_rollout_ref.rollout.calculate_log_probs=true (or choose ratio_anchor=behaviour|proximal)"
        )
