"""The scheduler part's startup rules: the staleness scheduler, verl's rollout correction, verl's async modes.

``RULES`` is this part's rule group, in the order :func:`verl_offpolicy.glue.validation.validate_offpolicy_config`
runs it; each rule reads a :class:`~verl_offpolicy.glue.config.ConfigView` and raises
:class:`~verl_offpolicy.glue.config.OffPolicyConfigError` naming the keys to change. The trainer
(:mod:`.trainer`) is what these rules protect; this module imports no trainer, so the startup
validation stays cheap.
"""

from __future__ import annotations

import logging

from verl_offpolicy.core.schedule import Schedule
from verl_offpolicy.glue.config import LOSS_PREFIX, ConfigView, OffPolicyConfigError
from verl_offpolicy.glue.registration import POLICY_LOSSES, SCHEDULER_MODES, VERL_ASYNC_TRAINERS, scheduler_trainer
from verl_offpolicy.glue.scheduler.correction import check_rollout_correction_values
from verl_offpolicy.glue.scheduler.deadline import GenerationDeadline
from verl_offpolicy.glue.scheduler.knobs import BEHAVIOUR, ROLLOUT

ROLLOUT_CORRECTION = "algorithm.rollout_correction"
logger = logging.getLogger("verl_offpolicy")


def check_rollout_correction(view: ConfigView) -> None:
    """Which of verl's ``algorithm.rollout_correction`` settings combine with our anchors, losses and estimators.

    verl 0.9.1's v1 trainer computes the IS weights (TIS, IcePop/MIS: ``rollout_is``) and rejection masks
    (``rollout_rs``, e.g. Geo-RS) only in decoupled mode (bypass_mode=false), and only when the batch has the
    rollout log-probs; our losses multiply their per-token loss by the weights. The pair they compare depends
    on the anchor (:mod:`.correction`: π_behaviour/π_rollout on a stale batch under ``behaviour``, else
    π_proximal/π_rollout). In bypass mode verl only puts the rollout log-probs in old_log_prob (the legacy
    trainer also swaps the loss for its own ``bypass_mode`` loss). Rejected, naming both keys: a setting verl
    would silently skip, an IS weight against π_rollout on a loss whose ratio is already against π_rollout
    (``ratio_anchor=rollout``: corrected twice). (pairwise_opmd refuses any reweighting itself:
    :func:`verl_offpolicy.glue.algorithms.opmd.check_pairwise_opmd_correction`.)
    """
    offpolicy, loss = view.offpolicy, view.loss
    rollout_is = view.select(f"{ROLLOUT_CORRECTION}.rollout_is")
    rollout_rs = view.select(f"{ROLLOUT_CORRECTION}.rollout_rs")
    bypass = view.bypass
    ours = loss is not None and loss.loss_mode in POLICY_LOSSES
    loss_mode = view.loss_mode
    corrections = [
        f"{ROLLOUT_CORRECTION}.{key}={value}"
        for key, value in (("rollout_is", rollout_is), ("rollout_rs", rollout_rs))
        if value is not None
    ]
    if corrections and not view.select("actor_rollout_ref.rollout.calculate_log_probs", False):
        raise OffPolicyConfigError(
            f"{' and '.join(corrections)} need the inference engine's log-probs, but "
            "actor_rollout_ref.rollout.calculate_log_probs=false (verl would skip the correction silently): "
            "set actor_rollout_ref.rollout.calculate_log_probs=true"
        )
    if bypass and ours:
        if not view.select("trainer.use_v1", False):
            raise OffPolicyConfigError(
                f"{ROLLOUT_CORRECTION}.bypass_mode=true with trainer.use_v1=false replaces {LOSS_PREFIX}.loss_mode="
                f"{loss_mode} by verl's own bypass_mode loss: set trainer.use_v1=true or bypass_mode=false"
            )
        if corrections:
            raise OffPolicyConfigError(
                f"{ROLLOUT_CORRECTION}.bypass_mode=true with {' and '.join(corrections)}: verl computes these only in "
                f"decoupled mode or inside its own bypass_mode loss, so {LOSS_PREFIX}.loss_mode={loss_mode} "
                "would train "
                f"without them; set {ROLLOUT_CORRECTION}.bypass_mode=false (decoupled) or remove the correction"
            )
        loss_type = view.select(f"{ROLLOUT_CORRECTION}.loss_type", "ppo_clip")
        if loss_type != "ppo_clip":
            raise OffPolicyConfigError(
                f"{ROLLOUT_CORRECTION}.loss_type={loss_type} selects verl's bypass_mode loss, which "
                f"{LOSS_PREFIX}.loss_mode={loss_mode} replaces: remove it (leave ppo_clip) or use verl's loss"
            )
    if bypass or rollout_is is None:
        return
    if offpolicy.ratio_anchor == ROLLOUT:
        raise OffPolicyConfigError(
            f"{ROLLOUT_CORRECTION}.rollout_is={rollout_is} weights by π_proximal/π_rollout, and "
            "algorithm.offpolicy.ratio_anchor=rollout already measures the loss's ratio against the rollout log-probs: "
            "the gap to π_rollout would be corrected twice. Set algorithm.offpolicy.ratio_anchor=behaviour (the weight "
            "is then π_behaviour/π_rollout, the engines' mismatch) or proximal (verl's decoupled three-policy form), "
            f"or {ROLLOUT_CORRECTION}.rollout_is=null"
        )


