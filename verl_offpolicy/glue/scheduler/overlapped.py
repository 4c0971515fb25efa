"""The overlapped mode of the scheduler, ``trainer.v1.trainer_mode=offpolicy_overlapped``
(``actor_rollout_ref.hybrid_engine=false``).

The same schedule, batches and versions as the colocated mode, but the rollout runs on a resource pool
of its own (:class:`~verl_offpolicy.glue.scheduler.rollout.StandaloneRollout`) and generates while the
trainer trains; weights reach it through verl's checkpoint-engine API
(``actor_rollout_ref.rollout.checkpoint_engine.backend``), once per version:

====================  =====================================================================================
hook (verl PPOTrainer) what happens to the rollout
====================  =====================================================================================
``on_init_end``       push the current version (0, or the step a checkpoint resumed)
``on_train_begin``    submit the batches of that version not already queued, one agent-loop call per batch,
                      in schedule order, each with priority = its step, so the rollout server generates them
                      one after the other, B_t first (the FIFO never holds more than s + d batches, finished or not);
                      a thread hands them to the agent-loop workers, the trainer goes on (:mod:`.dispatch`)
``prepare_step`` (t)  wait for B_t only (``offpolicy/wait_s``), check the version the rollout reports; with
                      ``algorithm.filter_groups``, B_t not yet filtered: filter and top up every batch of its
                      version (the version the rollout holds) first; with partial rollouts B_t alone, its top-ups
                      sampled by the weights the rollout holds now (nothing was settled before the push)
``on_step_end`` (t)   version t generates: wait until nothing of the previous version is in flight (so no
                      request is aborted or resumed under new weights) and its batches are filtered and topped
                      up, push version t, submit its batches; with ``algorithm.offpolicy.partial_rollout`` the
                      push does not wait: verl's manager aborts the in-flight requests and resumes them under
                      the new weights, each token's version recorded (:mod:`.partial`)
``on_validate_begin``  verl validates after ``on_step_end``: if the rollout holds an older version than the step
                      just trained, wait until nothing is in flight (every batch of its version is generated;
                      not with partial rollouts), then push this step's weights, so validation sees the weights
                      the colocated mode's does
``_save_checkpoint``  wait until nothing is in flight, then save (the FIFO is checkpointed finished)
====================  =====================================================================================

``ratio_anchor=behaviour`` is rejected in this mode at startup (the trainer has moved past the generating
weights when a batch arrives); ``rollout`` is the behaviour policy's own log-probs here, since every
batch is generated entirely at one version (checked: ``offpolicy/observed_version``), or, with partial rollouts,
each token's own engine log-prob at the version that sampled it (checked per token).
"""

from __future__ import annotations

import time

from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.utils import tensordict_utils as tu
from verl.utils.debug import marked_timer

from verl_offpolicy.core.schedule import Schedule
from verl_offpolicy.glue.registration import OVERLAPPED_TRAINER
from verl_offpolicy.glue.scheduler import audit, store
from verl_offpolicy.glue.scheduler.dispatch import BackgroundDispatch
from verl_offpolicy.glue.scheduler.metrics import (
    GENERATED_BATCHES,
    OBSERVED_VERSION_MAX,
    OBSERVED_VERSION_MIN,
    ROLLOUT_BUSY_FRACTION,
    ROLLOUT_CALLS,
    SERVER_RECORDED_FRACTION,
    SYNC_WAIT_S,
    VALIDATION_PUSHES,
    WAIT_S,
    WEIGHT_PUSHES,
    engine_mismatch_metrics,
    fresh_token_metrics,
    token_version_metrics,
)
from verl_offpolicy.glue.scheduler.partial import CheckedVersions, VersionedClient, check_token_versions, token_versions
from verl_offpolicy.glue.scheduler.rollout import StandaloneRollout
from verl_offpolicy.glue.scheduler.trainer import (
    BEHAVIOUR_TAG,
    STEP_TAG,
    VERSION_TAG,
    OffPolicyTrainer,
    QueuedBatch,
)

# The per-prompt field verl's agent loop passes to the rollout as the request's priority (lower runs first).
PRIORITY_FIELD = "priority"


def with_priority(chunk, step: int):
    """``chunk`` (a batch of prompts for verl's agent loop) marked to generate as step ``step``'s: the rollout server
    generates the lowest priority first (verl's agent-loop ``priority``, vLLM's scheduling_policy=priority
    convention), so B_t before B_t+1 (docs/scheduler.md, what this does not order)."""
    tu.assign_non_tensor_data(chunk, PRIORITY_FIELD, step)
    return chunk


