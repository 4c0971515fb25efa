"""The staleness-controlled trainer: what both modes share (``trainer.v1.trainer_mode=offpolicy``,
``offpolicy_overlapped``).

It is verl's v1 ``PPOTrainer`` (stock FSDP/Megatron workers, TransferQueue, agent loop) with the
schedule of ``docs/scheduler.md`` (see :mod:`verl_offpolicy.core.schedule`):

- right before step ``version + 1`` trains, if ``version`` is a multiple of ``sync_interval`` s, the
  rollout generates every batch of that version at the current weights (s batches; s + d at version 0);
- the batches wait in a FIFO of at most s + d batches and are trained in generation order;
- ``ratio_anchor=behaviour``: right after generation the training engine computes the log-probs of
  every batch that will be trained stale (staleness > 0) at the generating weights; the loss then
  uses them as ``old_log_prob``. ``rollout`` uses the inference engine's log-probs, ``proximal``
  keeps verl's recomputation. KL-in-reward (AGRO's regularised reward) always uses the proximal
  log-prob: the swap happens after the advantage is computed. On a stale batch the anchor and the proximal
  log-probs the swap holds also give verl's off-policy statistics (``offpolicy/anchor_corr/*``, no extra pass),
  and on every step where the rollout's log-probs and the trainer's at the generating weights both exist the
  engines' mismatch between them (``offpolicy/engine_mismatch/*``);
- ``algorithm.filter_groups.enable=true`` (DAPO dynamic sampling, :mod:`.filtering`): before the rollout leaves a
  version, its batches are filtered and topped up with prompts generated at that same version
  (:meth:`OffPolicyTrainer._settle`).

The queue lives in TransferQueue: each prompt's tag carries the step it is scheduled for and its
version, so verl's own TransferQueue checkpoint saves and restores it (no batch lost or replayed).
The trainer and its queue hold one :class:`~verl_offpolicy.core.schedule.Schedule` (``self.schedule``).

Each mode is a small subclass registered under its own name, as verl registers ``trainer_sync.py`` and
``trainer_colocate_async.py`` (the presets pick the name from ``actor_rollout_ref.hybrid_engine``; a startup rule
refuses a name that disagrees with it):

- :class:`~verl_offpolicy.glue.scheduler.colocated.ColocatedTrainer` (``offpolicy``, ``hybrid_engine=true``):
  the rollout shares the trainer's devices and is awake only to generate;
- :class:`~verl_offpolicy.glue.scheduler.overlapped.OverlappedTrainer` (``offpolicy_overlapped``,
  ``hybrid_engine=false``): the rollout has a pool of its own and generates while the trainer trains.

Each mode's docstring is its table of verl hooks and what they do to the rollout.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
from verl.trainer.ppo.v1.trainer_base import PPOTrainer

from verl_offpolicy.core.schedule import Schedule
from verl_offpolicy.glue.config import offpolicy_section
from verl_offpolicy.glue.scheduler import store
from verl_offpolicy.glue.scheduler.correction import compared_with_anchor, decoupled_correction, verl_correction_named
from verl_offpolicy.glue.scheduler.deadline import GenerationDeadline
from verl_offpolicy.glue.scheduler.filtering import FilterGroups, FilterGroupsExhausted, VersionFill, classify_groups
from verl_offpolicy.glue.scheduler.knobs import BEHAVIOUR, PROXIMAL, ROLLOUT
from verl_offpolicy.glue.scheduler.metrics import (
    ANCHOR_LOG_RATIO,
    OBSERVED_VERSION_MAX,
    OBSERVED_VERSION_MIN,
    anchor_corr_metrics,
    engine_mismatch_metrics,
    engine_mismatch_pair,
    filter_metrics,
    queue_metrics,
)
from verl_offpolicy.glue.scheduler.rollout import check_observed_version
from verl_offpolicy.glue.scheduler.store import TRAIN, KVBatchMeta
from verl_offpolicy.glue.validation import validate_offpolicy_config

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

STEP_TAG = "offpolicy_step"
VERSION_TAG = "offpolicy_version"
BEHAVIOUR_TAG = "offpolicy_behaviour"
BEHAVIOUR_FIELD = "behaviour_log_probs"
FILTER_TAG = "offpolicy_filter"  # on a filtered batch's prompts: [generated, dropped, surplus, rounds] (filter_metrics)
GENERATION_POLL_SECONDS = 0.05
PROGRESS_LOG_SECONDS = 60.0


@dataclass
class QueuedBatch:
    """One training batch waiting in the FIFO."""

    step: int  # the training step that consumes it
    version: int  # trainer steps the generating weights had seen
    uids: list[str]  # its prompt groups
    behaviour: bool  # behaviour log-probs were stored (batches trained stale)
    settled: bool = True  # False: generated, not yet filtered and topped up (algorithm.filter_groups)
    filtered: dict | None = None  # what group filtering did to it (metrics.filter_metrics)


class StalenessQueue(ReplayBuffer):
    """Sampler of the ``offpolicy`` trainer: the FIFO of generated batches, head first.

    Validation sampling keeps verl's behaviour. A training sample returns exactly the prompt groups
    generated for this step, materialised with verl's own ``ReplayBuffer`` helpers (same key order
    as the stock sync sampler).
    """

    def __init__(self, schedule: Schedule, **kwargs):
        super().__init__(poll_interval=GENERATION_POLL_SECONDS, **kwargs)
        self.schedule = schedule
        self.batches: list[QueuedBatch] = []
        self.current: QueuedBatch | None = None  # the batch being trained
        self.last_generation_size = 0

    def push(self, batch: QueuedBatch) -> None:
        self.batches.append(batch)
        self.batches.sort(key=lambda b: b.step)

    def head(self, step: int) -> QueuedBatch | None:
        return self.batches[0] if self.batches and self.batches[0].step == step else None

    def restore(self) -> None:
        """Rebuild the FIFO from the prompt tags TransferQueue restored from a checkpoint."""
        by_step: dict[int, QueuedBatch] = {}
        for uid, tag in store.tags().items():
            if not tag.get("is_prompt", False) or STEP_TAG not in tag:
                continue
            step = tag[STEP_TAG]
            entry = by_step.setdefault(step, QueuedBatch(step, tag[VERSION_TAG], [], False))
            entry.uids.append(uid)
            entry.behaviour = bool(tag.get(BEHAVIOUR_TAG, False))
            if tag.get(FILTER_TAG) is not None:  # settled before the save (its dropped-values breakdown is not kept)
                entry.filtered = filter_metrics(*tag[FILTER_TAG])
        self.batches = sorted(by_step.values(), key=lambda b: b.step)

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        if partition_id != TRAIN:
            return super().sample(global_steps=global_steps, partition_id=partition_id, batch_size=batch_size)
        entry = self.head(global_steps)
        if entry is None:
            raise RuntimeError(
                f"offpolicy scheduler: no batch queued for step {global_steps} "
                f"(queued steps: {[b.step for b in self.batches]})"
            )
        self._sync_metadata_from_transfer_queue()
        entry_uids = set(entry.uids)
        terminal = self.finished_keys[TRAIN] | self.failure_keys[TRAIN]
        sampleable = terminal if terminal == entry_uids else terminal & entry_uids
        if sampleable != entry_uids:
            raise RuntimeError(
                f"offpolicy scheduler: {len(entry_uids - sampleable)} prompt groups of step {global_steps} "
                "have not finished generating"
            )
        selected, snapshot, _ = self._select_prompt_uids(TRAIN, sampleable, batch_size)
        if not any(key.split("_")[0] in entry_uids for key in snapshot):
            raise RuntimeError(
                f"offpolicy scheduler: every prompt group of step {global_steps} failed to generate "
                "(see the agent loop worker log)"
            )
        batch = self._materialize_batch(TRAIN, selected, snapshot)
        self.batches.remove(entry)
        self.current = entry
        staleness = self.schedule.staleness(global_steps)
        assert staleness == (global_steps - 1) - entry.version, (staleness, entry)
        return batch, {
            **queue_metrics(entry.version, len(self.batches) + 1, self.last_generation_size),
            **(entry.filtered or {}),
        }


def steps_to_generate(
    schedule: Schedule, version: int, total_steps: int, queued=(), past_end: bool = False
) -> list[int]:
    """The steps of a run of ``total_steps`` whose batches are generated at ``version`` and are not in
    ``queued`` yet, in schedule order (bounded by the run's steps: O(1) in s and d). ``past_end``: a run
    that saves checkpoints also generates its versions' batches past its last step
    (:meth:`~verl_offpolicy.core.schedule.Schedule.generation_steps`)."""
    queued = set(queued)
    return [
        t for t in schedule.generation_steps(version, total_steps=total_steps, past_end=past_end) if t not in queued
    ]


class OffPolicyTrainer(PPOTrainer):
    """verl's v1 trainer with staleness-controlled rollouts (``docs/scheduler.md``): the base of the two modes."""

    def __init__(self, config):
        # The Hydra callback validated this config in the driver; the trainer runs in verl's TaskRunner
        # (another process) and may get a config composed without our callback (verl's own yaml plus
        # overrides), which no startup validation saw: validated once more here, once in this process.
        validate_offpolicy_config(config)
        self.offpolicy = offpolicy_section(config.algorithm)
        self.schedule = self.offpolicy.schedule
        self.filter_groups = FilterGroups.of(config)  # None: no group filtering
        self._warned_unobserved = False
        # A batch that makes no progress for this long fails the run (a stopped, hung or dead rollout never hangs it).
        self.generation_deadline = GenerationDeadline.from_env()
        super().__init__(config)

    # ------------------------------------------------------------------ the mode's part of a step

    def _make_batch_ready(self) -> dict:
        """Make B_t (``global_steps``) ready to sample; return the step's scheduler metrics."""
        raise NotImplementedError

    def prepare_step(self) -> dict:
        metrics = self._make_batch_ready()
        metrics.update(self._observed_version_metrics(self.replay_buffer.head(self.global_steps)))
        return metrics

    def on_sample_end(self):
        if self.curr_step_profile:
            self._stop_rollout_profiling()

    # ------------------------------------------------------------------ schedule

    def _steps_generated_at(self, version: int, queued=()) -> list[int]:
        """The steps of this run generated at ``version`` and not queued yet (:func:`steps_to_generate`); a
        run that saves checkpoints (``trainer.save_freq > 0``) generates past its last step too, so a run
        resumed from its last checkpoint with more steps trains those at their scheduled versions."""
        past_end = self.config.trainer.save_freq > 0
        return steps_to_generate(self.schedule, version, self.total_training_steps, queued, past_end=past_end)

    def _generates_after(self, version: int) -> bool:
        return len(self._steps_generated_at(version)) > 0

    def _queued_steps(self) -> set[int]:
        return {b.step for b in self.replay_buffer.batches}

    @staticmethod
    def _trajectories(entry: QueuedBatch) -> dict[str, dict]:
        """The trajectories of a queued batch in TransferQueue: key -> tags."""
        uids = set(entry.uids)
        items = store.tags()
        return {k: t for k, t in items.items() if not t.get("is_prompt", False) and k.split("_")[0] in uids}

    def _observed_version_metrics(self, entry: QueuedBatch) -> dict:
        """The version the rollout reports for the head batch's trajectories, checked against the schedule."""
        tags = list(self._trajectories(entry).values())
        observed = check_observed_version(entry.step, entry.version, tags)
        if observed is None:
            if not self._warned_unobserved:
                self._warned_unobserved = True
                logger.warning(
                    "offpolicy scheduler: rollout %s reports no weights version (extra_fields['global_steps']): the "
                    "observed-version check and offpolicy/observed_version are off",
                    self.config.actor_rollout_ref.rollout.name,
                )
            return {}
        low, high = observed
        return {OBSERVED_VERSION_MAX: float(high), OBSERVED_VERSION_MIN: float(low)}

    # ------------------------------------------------------------------ sampler and checkpoint

    def _build_replay_buffer(self) -> StalenessQueue:
        sampler_config = self.config.trainer.v1.sampler
        return StalenessQueue(
            schedule=self.schedule,
            trainer_mode=self.trainer_mode,
            trainer_config=self.config.trainer.v1.get(self.trainer_mode, {}),
            max_off_policy_threshold=None,
            max_off_policy_strategy=sampler_config.max_off_policy_strategy,
            sampler_kwargs=sampler_config.sampler_kwargs,
            refill_fn=self._add_prompts_to_generate,
        )

    def _load_checkpoint(self):
        super()._load_checkpoint()  # restores TransferQueue, hence the queued prompt tags
        self.replay_buffer.restore()
        if self.replay_buffer.batches:
            logger.info(
                "offpolicy scheduler: restored %d queued batches for steps %s",
                len(self.replay_buffer.batches),
                [b.step for b in self.replay_buffer.batches],
            )
        if self.global_steps > 0:  # resumed: fail now, not at the first step without its batch
            queued = {b.step: b.version for b in self.replay_buffer.batches}
            self.schedule.check_resume(self.global_steps, self.total_training_steps, queued)

    # ------------------------------------------------------------------ generation

    def _wait_for_generation(self, uids: set[str], version: int) -> None:
        """Block until every prompt group of ``uids`` finished (or failed); raise once none has finished for
        ``self.generation_deadline.bound_s`` (from the generations measured so far, :mod:`.deadline`)."""
        deadline = self.generation_deadline
        started = last_report = last_progress = time.time()
        done_before = -1
        while True:
            self._raise_dispatch_failures()
            items = store.tags()
            status = defaultdict(int)
            for uid in uids:
                status[items.get(uid, {}).get("status", "missing")] += 1
            done = status["finished"] + status["failure"]
            now = time.time()
            if done == len(uids):
                if status["failure"]:
                    logger.warning(
                        "offpolicy scheduler: %d prompt groups failed at version %d", status["failure"], version
                    )
                deadline.observe(now - started)
                return
            if done > done_before:
                done_before, last_progress = done, now
            if now - last_progress > deadline.bound_s:
                raise RuntimeError(
                    f"offpolicy scheduler: {len(uids) - done} of {len(uids)} prompt groups of version {version} not "
                    f"generated after {now - started:.0f} s, none finished in the last {now - last_progress:.0f} s "
                    f"({dict(status)}); the limit is {deadline.describe()}. A rollout process that is stopped, hung or "
                    "dead looks like this: see the rollout and agent-loop worker logs"
                )
            if now - last_report > PROGRESS_LOG_SECONDS:
                last_report = now
                logger.info(
                    "offpolicy scheduler: waiting %.0f s for %d of %d prompt groups of version %d from the "
                    "rollout (%s); "
                    "the run fails after %s",
                    now - started,
                    len(uids) - done,
                    len(uids),
                    version,
                    dict(status),
                    deadline.describe(),
                )
            time.sleep(GENERATION_POLL_SECONDS)

    def _raise_dispatch_failures(self) -> None:
        """Raise a failed hand-over of a batch to the agent loop (a mode that dispatches in the background)."""

    # ------------------------------------------------------------------ group filtering (DAPO)

    def _submit_round(self, chunks: dict) -> None:
        """Submit one top-up round (step -> its prompts) to the rollout; the mode decides how."""
        raise NotImplementedError

    def _settle(self, entries: list[QueuedBatch], version: int, *, newer_weights: bool = False) -> None:
        """Filter and top up the unsettled ``entries`` (submitted, all of ``version``, which the rollout holds; with
        ``newer_weights``, of ``version`` or older: partial rollouts, where a batch's tokens may come from newer
        weights) until each has its groups (:mod:`.filtering`); then drop the filtered and surplus groups from
        TransferQueue. A top-up keeps its batch's scheduled version. A no-op without ``algorithm.filter_groups``."""
        todo = [e for e in entries if not e.settled]
        if not todo:
            return
        if any(e.version > version or (e.version != version and not newer_weights) for e in todo):
            raise RuntimeError(
                f"offpolicy scheduler: filtering batches of versions {sorted({e.version for e in todo})} at version "
                f"{version}: a top-up would be generated under other weights"
            )
        fill = VersionFill.start(
            version,
            {e.step: len(e.uids) for e in todo},
            self.filter_groups.max_num_gen_batches,
            self.filter_groups.metric,
        )
        pending = {e.step: list(e.uids) for e in todo}
        behaviour = {e.step: e.behaviour for e in todo}
        scheduled = {e.step: e.version for e in todo}
        while True:
            self._wait_for_generation({uid for uids in pending.values() for uid in uids}, version)
            fill.record_round(classify_groups(self.replay_buffer, pending, self.filter_groups.metric))
            try:
                sizes = fill.top_ups()
            except FilterGroupsExhausted:
                logger.error(fill.describe())
                raise
            if not sizes:
                break
            short = {step: fill.batches[step].missing for step in sizes}
            (logger.warning if fill.max_rounds <= 0 else logger.info)(fill.round_line(short))
            chunks = {}
            for step, num_prompts in sizes.items():
                chunks[step] = self._next_train_batch(num_prompts)
                uids = [str(u) for u in chunks[step]["uid"]]
                tags = [{STEP_TAG: step, VERSION_TAG: scheduled[step], BEHAVIOUR_TAG: behaviour[step]}] * len(uids)
                store.tag(uids, tags)
            self._submit_round(chunks)
            pending = {step: [str(u) for u in chunk["uid"]] for step, chunk in chunks.items()}
        discard = set()
        for entry in todo:
            batch = fill.batches[entry.step]
            counts = [batch.generated, len(batch.dropped), len(batch.surplus), fill.rounds]
            entry.uids, entry.settled = batch.selected, True
            entry.filtered = filter_metrics(*counts, dropped_values=batch.dropped_values)
            store.tag(entry.uids, [{FILTER_TAG: counts}] * len(entry.uids))
            discard |= set(batch.dropped) | set(batch.surplus)
        self.replay_buffer._sync_metadata_from_transfer_queue()
        self.replay_buffer._clear_groups(TRAIN, discard)  # verl's: the prompts and their trajectories
        logger.info(fill.describe())

    # ------------------------------------------------------------------ ratio anchor

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        # The advantage (and AGRO's KL-in-reward) uses the proximal old_log_probs; the loss gets the anchor.
        # verl's rollout correction compares the anchor with the rollout on a stale behaviour batch (.correction).
        # A batch whose every IS weight the IcePop band zeroed stops with one line naming the band (.correction).
        correction = decoupled_correction(self.config.algorithm.get("rollout_correction", None))
        corrected = correction and self.offpolicy.ratio_anchor == BEHAVIOUR and self.replay_buffer.current.behaviour
        if corrected:
            verl_correction = compared_with_anchor(self._behaviour_padded(batch))
        else:
            verl_correction = verl_correction_named() if correction else contextlib.nullcontext()
        self._log_engine_mismatch(batch, metrics)  # before verl's rejection (rollout_rs) narrows response_mask
        with verl_correction:
            batch = super()._compute_advantage(batch, metrics)
        anchor = self.offpolicy.ratio_anchor
        if anchor == PROXIMAL:
            return batch
        keys = [k for k, t in zip(batch.keys, batch.tags, strict=True) if not t.get("is_padding", False)]
        if anchor == ROLLOUT:
            source = "rollout_log_probs"
        elif self.replay_buffer.current.behaviour:
            source = BEHAVIOUR_FIELD
        else:
            return batch  # trained at staleness 0: behaviour weights are the proximal weights
        data = store.read(keys, [source, "old_log_probs", "response_mask"], batch.partition_id)
        if self.schedule.staleness(self.global_steps) > 0:
            # off-policy health on stale batches only (docs/scheduler.md, "What it logs"); on a fresh batch a
            # rollout anchor differs from the proximal policy only by the two engines' mismatch
            padded = data.to_padded_tensor()
            metrics.update(anchor_corr_metrics(padded["old_log_probs"], padded[source], padded["response_mask"]))
        proximal = data.pop("old_log_probs")
        anchored = data.pop(source)
        metrics[ANCHOR_LOG_RATIO] = _masked_mean_gap(proximal, anchored, data["response_mask"])
        data["old_log_probs"] = anchored
        store.write(keys, data.select("old_log_probs"), batch.partition_id)
        return batch

    def _log_engine_mismatch(self, batch: KVBatchMeta, metrics: dict) -> None:
        """``offpolicy/engine_mismatch/*``: the rollout's log-probs against the trainer's at the weights that
        generated the batch (:func:`~.metrics.engine_mismatch_pair`), on every step where both exist, with or
        without a rollout correction; read before the anchor replaces ``old_log_probs`` and before verl's rejection
        masks responses. verl's own ``training/rollout_probs_diff_*`` compare the rollout with the proximal
        log-probs, which on a stale batch hold the staleness too."""
        pair = self._engine_mismatch_pair(self.schedule.staleness(self.global_steps))
        if pair is None:
            return
        field = "old_log_probs" if pair == PROXIMAL else BEHAVIOUR_FIELD
        keys = [k for k, t in zip(batch.keys, batch.tags, strict=True) if not t.get("is_padding", False)]
        data = store.read(keys, [field, "rollout_log_probs", "response_mask"], batch.partition_id).to_padded_tensor()
        metrics.update(engine_mismatch_metrics(data[field], data["rollout_log_probs"], data["response_mask"]))

    def _engine_mismatch_pair(self, staleness: int) -> str | None:
        """:func:`~.metrics.engine_mismatch_pair` for this run's rollout and correction settings at ``staleness``."""
        correction = self.config.algorithm.get("rollout_correction", None) or {}
        return engine_mismatch_pair(
            staleness,
            self.replay_buffer.current.behaviour,
            bool(self.config.actor_rollout_ref.rollout.get("calculate_log_probs", False)),
            bool(correction.get("bypass_mode", False)),
        )

    def _behaviour_padded(self, batch: KVBatchMeta) -> torch.Tensor:
        """The behaviour log-probs of ``batch`` in verl's padded [B, T] layout (its ``_compute_advantage`` reads
        the same keys in the same order); a padding row keeps its proximal log-probs (its mask is empty)."""
        data = store.read(batch.keys, ["old_log_probs", "response_mask"], batch.partition_id).to_padded_tensor()
        anchored = data["old_log_probs"].clone()
        rows = [i for i, t in enumerate(batch.tags) if not t.get("is_padding", False)]
        behaviour = store.read([batch.keys[i] for i in rows], [BEHAVIOUR_FIELD, "response_mask"], batch.partition_id)
        behaviour = behaviour.to_padded_tensor()[BEHAVIOUR_FIELD]
        anchored[rows, : behaviour.shape[-1]] = behaviour.to(anchored.dtype)
        return anchored


def _masked_mean_gap(proximal, anchored, response_mask) -> float:
    """Mean over response tokens of log π_proximal − log π_anchor (how far the anchor lags).

    Masked tokens are selected away (not multiplied by 0), so an anchor log-prob of −inf there is ignored.
    """
    gap = (proximal.values() - anchored.values()).float()
    mask = response_mask.values().float() if response_mask.is_nested else response_mask.float()
    return float(gap.masked_fill(mask == 0, 0.0).sum() / mask.sum().clamp(min=1.0))