def check_trainer_mode(view: ConfigView) -> None:
    """``trainer.v1.trainer_mode`` names a trainer of verl's registry (verl's ``sync``, ``colocate_async``,
    ``separate_async``, our ``offpolicy``, or one a plugin registered); verl looks it up only in its
    ``TaskRunner``, after Ray and TransferQueue started."""
    if not view.select("trainer.use_v1", False):
        return
    import verl.trainer.ppo.v1  # noqa: F401 - importing it registers verl's own trainers
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

    mode = view.trainer_mode
    if mode not in TRAINER_REGISTRY:
        raise OffPolicyConfigError(
            f"trainer.v1.trainer_mode={mode!r} is not a registered trainer; allowed values: "
            f"{', '.join(sorted(TRAINER_REGISTRY))} (or trainer.use_v1=false for verl's legacy trainer)"
        )


def check_verl_async_modes(view: ConfigView) -> None:
    """What a preset can keep under verl's ``colocate_async``/``separate_async`` trainers.

    Their staleness is bounded by a threshold, not scheduled, and a sync aborts in-flight requests and
    resumes them under the new weights, so one response can span two versions: no single set of
    generating weights exists to compute a ``behaviour`` anchor at. The token-level behaviour log-probs
    are the rollout's own (``ratio_anchor=rollout``, which verl provides as ``rollout_correction.bypass_mode``).
    """
    trainer_mode = view.trainer_mode
    if not (view.select("trainer.use_v1", False) and trainer_mode in VERL_ASYNC_TRAINERS):
        return
    offpolicy = view.offpolicy
    prefix = f"trainer.v1.trainer_mode={trainer_mode} (verl's asynchronous trainer)"
    if offpolicy.schedule.is_stale:
        raise OffPolicyConfigError(
            f"{prefix} bounds staleness by trainer.v1.sampler.max_off_policy_threshold and cannot follow "
            f"algorithm.offpolicy.sync_interval={offpolicy.sync_interval}, sync_offset={offpolicy.sync_offset}: set "
            "sync_interval=1 sync_offset=0, or "
            f"trainer.v1.trainer_mode={scheduler_trainer(view.select('actor_rollout_ref.hybrid_engine', True))} "
            "for a scheduled "
            "staleness"
        )
    if offpolicy.ratio_anchor == BEHAVIOUR:
        raise OffPolicyConfigError(
            f"{prefix} cannot provide algorithm.offpolicy.ratio_anchor=behaviour: partial rollouts are resumed under "
            "new weights, so a response has no single generating version to recompute log-probs at; set "
            "ratio_anchor=rollout with algorithm.rollout_correction.bypass_mode=true (the rollout's own log-probs, "
            "token by token) or ratio_anchor=proximal"
        )
    bypass = view.bypass
    if (offpolicy.ratio_anchor == ROLLOUT) != bypass:
        raise OffPolicyConfigError(
            f"{prefix} puts the rollout log-probs into old_log_prob exactly when "
            f"algorithm.rollout_correction.bypass_mode=true: set ratio_anchor=rollout together with bypass_mode=true, "
            f"or proximal with bypass_mode=false (got ratio_anchor={offpolicy.ratio_anchor}, bypass_mode={bypass})"
        )


def check_rollout_pool(view: ConfigView, prefix: str) -> str:
    """A rollout on a pool of its own (``prefix`` names the mode): a pool of size >= 1 and a checkpoint engine that
    can push weights to it (not ``naive``). Returns the backend."""
    rollout = "actor_rollout_ref.rollout"
    for key in ("nnodes", "n_gpus_per_node"):
        value = view.select(f"{rollout}.{key}", 0)
        if not isinstance(value, int) or value < 1:
            raise OffPolicyConfigError(
                f"{prefix} runs the rollout on a pool of its own: set {rollout}.{key} >= 1 (got {value})"
            )
    backend = view.select(f"{rollout}.checkpoint_engine.backend")
    if backend == "naive":
        raise OffPolicyConfigError(
            f"{prefix} pushes weights to the rollout pool through a checkpoint engine, and naive only serves a "
            f"colocated rollout: set {rollout}.checkpoint_engine.backend to verl's nccl/nixl/... on GPUs, or "
            f"cpu_mailbox on the CPU path (+cpu_rollout=standalone)"
        )
    return backend