def submission_steps(schedule: Schedule, version: int, steps: list[int], queued_batches: int) -> list[int]:
    """The steps whose batches a submission at ``version`` hands the rollout, in schedule order; an error if the
    FIFO would then hold more than s + d batches."""
    if queued_batches + len(steps) > schedule.capacity:
        raise RuntimeError(
            f"offpolicy scheduler: submitting {len(steps)} batches of version {version} would hold "
            f"{queued_batches + len(steps)} > s + d = {schedule.capacity} batches"
        )
    assert all(schedule.version(step) == version for step in steps)
    return steps


@register_trainer(OVERLAPPED_TRAINER)
class OverlappedTrainer(OffPolicyTrainer):
    """The rollout generates on its own pool while the trainer trains; one weight push per version."""

    # verl's PPOTrainer._setup builds no colocated replicas (and a pure Actor worker) when this is False.
    _enable_hybrid_replicas = False

    def __init__(self, config):
        self.standalone: StandaloneRollout | None = None
        self.dispatch: BackgroundDispatch | None = None
        self._last_submission: tuple[int, int] | None = None  # (version, batches) of the last submission
        self._checked_versions: CheckedVersions | None = None  # partial rollouts: the head batch's, checked
        super().__init__(config)

    # ------------------------------------------------------------------ the standalone rollout

    def _setup(self):
        super()._setup()
        self.standalone = StandaloneRollout(self.config, self.actor_rollout_wg)

    def get_llm_client(self):
        # partial rollouts: verl's resuming client, recording each token's version (:mod:`.partial`)
        return self.standalone.client(VersionedClient if self.offpolicy.partial_rollout else None)

    def _rollout_server_managers(self) -> list:
        managers = super()._rollout_server_managers()
        if self.standalone is not None:
            managers.append(self.standalone.server_manager)
        return managers

    def fit(self, agent_loop_manager):
        # The trainer does not wait while the agent-loop workers take a batch (:mod:`.dispatch`).
        self.dispatch = BackgroundDispatch(agent_loop_manager)
        return super().fit(self.dispatch)

    def _raise_dispatch_failures(self) -> None:
        if self.dispatch is not None:
            self.dispatch.raise_failures()

    # ------------------------------------------------------------------ hooks

    def on_init_end(self):
        if self.global_steps > 0:
            # resumed: the queued batches were generated before the checkpoint, by versions up to the step it saved
            self.standalone.held.update(range(self.global_steps))
        self.standalone.push(self.global_steps)

    def on_train_begin(self):
        self._submit(self.global_steps - 1)  # fit() has advanced global_steps to the first step to train

    def on_step_end(self):
        if not self._generates_after(self.global_steps):
            return
        with marked_timer("update_weights", self.timing_raw, color="red"):
            # nothing of the previous version in flight (nothing aborted), unless partial rollouts interrupt it
            sync_wait = 0.0 if self.offpolicy.partial_rollout else self._wait_in_flight()
            metrics = self.standalone.push(self.global_steps)
        self._submit(self.global_steps)
        self._pending_sync_metrics = {**metrics, SYNC_WAIT_S: sync_wait}

    def on_validate_begin(self):
        if self.standalone.version == self.global_steps:  # a version's first step, or validation before training
            return
        with marked_timer("update_weights", self.timing_raw, color="red"):
            if not self.offpolicy.partial_rollout:
                self._wait_in_flight()  # the rollout's version generated all its batches: none sees the new weights
            self.standalone.push(self.global_steps, for_validation=True)

    def _save_checkpoint(self):
        # Nothing in flight at a checkpoint: the saved FIFO holds finished batches only, so a resumed run
        # never regenerates a batch under other weights (verl would re-issue in-flight prompts).
        self._wait_in_flight()
        super()._save_checkpoint()

    def _log_engine_mismatch(self, batch, metrics: dict) -> None:
        """Partial rollouts: the engines compared on the tokens the trainer's own weights sampled (version t − 1, so
        the proximal log-probs are at their generating weights), on every step that trains one, whatever the batch's
        staleness: ``offpolicy/engine_mismatch/*`` over them, their number and the largest log-prob gap
        (:func:`~.metrics.fresh_token_metrics`). The tokens' versions are those the step's check laid out
        (:class:`CheckedVersions`); no log-prob is read on a step without such a token. Otherwise the base's
        comparison."""
        if not self.offpolicy.partial_rollout:
            return super()._log_engine_mismatch(batch, metrics)
        if self._engine_mismatch_pair(0) is None:
            return
        keys = [k for k, t in zip(batch.keys, batch.tags, strict=True) if not t.get("is_padding", False)]
        folder = audit.audit_dir()
        checked = self._checked_versions
        versions = checked.rows(keys) if checked is not None and checked.step == self.global_steps else None
        if versions is not None and not folder:
            fresh = versions == self.global_steps - 1
            if not bool(fresh.any()):  # no such token: its count (0) alone, nothing to compare
                metrics.update(fresh_token_metrics(versions, versions, fresh))
                return
        read = audit.BATCH_FIELDS if folder else ("rollout_log_probs", "response_mask")
        fields = ["old_log_probs", *read] + (["extra_fields"] if versions is None else [])
        data = store.read(keys, fields, batch.partition_id)
        extra_fields = data.pop("extra_fields").tolist() if versions is None else None
        padded = data.to_padded_tensor()
        if versions is None:
            versions = token_versions(extra_fields, padded["response_mask"])  # -1 outside the mask
        else:
            versions = checked.rows(keys, width=padded["response_mask"].shape[-1])
        if folder:
            audit.save(audit.batch_path(folder, self.global_steps), audit.batch_payload(data, padded, versions))
        fresh = versions == self.global_steps - 1
        metrics.update(engine_mismatch_metrics(padded["old_log_probs"], padded["rollout_log_probs"], fresh))
        metrics.update(fresh_token_metrics(padded["old_log_probs"], padded["rollout_log_probs"], fresh))

    def _observed_version_metrics(self, entry: QueuedBatch) -> dict:
        """Partial rollouts: every response token's version, checked per token (:func:`.partial.check_token_versions`)
        against the versions pushed, and its statistics; otherwise the trajectories' versions (the base's check)."""
        if not self.offpolicy.partial_rollout:
            return super()._observed_version_metrics(entry)
        keys = list(self._trajectories(entry))
        data = store.read(keys, ["extra_fields", "response_mask"])
        extra_fields = data.pop("extra_fields").tolist()
        mask = data.to_padded_tensor()["response_mask"]
        stats, recorded, versions = check_token_versions(
            entry.step, entry.version, self.standalone.held, extra_fields, mask
        )
        self._checked_versions = CheckedVersions(entry.step, keys, versions)
        metrics = token_version_metrics(stats, entry.version)
        if recorded is not None:
            metrics[SERVER_RECORDED_FRACTION] = recorded
        if stats is not None:
            metrics.update(
                {OBSERVED_VERSION_MIN: float(stats.version_min), OBSERVED_VERSION_MAX: float(stats.version_max)}
            )
        return metrics

    # ------------------------------------------------------------------ submission and waiting

    def _submit(self, version: int) -> None:
        """Submit every batch of ``version`` not yet queued, in schedule order."""
        steps = self._steps_generated_at(version, self._queued_steps())
        if not steps:
            return
        for step in submission_steps(self.schedule, version, steps, len(self.replay_buffer.batches)):
            chunk = with_priority(self._next_train_batch(), step)
            uids = [str(u) for u in chunk["uid"]]
            store.tag(uids, [{STEP_TAG: step, VERSION_TAG: version, BEHAVIOUR_TAG: False}] * len(uids))
            self._submit_batch_to_rollout(chunk)
            self.replay_buffer.push(
                QueuedBatch(step=step, version=version, uids=uids, behaviour=False, settled=self.filter_groups is None)
            )
        self.replay_buffer.last_generation_size = len(steps)
        self._last_submission = (version, len(steps))

    def _submit_round(self, chunks: dict) -> None:
        """A top-up round: one agent-loop call per batch, priority = its step (as :meth:`_submit`)."""
        for step, chunk in chunks.items():
            self._submit_batch_to_rollout(with_priority(chunk, step))

    def _wait_in_flight(self) -> float:
        """Block until every submitted batch finished (and, with ``algorithm.filter_groups``, is filtered and
        topped up at the version the rollout holds); returns the seconds waited."""
        start = time.perf_counter()
        if self.dispatch is not None:
            self.dispatch.drain(self.generation_deadline.bound_s)
        uids = {uid for entry in self.replay_buffer.batches for uid in entry.uids}
        if uids:
            self._wait_for_generation(uids, self.standalone.version)
        partial = self.offpolicy.partial_rollout
        self._settle(self.replay_buffer.batches, self.standalone.version, newer_weights=partial)
        return time.perf_counter() - start

    def _make_batch_ready(self) -> dict:
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
            if not entry.settled and self.offpolicy.partial_rollout:
                # not settled before the push: B_t alone, its top-ups sampled by the weights the rollout holds now
                self._settle([entry], self.standalone.version, newer_weights=True)
            elif not entry.settled:  # its version is the one the rollout holds (settled before every push)
                self._settle(self.replay_buffer.batches, self.standalone.version)
            self._wait_for_generation(set(entry.uids), entry.version)
        version, batches = self._last_submission if self._last_submission else (None, 0)
        submitted = version == step - 1
        metrics = {
            WAIT_S: time.perf_counter() - start,
            ROLLOUT_CALLS: float(submitted),
            GENERATED_BATCHES: float(batches if submitted else 0),
            WEIGHT_PUSHES: float(self.standalone.pushes),
            VALIDATION_PUSHES: float(self.standalone.validation_pushes),
        }
        busy = self.standalone.busy_fraction()
        if busy is not None:
            metrics[ROLLOUT_BUSY_FRACTION] = busy
        return metrics
