"""DAPO dynamic sampling (``algorithm.filter_groups``, verl's keys) inside the schedule, versions exact.

A version's batches are generated in that version's rollout call; then, while the rollout still holds
that version's weights, every prompt group whose metric is the same on all its samples is dropped
(verl's rule, ``ReplayBuffer._dapo_filtered_keys``: zero spread, so zero GRPO advantage) and each batch
short of groups is topped up with new prompts generated **at the same version**, in rounds, until every
batch has its ``data.train_batch_size`` groups. A trained sample therefore keeps the version and the
staleness of the schedule. Per round:

- round 1 is the version's scheduled batches; a round r ≥ 2 submits, for each batch still missing m
  groups, :data:`TOP_UP_FACTOR` · m new prompts (verl's sync DAPO refill: k evicted, 2k refilled);
- a batch takes its kept groups in submission order; kept groups beyond its size are the surplus,
  discarded (verl's ``discarded_surplus_samples``);
- ``algorithm.filter_groups.max_num_gen_batches`` R > 0 bounds the rounds of a version (≤ 0: no bound,
  verl's meaning); a version still short after R rounds stops the run with
  :class:`FilterGroupsExhausted`.

:class:`VersionFill` is that arithmetic (pure, no I/O); :func:`zero_spread_groups` the vectorised group
statistic; :func:`trajectory_metric` reads verl's metric of each trajectory from TransferQueue. The trainer
(:meth:`~verl_offpolicy.glue.scheduler.trainer.OffPolicyTrainer._settle`) runs the rounds; the startup rules
are :func:`~verl_offpolicy.glue.scheduler.checks.check_filter_groups`.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from omegaconf import OmegaConf

from verl_offpolicy.glue.scheduler.checks import FILTER_GROUPS

# verl's sync DAPO refill rule (ReplayBuffer.sample: "Each k evictions add 2k logical refill credits").
TOP_UP_FACTOR = 2


@dataclass(frozen=True)
class FilterGroups:
    """The enabled ``algorithm.filter_groups`` section (validated at startup by ``check_filter_groups``)."""

    metric: str  # "reward": verl's canonical pre-KL reward (rm_scores); else a reward_extra_info key
    max_num_gen_batches: int  # generation rounds per version; <= 0: no bound

    @classmethod
    def of(cls, config) -> "FilterGroups | None":
        section = config.algorithm.get("filter_groups", None)
        if section is None or not section.get("enable", False):
            return None
        return cls(
            metric=str(section.get("metric")), max_num_gen_batches=int(section.get("max_num_gen_batches", 0) or 0)
        )


class FilterGroupsExhausted(RuntimeError):
    """A version's batches are still short of groups after ``max_num_gen_batches`` generation rounds."""