def check_verl_async_preconditions(view: ConfigView) -> None:
    """verl 0.9.1's own asserts of its asynchronous trainers that are pure config, checked before Ray: what
    ``PPOTrainerSeparateAsync.__init__`` and ``PPOTrainer.step`` (``verl/trainer/ppo/v1/``) assert after the
    workers started."""
    trainer_mode = view.trainer_mode
    if not (view.select("trainer.use_v1", False) and trainer_mode in VERL_ASYNC_TRAINERS):
        return
    batch = view.select("data.train_batch_size")
    sync_key = f"trainer.v1.{trainer_mode}.parameter_sync_step"
    sync_step = view.select(sync_key, 1)
    prefix = f"trainer.v1.trainer_mode={trainer_mode} (verl's asynchronous trainer)"
    if not isinstance(sync_step, int) or isinstance(sync_step, bool) or sync_step < 1 or batch % sync_step:
        raise OffPolicyConfigError(
            f"{prefix} splits each batch into {sync_key} parts: data.train_batch_size={batch} must be divisible by "
            f"{sync_key}={sync_step} (an integer >= 1)"
        )
    if trainer_mode != "separate_async":
        return
    mini_key = "actor_rollout_ref.actor.ppo_mini_batch_size"
    mini = view.select(mini_key)
    if batch != sync_step * mini:
        fix = batch // mini if mini and batch % mini == 0 else f"<data.train_batch_size / {mini_key}>"
        raise OffPolicyConfigError(
            f"{prefix} needs data.train_batch_size == {sync_key} x {mini_key}, got {batch} != {sync_step} x {mini}: "
            f"set {sync_key}={fix} "
            f"or {mini_key}={batch // sync_step}"
        )
    check_rollout_pool(view, prefix)
    if view.select("reward.reward_model.enable", False) and not view.select(
        "reward.reward_model.enable_resource_pool", False
    ):
        raise OffPolicyConfigError(
            f"{prefix} cannot colocate the reward model (its rollout never pauses to free GPU memory): set "
            "reward.reward_model.enable_resource_pool=true"
        )


LORA_RANK = "actor_rollout_ref.model.lora_rank"
LORA_MERGE = "actor_rollout_ref.model.lora.merge"


def check_lora_disaggregated(view: ConfigView) -> None:
    """LoRA on a rollout pool of its own (``hybrid_engine=false``: our overlapped mode, verl's ``separate_async``)
    needs ``lora.merge=true``: verl 0.9.1's checkpoint-engine weight path sends the base weights without the adapter
    (verl#7495), so the rollout would never see the trained adapter."""
    rank = view.select(LORA_RANK, 0) or 0
    if view.select("actor_rollout_ref.hybrid_engine", True) or not rank or view.select(LORA_MERGE, False) is True:
        return
    trainer = f"trainer.v1.trainer_mode={view.trainer_mode}"
    raise OffPolicyConfigError(
        f"{LORA_RANK}={rank} with actor_rollout_ref.hybrid_engine=false ({trainer}, the rollout on a pool of its own) "
        f"needs {LORA_MERGE}=true: verl 0.9.1's checkpoint-engine weight path sends the base weights without the "
        f"adapter (verl#7495), so the rollout would never see the trained adapter; set {LORA_MERGE}=true"
    )


def check_legacy_trainer_colocated(view: ConfigView) -> None:
    """verl's legacy trainer (``trainer.use_v1=false``: ``main_ppo_v0``'s ``RayPPOTrainer``) runs colocated only: its
    constructor asserts ``actor_rollout_ref.hybrid_engine`` ("Currently, only support hybrid engine"), after Ray
    started. The overlapped mode (``hybrid_engine=false``) is the V1 trainer's."""
    if view.select("trainer.use_v1", False) or view.select("actor_rollout_ref.hybrid_engine", True):
        return
    raise OffPolicyConfigError(
        "trainer.use_v1=false runs verl's legacy RayPPOTrainer, which supports only the colocated (hybrid) engine, but "
        "actor_rollout_ref.hybrid_engine=false: set actor_rollout_ref.hybrid_engine=true, or trainer.use_v1=true "
        f"trainer.v1.trainer_mode={scheduler_trainer(False)} for the overlapped mode (the rollout on a pool of its own)"
    )


def _uses_scheduler(view: ConfigView) -> bool:
    return bool(view.select("trainer.use_v1", False)) and view.trainer_mode in SCHEDULER_MODES


