"""The staleness-controlled colocated trainer: ``trainer.v1.trainer_mode=offpolicy``.

It is verl's v1 ``PPOTrainer`` (stock FSDP/Megatron workers, TransferQueue, agent loop) with the
schedule of ``docs/scheduler.md`` (see :mod:`verl_offpolicy.core.schedule`):

- right before step ``version + 1`` trains, if ``version`` is a multiple of ``sync_interval`` s, the
  rollout is woken at the current weights once and generates every batch of that version in one
  call (s batches; s + d at version 0);
- the batches wait in a FIFO of at most s + d batches and are trained in generation order;
- ``ratio_anchor=behaviour``: right after generation the training engine computes the log-probs of
  every batch that will be trained stale (staleness > 0) at the generating weights; the loss then
  uses them as ``old_log_prob``. ``rollout`` uses the inference engine's log-probs, ``proximal``
  keeps verl's recomputation. KL-in-reward (AGRO's regularised reward) always uses the proximal
  log-prob: the swap happens after the advantage is computed.

The queue lives in TransferQueue: each prompt's tag carries the step it is scheduled for and its
version, so verl's own TransferQueue checkpoint saves and restores it (no batch lost or replayed).
With s = 1, d = 0 the sequence of calls is the stock ``sync`` trainer's. The trainer and its queue hold
one :class:`~verl_offpolicy.core.schedule.Schedule` (``self.schedule``).

Rollout life cycle (colocated: the rollout shares the trainer's devices, so it is awake only to generate):

====================  =====================================================================================
hook (verl PPOTrainer) what happens to the rollout
====================  =====================================================================================
``on_init_end``       wake at the current version (0, or the step a checkpoint resumed): weights synced
``on_validate_begin`` wake at the current version (validation samples with the current weights)
``prepare_step`` (t)  version t − 1 generates: wake at t − 1 (no-op if ``on_step_end`` already did),
                      generate every batch of that version in one call, sleep; otherwise: sleep
``on_step_end`` (t)   version t generates: sync the new weights now (timed as ``update_weights``)
``_load_checkpoint``  rollout untouched; the FIFO is rebuilt from the TransferQueue tags
====================  =====================================================================================

Overlapped mode (``actor_rollout_ref.hybrid_engine=false``): the same schedule, batches and versions, but
the rollout runs on a resource pool of its own (:class:`~verl_offpolicy.glue.overlap.StandaloneRollout`)
and generates while the trainer trains; weights reach it through verl's checkpoint-engine API
(``actor_rollout_ref.rollout.checkpoint_engine.backend``), once per version:

====================  =====================================================================================
hook (verl PPOTrainer) what happens to the rollout
====================  =====================================================================================
``on_init_end``       push the current version (0, or the step a checkpoint resumed)
``on_train_begin``    submit the batches of that version not already queued, one agent-loop call per batch,
                      in schedule order (the FIFO never holds more than s + d batches, finished or not)
``prepare_step`` (t)  wait for B_t only (``offpolicy/wait_s``), check the version the rollout reports
``on_step_end`` (t)   version t generates: wait until nothing of the previous version is in flight (so no
                      request is aborted or resumed under new weights), push version t, submit its batches
``_save_checkpoint``  wait until nothing is in flight, then save (the FIFO is checkpointed finished)
====================  =====================================================================================

``ratio_anchor=behaviour`` is rejected in this mode at startup (the trainer has moved past the generating
weights when a batch arrives); ``rollout`` is the behaviour policy's own log-probs here, since every
batch is generated entirely at one version (checked: ``offpolicy/observed_version``).
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from dataclasses import dataclass

import transfer_queue as tq
from transfer_queue import KVBatchMeta

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
from verl.trainer.ppo.v1.trainer_base import PPOTrainer, register_trainer
from verl.utils import tensordict_utils as tu
from verl.utils.debug import marked_timer
from verl.workers.utils.padding import response_from_nested

from verl_offpolicy.core.schedule import Schedule
from verl_offpolicy.glue.config import offpolicy_section
from verl_offpolicy.glue.metrics import ANCHOR_LOG_RATIO, queue_metrics, rollout_call_metrics
from verl_offpolicy.glue.overlap import StandaloneRollout, check_observed_version, push_label
from verl_offpolicy.glue.validation import validate_offpolicy_config

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

TRAIN = "train"
STEP_TAG = "offpolicy_step"
VERSION_TAG = "offpolicy_version"
BEHAVIOUR_TAG = "offpolicy_behaviour"
BEHAVIOUR_FIELD = "behaviour_log_probs"
GENERATION_POLL_SECONDS = 0.05
PROGRESS_LOG_SECONDS = 60.0
# A batch not generated within this many seconds fails the run (a dead or stuck rollout never hangs it).
GENERATION_TIMEOUT_S = float(os.environ.get("VERL_OFFPOLICY_GENERATION_TIMEOUT", "3600"))


@dataclass
class QueuedBatch:
    """One training batch waiting in the FIFO."""

    step: int  # the training step that consumes it
    version: int  # trainer steps the generating weights had seen
    uids: list[str]  # its prompt groups
    behaviour: bool  # behaviour log-probs were stored (batches trained stale)


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
        for uid, tag in (tq.kv_list(TRAIN) or {}).get(TRAIN, {}).items():
            if not tag.get("is_prompt", False) or STEP_TAG not in tag:
                continue
            step = tag[STEP_TAG]
            entry = by_step.setdefault(step, QueuedBatch(step, tag[VERSION_TAG], [], False))
            entry.uids.append(uid)
            entry.behaviour = bool(tag.get(BEHAVIOUR_TAG, False))
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
        return batch, queue_metrics(entry.version, len(self.batches) + 1, self.last_generation_size)


@register_trainer("offpolicy")
class OffPolicyTrainer(PPOTrainer):
    """verl's v1 trainer with staleness-controlled colocated rollouts (``docs/scheduler.md``)."""

    def __init__(self, config):
        validate_offpolicy_config(config)
        self.offpolicy = offpolicy_section(config.algorithm)
        self.schedule = self.offpolicy.schedule
        self._rollout_version: int | None = None  # weights version the awake rollout holds; None = asleep
        self._generated_this_step = 0
        self.overlapped = not bool(config.actor_rollout_ref.get("hybrid_engine", True))
        # verl's PPOTrainer._setup builds no colocated replicas (and a pure Actor worker) when this is False.
        self._enable_hybrid_replicas = not self.overlapped
        self.standalone: StandaloneRollout | None = None
        self._last_submission: tuple[int, int] | None = None  # (version, batches) of the last submission
        self._warned_unobserved = False
        super().__init__(config)

    # ------------------------------------------------------------------ overlapped mode: the standalone rollout

    def _setup(self):
        super()._setup()
        if self.overlapped:
            self.standalone = StandaloneRollout(self.config, self.actor_rollout_wg)

    def get_llm_client(self):
        return self.standalone.client() if self.overlapped else super().get_llm_client()

    def _rollout_server_managers(self) -> list:
        managers = super()._rollout_server_managers()
        if self.standalone is not None:
            managers.append(self.standalone.server_manager)
        return managers

    def _submit(self, version: int) -> None:
        """Overlapped mode: submit every batch of ``version`` not yet queued, in schedule order."""
        queued = {b.step for b in self.replay_buffer.batches}
        steps = [t for t in self._steps_generated_at(version) if t not in queued]
        if not steps:
            return
        if len(self.replay_buffer.batches) + len(steps) > self.schedule.capacity:
            raise RuntimeError(
                f"offpolicy scheduler: submitting {len(steps)} batches of version {version} would hold "
                f"{len(self.replay_buffer.batches) + len(steps)} > s + d = {self.schedule.capacity} batches"
            )
        for step in steps:
            assert self.schedule.version(step) == version
            chunk = self._next_train_batch()
            uids = [str(u) for u in chunk["uid"]]
            tq.kv_batch_put(
                keys=uids, partition_id=TRAIN, tags=[{STEP_TAG: step, VERSION_TAG: version, BEHAVIOUR_TAG: False}] * len(uids)
            )
            self._submit_batch_to_rollout(chunk)
            self.replay_buffer.push(QueuedBatch(step=step, version=version, uids=uids, behaviour=False))
        self.replay_buffer.last_generation_size = len(steps)
        self._last_submission = (version, len(steps))

    def _wait_in_flight(self) -> float:
        """Overlapped mode: block until every submitted batch finished; returns the seconds waited."""
        start = time.perf_counter()
        uids = {uid for entry in self.replay_buffer.batches for uid in entry.uids}
        if uids:
            self._wait_for_generation(uids, self.standalone.version)
        return time.perf_counter() - start

    def on_train_begin(self):
        if self.overlapped:
            self._submit(self.global_steps - 1)  # fit() has advanced global_steps to the first step to train

    def _save_checkpoint(self):
        if self.overlapped:
            # Nothing in flight at a checkpoint: the saved FIFO holds finished batches only, so a resumed run
            # never regenerates a batch under other weights (verl would re-issue in-flight prompts).
            self._wait_in_flight()
        super()._save_checkpoint()

    def _observed_version_metrics(self, entry: QueuedBatch) -> dict:
        """The version the rollout reports for the head batch's trajectories, checked against the schedule."""
        items = (tq.kv_list(TRAIN) or {}).get(TRAIN, {})
        uids = set(entry.uids)
        tags = [t for k, t in items.items() if not t.get("is_prompt", False) and k.split("_")[0] in uids]
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
        return {"offpolicy/observed_version/min": float(low), "offpolicy/observed_version/max": float(high)}

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

    # ------------------------------------------------------------------ rollout life cycle

    def _rollout_at(self, version: int) -> None:
        """Wake the rollout with the current weights (version = trainer steps they have seen)."""
        if self._rollout_version == version:
            return
        if self._rollout_version is not None:
            self.checkpoint_manager.sleep_replicas()
        self.checkpoint_manager.update_weights(push_label(version))
        self._rollout_version = version

    def _rollout_sleep(self) -> None:
        if self._rollout_version is not None:
            self.checkpoint_manager.sleep_replicas()
            self._rollout_version = None

    def _steps_generated_at(self, version: int) -> range:
        """The steps of this run generated at ``version`` (bounded by the run's total steps, O(1))."""
        return self.schedule.generation_steps(version, total_steps=self.total_training_steps)

    def _generates_after(self, version: int) -> bool:
        return len(self._steps_generated_at(version)) > 0

    def on_init_end(self):
        if self.overlapped:
            self.standalone.push(self.global_steps)
            return
        self._rollout_at(self.global_steps)

    def on_validate_begin(self):
        if not self.overlapped:  # the standalone rollout always holds the current version
            self._rollout_at(self.global_steps)

    def on_sample_end(self):
        if self.curr_step_profile:
            self._stop_rollout_profiling()

    def on_step_end(self):
        if not self._generates_after(self.global_steps):
            return
        if self.overlapped:
            with marked_timer("update_weights", self.timing_raw, color="red"):
                sync_wait = self._wait_in_flight()  # nothing of the previous version in flight: nothing aborted
                metrics = self.standalone.push(self.global_steps)
            self._submit(self.global_steps)
            self._pending_sync_metrics = {**metrics, "offpolicy/sync_wait_s": sync_wait}
            return
        with marked_timer("update_weights", self.timing_raw, color="red"):
            self._rollout_at(self.global_steps)

    # ------------------------------------------------------------------ generation

    def prepare_step(self) -> dict:
        metrics = self._prepare_overlapped() if self.overlapped else self._prepare_colocated()
        metrics.update(self._observed_version_metrics(self.replay_buffer.head(self.global_steps)))
        return metrics

    def _prepare_overlapped(self) -> dict:
        """Wait for B_t only (generated since version v(t) was pushed)."""
        step = self.global_steps
        entry = self.replay_buffer.head(step)
        if entry is None:
            raise RuntimeError(
                f"offpolicy scheduler: no batch was submitted for step {step} "
                f"(queued steps: {[b.step for b in self.replay_buffer.batches]})"
            )
        start = time.perf_counter()
        with marked_timer("gen", self.timing_raw, color="red"):
            self._wait_for_generation(set(entry.uids), entry.version)
        version, batches = self._last_submission if self._last_submission else (None, 0)
        submitted = version == step - 1
        metrics = {
            "offpolicy/wait_s": time.perf_counter() - start,
            "offpolicy/rollout_calls": float(submitted),
            "offpolicy/generated_batches": float(batches if submitted else 0),
            "offpolicy/weight_pushes": float(self.standalone.pushes),
        }
        busy = self.standalone.busy_fraction()
        if busy is not None:
            metrics["offpolicy/rollout_busy_fraction"] = busy
        return metrics

    def _prepare_colocated(self) -> dict:
        step = self.global_steps
        version = step - 1
        queued = {b.step for b in self.replay_buffer.batches}
        steps = [t for t in self._steps_generated_at(version) if t not in queued]
        self._generated_this_step = len(steps)
        start = time.perf_counter()
        if steps:
            self._generate(version, steps)
        else:
            self._rollout_sleep()
        if self.replay_buffer.head(step) is None:
            raise RuntimeError(f"offpolicy scheduler: no batch is scheduled for step {step}")
        # colocated: the trainer waits for every generation
        return {**rollout_call_metrics(len(steps)), "offpolicy/wait_s": time.perf_counter() - start}

    def _generate(self, version: int, steps: list[int]) -> None:
        """One rollout call at ``version`` for the batches of ``steps``; then behaviour log-probs."""
        self._rollout_at(version)
        chunks = [self._next_train_batch() for _ in steps]
        entries = []
        tags = []
        for step, chunk in zip(steps, chunks, strict=True):
            uids = [str(u) for u in chunk["uid"]]
            stale = self.schedule.staleness(step) > 0
            behaviour = stale and self.offpolicy.ratio_anchor == "behaviour"
            assert self.schedule.version(step) == version
            entries.append(QueuedBatch(step=step, version=version, uids=uids, behaviour=behaviour))
            tags += [{STEP_TAG: step, VERSION_TAG: version, BEHAVIOUR_TAG: behaviour} for _ in uids]
        all_uids = [uid for entry in entries for uid in entry.uids]
        # The schedule tags go in first (TransferQueue merges tags); verl then registers the prompts and
        # the agent loop generates them all in one call. Timed as verl's own trainer times generation
        # ("gen", logged as timing_s/gen; verl adds the sampling of the batch to it).
        with marked_timer("gen", self.timing_raw, color="red"):
            tq.kv_batch_put(keys=all_uids, partition_id=TRAIN, tags=tags)
            self._submit_batch_to_rollout(chunks[0] if len(chunks) == 1 else tu.concat_tensordict(chunks))
            self._wait_for_generation(set(all_uids), version)
            self._rollout_sleep()
        behaviour_uids = {uid for entry in entries if entry.behaviour for uid in entry.uids}
        if behaviour_uids:
            with marked_timer("behaviour_log_prob", self.timing_raw, color="blue"):
                self._store_behaviour_log_probs(behaviour_uids)
        for entry in entries:
            self.replay_buffer.push(entry)
        self.replay_buffer.last_generation_size = len(entries)

    def _wait_for_generation(self, uids: set[str], version: int) -> None:
        started = last_report = time.time()
        while True:
            items = (tq.kv_list(TRAIN) or {}).get(TRAIN, {})
            status = defaultdict(int)
            for uid in uids:
                status[items.get(uid, {}).get("status", "missing")] += 1
            if status["finished"] + status["failure"] == len(uids):
                if status["failure"]:
                    logger.warning("offpolicy scheduler: %d prompt groups failed at version %d", status["failure"], version)
                return
            if time.time() - started > GENERATION_TIMEOUT_S:
                raise RuntimeError(
                    f"offpolicy scheduler: {len(uids) - status['finished'] - status['failure']} of {len(uids)} prompt "
                    f"groups of version {version} not generated after {GENERATION_TIMEOUT_S:.0f}s ({dict(status)}); "
                    "see the rollout and agent-loop worker logs, or raise VERL_OFFPOLICY_GENERATION_TIMEOUT"
                )
            if time.time() - last_report > PROGRESS_LOG_SECONDS:
                last_report = time.time()
                logger.info(
                    "offpolicy scheduler: generating version %d for %.0f s: %s", version, last_report - started, dict(status)
                )
            time.sleep(GENERATION_POLL_SECONDS)

    def _trajectory_meta(self, uids: set[str]) -> KVBatchMeta:
        items = (tq.kv_list(TRAIN) or {}).get(TRAIN, {})
        pairs = [(k, t) for k, t in items.items() if not t.get("is_prompt", False) and k.split("_")[0] in uids]
        return KVBatchMeta(partition_id=TRAIN, keys=[k for k, _ in pairs], tags=[t for _, t in pairs])

    def _store_behaviour_log_probs(self, uids: set[str]) -> None:
        """log π at the generating weights, by the training engine, for every stale batch's trajectory."""
        meta = self._trajectory_meta(uids)
        if not meta.keys:
            return
        meta = self._balance_batch(meta, metrics={})
        meta.extra_info.update(
            {
                "calculate_entropy": False,
                "compute_loss": False,
                "temperature": self.config.actor_rollout_ref.rollout.temperature,
            }
        )
        self.actor_rollout_wg.compute_log_prob(meta)
        real = [k for k, t in zip(meta.keys, meta.tags, strict=True) if not t.get("is_padding", False)]
        padding = [k for k, t in zip(meta.keys, meta.tags, strict=True) if t.get("is_padding", False)]
        data = tq.kv_batch_get(keys=real, partition_id=TRAIN, select_fields=["log_probs", "response_mask"])
        data[BEHAVIOUR_FIELD] = response_from_nested(data.pop("log_probs"), data["response_mask"])
        tq.kv_batch_put(keys=real, partition_id=TRAIN, fields=data.select(BEHAVIOUR_FIELD))
        if padding:
            tq.kv_clear(keys=padding, partition_id=TRAIN)

    # ------------------------------------------------------------------ ratio anchor

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        # The advantage (and AGRO's KL-in-reward) uses the proximal old_log_probs; the loss gets the anchor.
        batch = super()._compute_advantage(batch, metrics)
        anchor = self.offpolicy.ratio_anchor
        if anchor == "proximal":
            return batch
        keys = [k for k, t in zip(batch.keys, batch.tags, strict=True) if not t.get("is_padding", False)]
        if anchor == "rollout":
            source = "rollout_log_probs"
        elif self.replay_buffer.current.behaviour:
            source = BEHAVIOUR_FIELD
        else:
            return batch  # trained at staleness 0: behaviour weights are the proximal weights
        data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=[source, "old_log_probs", "response_mask"])
        proximal = data.pop("old_log_probs")
        anchored = data.pop(source)
        metrics[ANCHOR_LOG_RATIO] = _masked_mean_gap(proximal, anchored, data["response_mask"])
        data["old_log_probs"] = anchored
        tq.kv_batch_put(keys=keys, partition_id=batch.partition_id, fields=data.select("old_log_probs"))
        return batch


def _masked_mean_gap(proximal, anchored, response_mask) -> float:
    """Mean over response tokens of log π_proximal − log π_anchor (how far the anchor lags).

    Masked tokens are selected away (not multiplied by 0), so an anchor log-prob of −inf there is ignored.
    """
    gap = (proximal.values() - anchored.values()).float()
    mask = response_mask.values().float() if response_mask.is_nested else response_mask.float()
    return float(gap.masked_fill(mask == 0, 0.0).sum() / mask.sum().clamp(min=1.0))
