"""The colocated mode of the ``offpolicy`` trainer (``actor_rollout_ref.hybrid_engine=true``, the default).

The rollout shares the trainer's devices, so it is awake only to generate: every batch of a version is
generated in one call, then the rollout sleeps and the trainer trains. With s = 1, d = 0 the sequence of
calls is the stock ``sync`` trainer's (verl's ``trainer_sync.py``).

Rollout life cycle:

====================  =====================================================================================
hook (verl PPOTrainer) what happens to the rollout
====================  =====================================================================================
``on_init_end``       wake at the current version (0, or the step a checkpoint resumed): weights synced
``on_validate_begin`` wake at the current version (validation samples with the current weights)
``prepare_step`` (t)  version t − 1 generates: wake at t − 1 (no-op if ``on_step_end`` already did),
                      generate every batch of that version in one call (with ``algorithm.filter_groups``:
                      then filter and top up at t − 1, one call per round), sleep; otherwise: sleep
``on_step_end`` (t)   version t generates: sync the new weights now (timed as ``update_weights``)
``_load_checkpoint``  rollout untouched; the FIFO is rebuilt from the TransferQueue tags
====================  =====================================================================================
"""

from __future__ import annotations

import time

from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.utils import tensordict_utils as tu
from verl.utils.debug import marked_timer
from verl.workers.utils.padding import response_from_nested

from verl_offpolicy.glue.registration import OFFPOLICY_TRAINER
from verl_offpolicy.glue.scheduler import store
from verl_offpolicy.glue.scheduler.knobs import BEHAVIOUR
from verl_offpolicy.glue.scheduler.metrics import WAIT_S, rollout_call_metrics
from verl_offpolicy.glue.scheduler.rollout import push_label
from verl_offpolicy.glue.scheduler.store import KVBatchMeta
from verl_offpolicy.glue.scheduler.trainer import (
    BEHAVIOUR_FIELD,
    BEHAVIOUR_TAG,
    STEP_TAG,
    VERSION_TAG,
    OffPolicyTrainer,
    QueuedBatch,
)


@register_trainer(OFFPOLICY_TRAINER)
class ColocatedTrainer(OffPolicyTrainer):
    """The rollout sleeps while the trainer trains; one wake-up and weight sync per version that generates."""

    def __init__(self, config):
        self._rollout_version: int | None = None  # weights version the awake rollout holds; None = asleep
        super().__init__(config)

    # ------------------------------------------------------------------ hooks

    def on_init_end(self):
        self._rollout_at(self.global_steps)

    def on_validate_begin(self):
        self._rollout_at(self.global_steps)

    def on_step_end(self):
        if not self._generates_after(self.global_steps):
            return
        with marked_timer("update_weights", self.timing_raw, color="red"):
            self._rollout_at(self.global_steps)

    def _make_batch_ready(self) -> dict:
        """Version t − 1 generates every batch of that version in one call (else the rollout sleeps)."""
        step = self.global_steps
        version = step - 1
        steps = self._steps_generated_at(version, self._queued_steps())
        start = time.perf_counter()
        if steps:
            self._generate(version, steps)
        else:
            self._rollout_sleep()
        if self.replay_buffer.head(step) is None:
            raise RuntimeError(f"offpolicy scheduler: no batch is scheduled for step {step}")
        # colocated: the trainer waits for every generation
        return {**rollout_call_metrics(len(steps)), WAIT_S: time.perf_counter() - start}

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

    # ------------------------------------------------------------------ generation

    def _generate(self, version: int, steps: list[int]) -> None:
        """One rollout call at ``version`` for the batches of ``steps``; then behaviour log-probs."""
        self._rollout_at(version)
        chunks = [self._next_train_batch() for _ in steps]
        entries = []
        tags = []
        for step, chunk in zip(steps, chunks, strict=True):
            uids = [str(u) for u in chunk["uid"]]
            stale = self.schedule.staleness(step) > 0
            behaviour = stale and self.offpolicy.ratio_anchor == BEHAVIOUR
            assert self.schedule.version(step) == version
            entries.append(
                QueuedBatch(
                    step=step, version=version, uids=uids, behaviour=behaviour, settled=self.filter_groups is None
                )
            )
            tags += [{STEP_TAG: step, VERSION_TAG: version, BEHAVIOUR_TAG: behaviour} for _ in uids]
        all_uids = [uid for entry in entries for uid in entry.uids]
        # The schedule tags go in first (TransferQueue merges tags); verl then registers the prompts and
        # the agent loop generates them all in one call. Timed as verl's own trainer times generation
        # ("gen", logged as timing_s/gen; verl adds the sampling of the batch to it).
        with marked_timer("gen", self.timing_raw, color="red"):
            store.tag(all_uids, tags)
            self._submit_batch_to_rollout(chunks[0] if len(chunks) == 1 else tu.concat_tensordict(chunks))
            self._wait_for_generation(set(all_uids), version)
            self._settle(entries, version)  # DAPO: filtered and topped up while the rollout holds this version
            self._rollout_sleep()
        behaviour_uids = {uid for entry in entries if entry.behaviour for uid in entry.uids}
        if behaviour_uids:
            with marked_timer("behaviour_log_prob", self.timing_raw, color="blue"):
                self._store_behaviour_log_probs(behaviour_uids)
        for entry in entries:
            self.replay_buffer.push(entry)
        self.replay_buffer.last_generation_size = len(entries)

    def _submit_round(self, chunks: dict) -> None:
        """A top-up round is one more rollout call at the same version (the rollout is still awake)."""
        batches = list(chunks.values())
        self._submit_batch_to_rollout(batches[0] if len(batches) == 1 else tu.concat_tensordict(batches))

    def _trajectory_meta(self, uids: set[str]) -> KVBatchMeta:
        items = store.tags()
        pairs = [(k, t) for k, t in items.items() if not t.get("is_prompt", False) and k.split("_")[0] in uids]
        return store.batch([k for k, _ in pairs], [t for _, t in pairs])

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
        data = store.read(real, ["log_probs", "response_mask"])
        data[BEHAVIOUR_FIELD] = response_from_nested(data.pop("log_probs"), data["response_mask"])
        store.write(real, data.select(BEHAVIOUR_FIELD))
        if padding:
            store.clear(padding)