def check_scheduler_mode(view: ConfigView) -> None:
    """The scheduler's trainer name and ``actor_rollout_ref.hybrid_engine`` name the same mode (one registered name
    per mode; the presets pick it from hybrid_engine, so only a name set by hand can disagree)."""
    if not _uses_scheduler(view):
        return
    hybrid_engine = bool(view.select("actor_rollout_ref.hybrid_engine", True))
    if SCHEDULER_MODES[view.trainer_mode] != hybrid_engine:
        expected = scheduler_trainer(hybrid_engine)
        layout = "colocated" if hybrid_engine else "overlapped: the rollout on a pool of its own"
        raise OffPolicyConfigError(
            f"trainer.v1.trainer_mode={view.trainer_mode} with actor_rollout_ref.hybrid_engine={hybrid_engine} "
            f"({layout}): "
            f"that mode's trainer is {expected}; set trainer.v1.trainer_mode={expected}, or remove it (the "
            "presets pick "
            "it from actor_rollout_ref.hybrid_engine)"
        )


def needs_scheduler(offpolicy) -> bool:
    """Whether a config needs the ``offpolicy`` trainer: a stale schedule (s, d) ≠ (1, 0), or the ``rollout`` anchor
    (the trainer swaps the rollout's log-probs in). At (1, 0) the ``behaviour`` anchor is the proximal policy (every
    batch trains at the weights that generated it), so any trainer, verl's legacy ``RayPPOTrainer`` included,
    runs it."""
    return offpolicy.schedule.is_stale or offpolicy.ratio_anchor == ROLLOUT


def check_scheduler_selected(view: ConfigView) -> None:
    """Staleness control and the rollout anchor are provided by the ``offpolicy`` trainer (verl's V1 trainer)."""
    if view.select("trainer.use_v1", False) and view.trainer_mode in VERL_ASYNC_TRAINERS:
        return  # check_verl_async_modes
    offpolicy = view.offpolicy
    if needs_scheduler(offpolicy) and not _uses_scheduler(view):
        use_v1, mode = view.select("trainer.use_v1"), view.trainer_mode
        what = (
            f"algorithm.offpolicy.sync_interval={offpolicy.sync_interval}, sync_offset={offpolicy.sync_offset}"
            if offpolicy.schedule.is_stale
            else f"algorithm.offpolicy.ratio_anchor={offpolicy.ratio_anchor}"
        )
        on_policy = (
            "set algorithm.offpolicy.sync_interval=1 algorithm.offpolicy.sync_offset=0 (on-policy)"
            if offpolicy.schedule.is_stale
            else "set algorithm.offpolicy.ratio_anchor=proximal"
        )
        raise OffPolicyConfigError(
            f"{what} needs verl-offpolicy's scheduler, which runs on verl's V1 trainer (got trainer.use_v1={use_v1}, "
            f"trainer.v1.trainer_mode={mode}): set trainer.use_v1=true "
            f"trainer.v1.trainer_mode={scheduler_trainer(view.select('actor_rollout_ref.hybrid_engine', True))}, "
            f"or {on_policy}"
        )


def check_overlapped(view: ConfigView) -> None:
    """The scheduler's overlapped mode (``hybrid_engine=false``): a rollout pool, a weight transport, an anchor."""
    if not _uses_scheduler(view) or view.select("actor_rollout_ref.hybrid_engine", True):
        return
    rollout = "actor_rollout_ref.rollout"
    prefix = f"trainer.v1.trainer_mode={view.trainer_mode} with actor_rollout_ref.hybrid_engine=false (overlapped mode)"
    backend = check_rollout_pool(view, prefix)
    check_checkpoint_backend(backend, view.select(f"{rollout}.checkpoint_engine.custom_backend_module"))
    if view.offpolicy.ratio_anchor == BEHAVIOUR:
        raise OffPolicyConfigError(
            f"{prefix} cannot provide algorithm.offpolicy.ratio_anchor=behaviour: when a batch arrives the trainer "
            "has already moved past the weights that generated it; set ratio_anchor=rollout (each batch is generated "
            "entirely at one version here, so the rollout's log-probs are the behaviour policy's) or proximal"
        )


PARTIAL_ROLLOUT = "algorithm.offpolicy.partial_rollout"
# verl 0.9.1's sglang server reports no weights version (extra_fields["global_steps"]): no per-token versions.
UNVERSIONED_ROLLOUTS = ("sglang",)