def zero_spread_groups(values: torch.Tensor, group: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Bool [num_groups]: the groups verl's DAPO filter drops, i.e. with at least two samples whose
    ``values`` (one per sample, ``group`` its group index) are all equal (max = min: zero std, exactly).

    Vectorised (scatter reductions); a group without samples, or with one, is kept (verl: ``len > 1``). verl tests
    ``np.std(values) == 0``, which misses some equal values (numpy's std of [0.1, 0.1, 0.1] is 1.4e-17).
    """
    values = values.to(torch.float64)
    high = torch.full((num_groups,), -torch.inf, dtype=torch.float64).scatter_reduce(0, group, values, "amax")
    low = torch.full((num_groups,), torch.inf, dtype=torch.float64).scatter_reduce(0, group, values, "amin")
    count = torch.bincount(group, minlength=num_groups)
    return (count > 1) & (high == low)


def metric_field(metric: str) -> str:
    """The TransferQueue field :func:`trajectory_metric` reads ``metric`` from: ``rm_scores`` for verl's
    ``reward``, ``extra_fields`` (its ``reward_extra_info``) for any other name."""
    # verl's name (imported here: importing verl.trainer.ppo.v1 registers the trainers, which import this module)
    from verl.trainer.ppo.v1.replay_buffer import FILTER_GROUPS_REWARD_METRIC

    return "rm_scores" if metric == FILTER_GROUPS_REWARD_METRIC else "extra_fields"


def trajectory_metric(data: Any, metric: str) -> torch.Tensor:
    """One value of ``metric`` per trajectory of ``data`` (TransferQueue fields, as verl reads them):
    ``reward`` sums each trajectory's ``rm_scores`` (verl's canonical pre-KL reward); any other name is
    read from the trajectory's ``extra_fields['reward_extra_info']`` (a missing one raises, naming it)."""
    if metric_field(metric) == "rm_scores":
        scores = data["rm_scores"]
        if isinstance(scores, torch.Tensor) and scores.is_nested:
            scores = scores.to_padded_tensor(0.0)
        elif not isinstance(scores, torch.Tensor):
            return torch.tensor([float(torch.as_tensor(s).sum()) for s in scores], dtype=torch.float64)
        return scores.to(torch.float64).reshape(scores.shape[0], -1).sum(-1)
    values = []
    for extra in data["extra_fields"]:
        extra = getattr(extra, "data", extra)
        info = extra.get("reward_extra_info", {}) if isinstance(extra, dict) else {}
        if metric not in info:
            raise RuntimeError(
                f"offpolicy scheduler: {FILTER_GROUPS}.metric={metric!r} is not in a trajectory's reward_extra_info "
                f"(keys: {sorted(info)}): use 'reward' or a key your reward function returns"
            )
        values.append(float(info[metric]))
    return torch.tensor(values, dtype=torch.float64)


def classify_groups(
    buffer: Any, pending: dict[int, list[str]], metric: str
) -> dict[int, tuple[list[str], list[bool], list[float]]]:
    """For each step's groups of this round (``pending``: step -> prompt uids), in verl's replay ``buffer``: whether
    verl's filter drops it (:func:`zero_spread_groups`; the metric is the same on every sample of a finished group;
    a failed group stays, as verl's sync sampler keeps it) and that shared value."""
    from verl_offpolicy.glue.scheduler import store
    from verl_offpolicy.glue.scheduler.store import TRAIN

    buffer._sync_metadata_from_transfer_queue()
    order = [uid for uids in pending.values() for uid in uids]
    index = {uid: i for i, uid in enumerate(order)}
    finished = buffer.finished_keys[TRAIN]
    keys = [k for k in buffer.partitions[TRAIN] if k.split("_")[0] in index and k.split("_")[0] in finished]
    dropped = torch.zeros(len(order), dtype=torch.bool)
    shared = torch.zeros(len(order), dtype=torch.float64)
    missing = {uid for uid in index if uid in finished} - {k.split("_")[0] for k in keys}
    if missing:
        raise RuntimeError(f"offpolicy scheduler: finished prompt groups without trajectories: {sorted(missing)[:5]}")
    if keys:
        values = trajectory_metric(store.read(keys, [metric_field(metric)]), metric)
        group = torch.tensor([index[k.split("_")[0]] for k in keys], dtype=torch.long)
        dropped = zero_spread_groups(values, group, len(order))
        shared = shared.scatter_reduce(0, group, values, "amax", include_self=False)
    dropped_list, shared_list = dropped.tolist(), shared.tolist()
    out, start = {}, 0
    for step, uids in pending.items():
        out[step] = (uids, dropped_list[start : start + len(uids)], shared_list[start : start + len(uids)])
        start += len(uids)
    return out


@dataclass
class BatchFill:
    """One scheduled batch (step ``step``, ``size`` groups) through its version's rounds."""

    step: int
    size: int
    kept: list[str] = field(default_factory=list)  # groups kept by the filter, in submission order
    dropped: list[str] = field(default_factory=list)  # groups the filter dropped
    dropped_values: Counter = field(default_factory=Counter)  # the shared metric value of each dropped group
    generated: int = 0  # groups submitted for this batch, every round

    @property
    def missing(self) -> int:
        return max(0, self.size - len(self.kept))

    @property
    def selected(self) -> list[str]:
        return self.kept[: self.size]

    @property
    def surplus(self) -> list[str]:
        return self.kept[self.size :]


@dataclass
class VersionFill:
    """The batches of one version through their generation rounds (module docstring)."""

    version: int
    batches: dict[int, BatchFill]  # step -> its batch
    max_rounds: int  # algorithm.filter_groups.max_num_gen_batches; <= 0: no bound
    metric: str
    rounds: int = 0

    @classmethod
    def start(cls, version: int, sizes: dict[int, int], max_rounds: int, metric: str) -> "VersionFill":
        return cls(version, {step: BatchFill(step, size) for step, size in sorted(sizes.items())}, max_rounds, metric)

    def record_round(self, results: dict[int, tuple[Sequence[str], Sequence[bool], Sequence[float]]]) -> None:
        """One round's outcome per step: its groups in submission order, whether each was dropped, and the
        metric value each dropped group shares (anything for a kept one)."""
        self.rounds += 1
        for step, (uids, dropped, values) in results.items():
            batch = self.batches[step]
            batch.generated += len(uids)
            for uid, drop, value in zip(uids, dropped, values, strict=True):
                if drop:
                    batch.dropped.append(uid)
                    batch.dropped_values[float(value)] += 1
                else:
                    batch.kept.append(uid)

    def top_ups(self) -> dict[int, int]:
        """The prompts the next round submits per short batch (:data:`TOP_UP_FACTOR` × its missing groups), in
        step order; empty when every batch is full. Raises :class:`FilterGroupsExhausted` if a batch is short
        and the version has had its ``max_num_gen_batches`` rounds."""
        short = {step: b.missing for step, b in self.batches.items() if b.missing}
        if not short:
            return {}
        if 0 < self.max_rounds <= self.rounds:
            raise FilterGroupsExhausted(self.exhausted_message(short))
        return {step: TOP_UP_FACTOR * missing for step, missing in short.items()}

    @property
    def generated(self) -> int:
        """Prompt groups submitted for the version's batches, every round."""
        return sum(b.generated for b in self.batches.values())

    @property
    def dropped_values(self) -> Counter:
        """The shared metric value of each dropped group, over the version's batches."""
        return sum((b.dropped_values for b in self.batches.values()), Counter())

    def exhausted_message(self, short: dict[int, int]) -> str:
        need = sum(b.size for b in self.batches.values())
        kept = sum(min(len(b.kept), b.size) for b in self.batches.values())
        generated, values = self.generated, self.dropped_values
        shared = ", ".join(f"{value:g}: {count}" for value, count in sorted(values.items()))
        return (
            f"offpolicy scheduler: {FILTER_GROUPS}.max_num_gen_batches={self.max_rounds} exhausted: version "
            f"{self.version} generated {generated} prompt groups in {self.rounds} "
            f"round{'s' if self.rounds > 1 else ''} and kept {kept} of the {need} its "
            f"batches need (steps {sorted(short)} are short by {[short[s] for s in sorted(short)]} groups); "
            f"{sum(values.values())} groups had the same {self.metric} on every sample (value: groups = {{{shared}}}). "
            "The prompts are too hard or too easy for the model at this version: raise "
            f"{FILTER_GROUPS}.max_num_gen_batches "
            "(<= 0: no bound), use more samples per prompt (actor_rollout_ref.rollout.n), or set "
            f"{FILTER_GROUPS}.enable=false"
        )

    def round_line(self, short: dict[int, int]) -> str:
        """One log line per round that leaves a batch short: the version's progress, and its bound (or that it has
        none: ``max_num_gen_batches <= 0`` is verl's "no bound", and a task where no group has spread never fills)."""
        need = sum(b.size for b in self.batches.values())
        kept = sum(min(len(b.kept), b.size) for b in self.batches.values())
        bound = (
            f"round {self.rounds} of at most {self.max_rounds}"
            if self.max_rounds > 0
            else f"round {self.rounds}, no bound ({FILTER_GROUPS}.max_num_gen_batches={self.max_rounds}; set it "
            "> 0 to stop "
            "a version that cannot fill)"
        )
        return (
            f"offpolicy scheduler: {FILTER_GROUPS} at version {self.version}: {bound}: kept {kept} of the {need} "
            "groups "
            f"its batches need after {self.generated} generated; {sum(short.values())} still missing, generating more"
        )

    def describe(self) -> str:
        """One log line: what the version generated, filtered and kept."""
        generated, values = self.generated, self.dropped_values
        dropped = sum(len(b.dropped) for b in self.batches.values())
        surplus = sum(len(b.surplus) for b in self.batches.values())
        return (
            f"offpolicy scheduler: {FILTER_GROUPS} at version {self.version}: {self.rounds} generation "
            f"round{'s' if self.rounds > 1 else ''}, "
            f"{generated} prompt groups generated, {dropped} dropped (same {self.metric} on every sample; value: "
            "groups = "
            f"{dict(sorted(values.items()))}), {surplus} surplus discarded, steps {sorted(self.batches)} full"
        )


def returned_metric_names(config) -> set[str] | str:
    """The names ``algorithm.filter_groups.metric`` can take for this config: ``reward`` and the
    ``reward_extra_info`` keys verl's reward manager builds from the reward function's answer on the first
    training row (scored against its own ground truth), as the reward workers will. A string says why that
    cannot be known before the run (another reward manager, a reward model, no training file yet)."""
    from verl_offpolicy.glue.reward_probe import first_row_answers

    answers = first_row_answers(config)
    if isinstance(answers, str):
        return answers
    keys = set(answers[0]) if isinstance(answers[0], dict) else {"acc"}
    return {"reward", *keys}


def check_filter_metric(config) -> None:
    """``algorithm.filter_groups.metric`` must be a name verl's reward loop gives each trajectory (else the run
    stops at its first filtered version); ``ValueError`` naming the names there are. Prints why it could not
    check, if it could not."""
    section = OmegaConf.select(config, FILTER_GROUPS, default=None)
    if not section or not section.get("enable", False):
        return
    metric = section.get("metric")
    names = returned_metric_names(config)
    if isinstance(names, str):
        print(
            f"verl-offpolicy: note: {FILTER_GROUPS}.metric={metric!r} not checked before the run: {names}",
            file=sys.stderr,
        )
    elif metric not in names:
        raise ValueError(
            f"{FILTER_GROUPS}.metric={metric!r} is not a value verl's reward loop gives a trajectory: the reward "
            f"function returns {sorted(names - {'reward'})} for the first training row; allowed values: {sorted(names)}"
        )