def check_partial_rollout(view: ConfigView) -> None:
    """``algorithm.offpolicy.partial_rollout=true`` is the overlapped mode's: a push interrupts in-flight generation,
    which needs something in flight (a rollout pool of its own), per-token versions from the rollout, and an anchor
    that is one policy per token (``behaviour`` is one recomputation at one version)."""
    if not view.offpolicy.partial_rollout:
        return
    if not _uses_scheduler(view):
        raise OffPolicyConfigError(
            f"{PARTIAL_ROLLOUT}=true is a mode of verl-offpolicy's overlapped scheduler (got trainer.use_v1="
            f"{view.select('trainer.use_v1')}, trainer.v1.trainer_mode={view.trainer_mode}): set trainer.use_v1=true "
            f"trainer.v1.trainer_mode={scheduler_trainer(False)} actor_rollout_ref.hybrid_engine=false, or "
            f"{PARTIAL_ROLLOUT}=false"
        )
    if view.select("actor_rollout_ref.hybrid_engine", True):
        raise OffPolicyConfigError(
            f"{PARTIAL_ROLLOUT}=true interrupts generation that is in flight at a weight push, but the colocated mode "
            "(actor_rollout_ref.hybrid_engine=true) generates only while the trainer waits, so nothing is in flight "
            f"at a push: set actor_rollout_ref.hybrid_engine=false trainer.v1.trainer_mode={scheduler_trainer(False)} "
            f"(the overlapped mode), or {PARTIAL_ROLLOUT}=false"
        )
    if view.offpolicy.ratio_anchor == BEHAVIOUR:
        raise OffPolicyConfigError(
            f"{PARTIAL_ROLLOUT}=true cannot use algorithm.offpolicy.ratio_anchor=behaviour: a response's tokens may "
            "come from several versions, and behaviour is one recomputation at one version; set ratio_anchor=rollout "
            "(each token's own engine log-prob, the policy that sampled it) or proximal"
        )
    name = view.select("actor_rollout_ref.rollout.name")
    if name in UNVERSIONED_ROLLOUTS:
        raise OffPolicyConfigError(
            f"{PARTIAL_ROLLOUT}=true records the weights version of every response token, but "
            f"actor_rollout_ref.rollout.name={name} reports no version (verl's server returns no global_steps): use "
            f"vllm (or hf on the CPU path), or {PARTIAL_ROLLOUT}=false"
        )


def check_checkpoint_backend(backend, custom_module) -> None:
    """The overlapped mode's weight transport is one verl's CheckpointEngineRegistry knows (once verl's engines and the
    configured ``custom_backend_module`` are imported). A backend whose engine module cannot be imported on this
    machine (``nccl`` without cupy, checked on a laptop) is accepted: its module is named in verl's import errors."""
    import importlib

    import verl.checkpoint_engine  # noqa: F401 - imports verl's engines, each registering its backend
    from verl.checkpoint_engine.base import CheckpointEngineRegistry

    key = "actor_rollout_ref.rollout.checkpoint_engine.backend"
    if custom_module:
        try:
            importlib.import_module(custom_module)
        except ImportError as exc:
            raise OffPolicyConfigError(
                f"actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module={custom_module!r} cannot be "
                f"imported: {exc}"
            ) from None
    registered = set(CheckpointEngineRegistry._registry)
    unimportable = sorted(CheckpointEngineRegistry._import_errors)
    if backend in registered or any(str(backend) in module for module in unimportable):
        return
    raise OffPolicyConfigError(
        f"{key}={backend!r} is not a checkpoint engine verl knows: registered here {sorted(registered)}, and "
        f"{unimportable} cannot be imported on this machine; on the CPU path use cpu_mailbox (+cpu_rollout=standalone)"
    )


def check_environment(view) -> None:
    """Our environment variables, read in the TaskRunner, checked before Ray: ``VERL_OFFPOLICY_GENERATION_TIMEOUT``."""
    if _uses_scheduler(view):
        GenerationDeadline.from_env()


# Features of verl that the scheduler's per-version batches cannot serve: key -> why.
UNSUPPORTED_WITH_SCHEDULER = {
    "skip.rollout_tq.enable": "rollout skipping replays dumped rollouts instead of the scheduled generation",
}


def check_scheduler_features(view: ConfigView) -> None:
    """What the ``offpolicy`` trainer replaces or cannot combine with: verl's features, sampler and anchors."""
    if not _uses_scheduler(view):
        return
    for key, why in UNSUPPORTED_WITH_SCHEDULER.items():
        if view.select(key, False):
            raise OffPolicyConfigError(
                f"{key}=true is not supported with trainer.v1.trainer_mode={view.trainer_mode} ({why}); set {key}=false"
            )
    if view.select("trainer.v1.sampler.custom_sampler.path"):
        raise OffPolicyConfigError(
            f"trainer.v1.sampler.custom_sampler is set, but trainer.v1.trainer_mode={view.trainer_mode} uses its own "
            "sampler (the staleness FIFO); remove trainer.v1.sampler.custom_sampler.path/name"
        )
    ratio_anchor = view.offpolicy.ratio_anchor
    if view.bypass and ratio_anchor != ROLLOUT:
        raise OffPolicyConfigError(
            "algorithm.rollout_correction.bypass_mode=true already sets old_log_prob to the rollout log-probs; "
            f"set algorithm.offpolicy.ratio_anchor=rollout or bypass_mode=false (got ratio_anchor={ratio_anchor})"
        )
    if ratio_anchor == ROLLOUT and not view.select("actor_rollout_ref.rollout.calculate_log_probs", False):
        raise OffPolicyConfigError(
            "algorithm.offpolicy.ratio_anchor=rollout needs the inference engine's log-probs: "
            "set actor_rollout_ref.rollout.calculate_log_probs=true (or choose ratio_anchor=behaviour|proximal)"
        )


LOGPROBS_MODE = "actor_rollout_ref.rollout.logprobs_mode"
# What verl's vLLM rollout returns as a token's log-prob under each actor_rollout_ref.rollout.logprobs_mode (vLLM
# 0.30: Sampler.forward and TopKTopPSampler; verl passes the key to the engine, and null leaves vLLM's default,
# raw_logprobs). verl's trainer computes log_softmax(logits / T) over the whole vocabulary, T = rollout.temperature.
LOGPROBS_MODES = {
    "processed_logprobs": "log_softmax of the logits after temperature and top-p/top-k (verl's default)",
    "raw_logprobs": "log_softmax of the logits before temperature and top-p/top-k, i.e. at temperature 1",
    "processed_logits": "the logits after temperature and top-p/top-k, not log-probs",
    "raw_logits": "the logits, not log-probs",
}
LOGIT_MODES = ("processed_logits", "raw_logits")
VLLM_DEFAULT_LOGPROBS_MODE = "raw_logprobs"


def rollout_log_prob_readers(view: ConfigView) -> tuple[list[str], list[str]]:
    """The settings that read the rollout's log-probs as log π_rollout: (as the loss's π_old, as verl's rollout
    correction's π_rollout). π_old: ``ratio_anchor=rollout`` or verl's ``bypass_mode`` (which writes them into
    old_log_prob); the correction: ``rollout_is`` / ``rollout_rs``."""
    as_old = []
    if view.offpolicy.ratio_anchor == ROLLOUT:
        as_old.append("algorithm.offpolicy.ratio_anchor=rollout")
    if view.bypass:
        as_old.append(f"{ROLLOUT_CORRECTION}.bypass_mode=true")
    in_correction = [
        f"{ROLLOUT_CORRECTION}.{key}={value}"
        for key in ("rollout_is", "rollout_rs")
        if (value := view.select(f"{ROLLOUT_CORRECTION}.{key}")) is not None
    ]
    return as_old, in_correction


def check_sampling_values(view: ConfigView) -> None:
    """verl's sampling keys of the training rollout (and of validation) are values the inference engines take:
    temperature > 0 (0 samples greedily: every response of a group is the same, so a group-relative advantage is 0;
    validation may sample greedily), top_p in (0, 1] (vLLM refuses anything else at its first request)."""
    import math

    for prefix, greedy_ok in (("actor_rollout_ref.rollout", False), ("actor_rollout_ref.rollout.val_kwargs", True)):
        temperature = view.select(f"{prefix}.temperature", 1.0)
        top_p = view.select(f"{prefix}.top_p", 1.0)
        number = lambda v: not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v)  # noqa: E731
        if not number(temperature) or temperature < 0 or (temperature == 0 and not greedy_ok):
            allowed = (
                "a number >= 0 (0: greedy)"
                if greedy_ok
                else (
                    "a number > 0 (1.0 samples the policy itself; 0 would make every response of a group the same, so "
                    "every group-relative advantage is 0)"
                )
            )
            raise OffPolicyConfigError(f"{prefix}.temperature={temperature!r} is not valid; allowed: {allowed}")
        if not number(top_p) or not 0 < top_p <= 1:
            raise OffPolicyConfigError(
                f"{prefix}.top_p={top_p!r} is not valid; allowed: a number in (0, 1] (1.0: no nucleus truncation)"
            )


def check_rollout_anchor_sampling(view: ConfigView) -> None:
    """What the rollout's log-probs are, by ``actor_rollout_ref.rollout.logprobs_mode``, where training reads them.

    verl's trainer computes log_softmax(logits/T) over the whole vocabulary (T = ``rollout.temperature``). vLLM 0.30
    returns, per ``logprobs_mode`` (:data:`LOGPROBS_MODES`): ``processed_logprobs`` (verl's default) the log-probs of
    the distribution it samples, after temperature and top-p/top-k, so the trainer's value when nothing is truncated,
    at any T; ``raw_logprobs`` (also what null gives) log_softmax(logits) at temperature 1, whatever T; the
    ``*_logits`` modes logits, not log-probs. Rejected, naming the keys:

    - a ``*_logits`` mode wherever the rollout's values are read as log-probs: the loss's π_old under
      ``ratio_anchor=rollout`` (or ``bypass_mode``), or verl's ``rollout_is``/``rollout_rs``;
    - with π_old = the rollout's: T ≠ 1 under ``raw_logprobs`` (log-probs at T = 1 against the trainer's at T;
      huggingface/trl#4159), and top_p < 1 or top_k > 0 under any mode. Truncated, the processed log-probs are
      renormalised over the kept set, log π_T(y) − log S with S the kept probability mass, so every ratio carries
      the factor S (huggingface/trl#6789); the raw ones are not the distribution the token was drawn from.

    With ``rollout_is``/``rollout_rs`` under another anchor the same two gaps enter the correction's weights and
    masks next to the engines' mismatch: a startup warning names them (verl allows it; the run is not refused).
    """
    as_old, in_correction = rollout_log_prob_readers(view)
    if not as_old and not in_correction:
        return
    rollout = "actor_rollout_ref.rollout"
    mode = view.select(LOGPROBS_MODE, VLLM_DEFAULT_LOGPROBS_MODE)
    shown = f"{LOGPROBS_MODE}=" + (
        f"null (vLLM's default, {VLLM_DEFAULT_LOGPROBS_MODE})" if mode is None else str(mode)
    )
    mode = VLLM_DEFAULT_LOGPROBS_MODE if mode is None else mode
    readers = " and ".join(as_old + in_correction)
    if mode not in LOGPROBS_MODES:
        raise OffPolicyConfigError(
            f"{readers} read the rollout's log-probs, but {LOGPROBS_MODE}={mode!r} is not a mode vLLM knows; allowed "
            f"values: {', '.join(LOGPROBS_MODES)} (null: vLLM's {VLLM_DEFAULT_LOGPROBS_MODE}); set processed_logprobs"
        )
    if mode in LOGIT_MODES:
        raise OffPolicyConfigError(
            f"{readers} read the rollout's values as log π_rollout, but {shown} makes vLLM return "
            f"{LOGPROBS_MODES[mode]}: set {LOGPROBS_MODE}=processed_logprobs (verl's default: the log-probs of the "
            "distribution the rollout samples) or raw_logprobs"
        )
    temperature = view.select(f"{rollout}.temperature", 1.0)
    top_p = view.select(f"{rollout}.top_p", 1.0)
    top_k = view.select(f"{rollout}.top_k", -1)
    untempered = mode == "raw_logprobs" and temperature != 1
    truncated = [
        f"{rollout}.{key}={value}"
        for key, value, cut in (
            ("top_p", top_p, top_p is not None and top_p < 1),
            ("top_k", top_k, top_k is not None and top_k > 0),
        )
        if cut
    ]
    if as_old and untempered:
        raise OffPolicyConfigError(
            f"{as_old[0]} takes the rollout's log-probs as π_old, but {rollout}.temperature={temperature} with {shown} "
            f"returns log-probs at temperature 1, while the trainer computes log_softmax(logits/{temperature}): every "
            f"ratio would be biased, silently (huggingface/trl#4159). Set {LOGPROBS_MODE}=processed_logprobs (the "
            "log-probs at the sampling temperature), or temperature=1.0, or ratio_anchor=behaviour (the training "
            "engine "
            "at the generating weights) or proximal"
        )
    if as_old and truncated:
        reported = (
            "renormalised over the kept tokens: log π(y) − log S, S the kept probability mass"
            if mode == "processed_logprobs"
            else "those of the untruncated distribution, not of the one sampled"
        )
        raise OffPolicyConfigError(
            f"{as_old[0]} takes the rollout's log-probs as π_old, but {', '.join(truncated)} makes the rollout sample "
            f"from a truncated distribution, and with {shown} its log-probs are {reported}, while the trainer's are "
            "over the whole vocabulary: every ratio would be biased, silently (huggingface/trl#6789). Set "
            "top_p=1.0 and "
            "top_k=-1, or ratio_anchor=behaviour (the training engine at the generating weights) or proximal"
        )
    gaps = [f"{rollout}.temperature={temperature} with {shown} (log-probs at temperature 1)"] if untempered else []
    gaps += [f"{key} (log-probs renormalised over the kept set)" for key in truncated]
    if in_correction and gaps:
        logger.warning(
            "verl-offpolicy: %s compare the rollout's log-probs with the trainer's, and %s add a sampling gap to the "
            "engines' mismatch there (every weight and rejection test carries it); set %s=processed_logprobs, "
            "top_p=1.0 and top_k=-1 for weights of the mismatch alone",
            " and ".join(in_correction),
            " and ".join(gaps),
            LOGPROBS_MODE,
        )


FILTER_GROUPS = "algorithm.filter_groups"


def check_filter_groups(view: ConfigView) -> None:
    """DAPO dynamic sampling under the scheduler (``glue/scheduler/filtering.py``): verl's keys, checked before Ray.

    The metric must name what verl reads at sampling time (``reward``, or a ``reward_extra_info`` key); the rounds
    bound ``max_num_gen_batches`` is an integer (<= 0: none, verl's meaning); a group needs two samples to have a
    spread; and the reward must be computed while generating (verl asserts it only in its TaskRunner)."""
    if not _uses_scheduler(view) or not view.select(f"{FILTER_GROUPS}.enable", False):
        return
    metric = view.select(f"{FILTER_GROUPS}.metric")
    if not isinstance(metric, str) or not metric:
        raise OffPolicyConfigError(
            f"{FILTER_GROUPS}.enable=true drops the prompt groups whose {FILTER_GROUPS}.metric is the same on every "
            f"sample, but metric={metric!r}: set it to 'reward' (verl's canonical reward, rm_scores) or a key of your "
            "reward function's reward_extra_info (e.g. 'acc', 'score')"
        )
    rounds = view.select(f"{FILTER_GROUPS}.max_num_gen_batches", 0)
    if isinstance(rounds, bool) or not isinstance(rounds, int):
        raise OffPolicyConfigError(
            f"{FILTER_GROUPS}.max_num_gen_batches must be an integer: the generation rounds a version may take to fill "
            f"its batches (>= 1), or <= 0 for no bound; got {rounds!r}"
        )
    samples = view.select("actor_rollout_ref.rollout.n", 1)
    if isinstance(samples, int) and samples < 2:
        raise OffPolicyConfigError(
            f"{FILTER_GROUPS}.enable=true filters prompt groups by the spread of their samples' {metric}, but "
            f"actor_rollout_ref.rollout.n={samples} gives one sample per group (never filtered): set "
            f"actor_rollout_ref.rollout.n >= 2 or {FILTER_GROUPS}.enable=false"
        )
    if view.select("reward.reward_model.enable", False) and not view.select(
        "reward.reward_model.enable_resource_pool", False
    ):
        raise OffPolicyConfigError(
            f"{FILTER_GROUPS}.enable=true needs each group's reward while it is generated, but a colocated "
            "reward model "
            "(reward.reward_model.enable=true, enable_resource_pool=false) scores only after sampling: set "
            f"reward.reward_model.enable_resource_pool=true, use a rule-based reward, or {FILTER_GROUPS}.enable=false"
        )


THRESHOLD = "trainer.v1.sampler.max_off_policy_threshold"


def check_staleness_threshold(view: ConfigView) -> None:
    """verl's ``max_off_policy_threshold`` N bounds the versions a trajectory spans (staleness + 1 <= N,
    ``V1ReplayBuffer``); the schedule's worst staleness is s + d - 1, so a set N must be >= s + d."""
    if not _uses_scheduler(view):
        return
    threshold = view.select(THRESHOLD)
    if threshold is None:
        return
    offpolicy = view.offpolicy
    schedule = Schedule(offpolicy.sync_interval, offpolicy.sync_offset)
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise OffPolicyConfigError(f"{THRESHOLD} must be an integer >= 1 or null, got {threshold!r}")
    if schedule.worst_staleness + 1 > threshold:
        raise OffPolicyConfigError(
            f"algorithm.offpolicy.sync_interval={schedule.sync_interval}, sync_offset={schedule.sync_offset} train "
            f"batches up to {schedule.worst_staleness} versions old (s + d - 1), spanning "
            f"{schedule.worst_staleness + 1} "
            f"versions, but {THRESHOLD}={threshold} allows at most {threshold}: set {THRESHOLD} >= "
            f"{schedule.capacity} (or null: the schedule alone bounds staleness), or lower sync_interval/sync_offset"
        )


# verl's rollout correction (checked before the presets' mini-batch rule, as it always was).
ROLLOUT_CORRECTION_RULES = (
    check_rollout_correction_values,
    check_rollout_correction,
    check_sampling_values,
    check_rollout_anchor_sampling,
)
# The trainer mode: a registered one, verl's async modes, or the scheduler with its overlapped mode and its features.
RULES = (
    check_trainer_mode,
    check_legacy_trainer_colocated,
    check_verl_async_modes,
    check_verl_async_preconditions,
    check_lora_disaggregated,
    check_scheduler_selected,
    check_scheduler_mode,
    check_partial_rollout,
    check_overlapped,
    check_scheduler_features,
    check_filter_groups,
    check_staleness_threshold,
    check_environment,
)
