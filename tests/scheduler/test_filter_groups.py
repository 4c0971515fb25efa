"""DAPO dynamic sampling under the scheduler (``algorithm.filter_groups``, docs/scheduler.md).

Fast tier: which groups verl's rule drops (vectorised), the rounds of a version (top-ups sized 2 × missing,
kept groups taken in submission order, the surplus), the exhaustion error, the metrics, the metric read
from verl's fields, and the startup rules on verl's composed config. End to end (e2e, slow): a colocated CPU
demo run at (2, 1) with filtering, whose logged versions equal the schedule, whose filter metrics add up and
which trains only groups with a spread (a shared job of tests/scenario_runs.py); ``-m extended`` adds the
overlapped run and its equality with the colocated one (the default run keeps the overlapped mode's equality
with colocated at (2, 1) without filtering: tests/scheduler/test_overlapped.py).
"""

from __future__ import annotations

import re

import pytest
import torch
from verl.trainer.ppo.v1.replay_buffer import DAPO_FILTERED_REWARD_COUNTS_KEY

from tests.hydra_utils import VALID_SIZES, compose_main_ppo
from tests.jobs import queued_at_start
from tests.scenario_runs import dapo_run
from verl_offpolicy.demo.repeat_task import make_row, write_splits
from verl_offpolicy.glue.scheduler.filtering import (
    FilterGroupsExhausted,
    VersionFill,
    check_filter_metric,
    trajectory_metric,
    zero_spread_groups,
)
from verl_offpolicy.glue.scheduler.metrics import filter_metrics
from verl_offpolicy.glue.validation import OffPolicyConfigError, validate_offpolicy_config

# ------------------------------------------------------------------------------ the group rule


def test_groups_whose_metric_is_the_same_on_every_sample_are_dropped():
    # group: 0 = [1, 1] same -> dropped; 1 = [0, 1] spread -> kept; 2 = [0.1, 0.1, 0.1] same -> dropped
    # (numpy's std of it is 1.4e-17, not 0: equality is tested, not a float std); 3 = [3] one sample ->
    # kept (no spread to measure, verl's len > 1); 4 = no sample -> kept; 5 = [0, 0, 0, 0.125] -> kept
    values = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.1, 0.1, 0.1, 3.0, 0.0, 0.0, 0.0, 0.125])
    group = torch.tensor([0, 0, 1, 1, 2, 2, 2, 3, 5, 5, 5, 5])
    assert zero_spread_groups(values, group, 6).tolist() == [True, False, True, False, False, False]


def test_the_metric_is_read_as_verl_reads_it():
    # "reward": the sum of each trajectory's rm_scores, as verl's filter reads it (verl's reward loop puts the
    # score on the last response token; a sum over several tokens counts them all): 0.25 + 0.5, 0.25
    scores = torch.nested.nested_tensor(
        [torch.tensor([0.25, 0.0, 0.5]), torch.tensor([0.0, 0.25])], layout=torch.jagged
    )
    assert trajectory_metric({"rm_scores": scores}, "reward").tolist() == [0.75, 0.25]
    assert trajectory_metric({"rm_scores": torch.tensor([[0.5, 0.5], [0.0, 0.0]])}, "reward").tolist() == [1.0, 0.0]
    # any other name: the trajectory's reward_extra_info
    extra = [{"reward_extra_info": {"acc": 1.0}}, {"reward_extra_info": {"acc": 0.0}}]
    assert trajectory_metric({"extra_fields": extra}, "acc").tolist() == [1.0, 0.0]
    with pytest.raises(
        RuntimeError,
        match=r"algorithm.filter_groups.metric='score' is not in a trajectory's reward_extra_info \(keys: \['acc'\]\)",
    ):
        trajectory_metric({"extra_fields": extra}, "score")


# ------------------------------------------------------------------------------ the rounds of a version


def _round(uids, dropped, value=0.0):
    return (uids, dropped, [value] * len(uids))


def test_a_version_is_topped_up_until_every_batch_is_full():
    # Version 2 generates steps 4 and 5 (4 groups each). Round 1: step 4 keeps a1, a3 (a2, a4 dropped at
    # reward 0), step 5 keeps all. Step 4 misses 2 -> the top-up asks 2 x 2 = 4 prompts for step 4 only.
    fill = VersionFill.start(version=2, sizes={4: 4, 5: 4}, max_rounds=3, metric="reward")
    fill.record_round(
        {
            4: _round(["a1", "a2", "a3", "a4"], [False, True, False, True]),
            5: _round(["b1", "b2", "b3", "b4"], [False] * 4),
        }
    )
    assert fill.top_ups() == {4: 4}
    # Round 2 (the same version's weights: one VersionFill per version): c1 dropped (reward 1), c2..c4 kept.
    # Step 4 takes its kept groups in submission order, a1 a3 c2 c3; c4 is surplus.
    fill.record_round({4: (["c1", "c2", "c3", "c4"], [True, False, False, False], [1.0, 0, 0, 0])})
    assert fill.top_ups() == {}
    four, five = fill.batches[4], fill.batches[5]
    assert (four.selected, four.surplus, four.dropped) == (["a1", "a3", "c2", "c3"], ["c4"], ["a2", "a4", "c1"])
    assert (four.generated, dict(four.dropped_values)) == (8, {0.0: 2, 1.0: 1})
    assert (five.selected, five.surplus, five.generated) == (["b1", "b2", "b3", "b4"], [], 4)
    assert fill.rounds == 2
    assert fill.describe() == (
        "offpolicy scheduler: algorithm.filter_groups at version 2: 2 generation rounds, 12 prompt groups generated, "
        "3 dropped (same reward on every sample; value: groups = {0.0: 2, 1.0: 1}), 1 surplus discarded, steps "
        "[4, 5] full"
    )


def test_the_rounds_bound_stops_the_run_with_what_to_do():
    # max_num_gen_batches = 2: round 1 drops all 4 groups of step 1 (3 at reward 0, 1 at 1), round 2's 8
    # prompts keep 1: still 3 short after 2 rounds.
    fill = VersionFill.start(version=0, sizes={1: 4, 2: 4}, max_rounds=2, metric="reward")
    fill.record_round(
        {
            1: (["a1", "a2", "a3", "a4"], [True] * 4, [0.0, 0.0, 0.0, 1.0]),
            2: _round(["b1", "b2", "b3", "b4"], [False] * 4),
        }
    )
    assert fill.top_ups() == {1: 8}
    fill.record_round({1: _round([f"c{i}" for i in range(8)], [True] * 7 + [False])})
    with pytest.raises(FilterGroupsExhausted) as info:
        fill.top_ups()
    assert str(info.value) == (
        "offpolicy scheduler: algorithm.filter_groups.max_num_gen_batches=2 exhausted: version 0 generated 16 prompt "
        "groups in 2 rounds and kept 5 of the 8 its batches need (steps [1] are short by [3] groups); 11 groups had "
        "the same reward on every sample (value: groups = {0: 10, 1: 1}). The prompts are too hard or too easy for the "
        "model at this version: raise algorithm.filter_groups.max_num_gen_batches (<= 0: no bound), use more samples "
        "per prompt (actor_rollout_ref.rollout.n), or set algorithm.filter_groups.enable=false"
    )


def test_no_bound_keeps_topping_up():
    # max_num_gen_batches <= 0 is verl's "no upper limit": 10 rounds that keep nothing still ask for more
    fill = VersionFill.start(version=0, sizes={1: 2}, max_rounds=0, metric="acc")
    for round_ in range(10):
        fill.record_round({1: _round([f"r{round_}_{i}" for i in range(4)], [True] * 4)})
        assert fill.top_ups() == {1: 4}


def test_each_round_that_leaves_a_batch_short_says_so_and_names_a_missing_bound():
    """max_num_gen_batches <= 0 generated forever without a log line on a task where no group has spread."""
    fill = VersionFill.start(version=3, sizes={1: 2}, max_rounds=0, metric="acc")
    fill.record_round({1: _round(["a", "b", "c", "d"], [True, True, True, False])})  # 1 of 2 kept
    line = fill.round_line({1: fill.top_ups() and fill.batches[1].missing})
    assert line == (
        "offpolicy scheduler: algorithm.filter_groups at version 3: round 1, no bound "
        "(algorithm.filter_groups.max_num_gen_batches=0; set it > 0 to stop a version that cannot fill): "
        "kept 1 of the 2 groups its batches need after 4 generated; 1 still missing, generating more"
    )
    bounded = VersionFill.start(version=0, sizes={1: 2}, max_rounds=5, metric="acc")
    bounded.record_round({1: _round(["a", "b"], [True, True])})
    assert "round 1 of at most 5: kept 0 of the 2" in bounded.round_line({1: 2})


def test_filter_metrics_account_for_every_generated_group():
    # step 4 above: 8 generated = 4 trained + 3 dropped + 1 surplus, its version took 2 rounds
    assert filter_metrics(8, 3, 1, 2, dropped_values={0.0: 2, 1.0: 1}) == {
        "offpolicy/filter_groups/generated_groups": 8.0,
        "training/filter_groups/evicted_samples": 3.0,
        "training/filter_groups/discarded_surplus_samples": 1.0,
        "offpolicy/filter_groups/gen_rounds": 2.0,
        DAPO_FILTERED_REWARD_COUNTS_KEY: {0.0: 2, 1.0: 1},  # verl's trainer makes its wandb table of it
    }
    assert DAPO_FILTERED_REWARD_COUNTS_KEY not in filter_metrics(4, 0, 0, 1)


# ------------------------------------------------------------------------------ startup rules

FILTER = [
    "algorithm.filter_groups.enable=true",
    "algorithm.filter_groups.metric=reward",
    "algorithm.filter_groups.max_num_gen_batches=4",
]


def _validate(extra):
    validate_offpolicy_config(compose_main_ppo("offpolicy_trainer", ["algorithm=opmd", *VALID_SIZES, *extra]))


@pytest.mark.slow
def test_filter_groups_is_accepted_with_the_scheduler_and_checked():
    _validate(FILTER + ["algorithm.offpolicy.sync_interval=2", "algorithm.offpolicy.sync_offset=1"])
    _validate(FILTER + ["algorithm.filter_groups.max_num_gen_batches=0", "algorithm.filter_groups.metric=acc"])
    with pytest.raises(OffPolicyConfigError, match=r"but metric=None: set it to 'reward' \(verl's canonical reward"):
        _validate(FILTER + ["algorithm.filter_groups.metric=null"])
    with pytest.raises(OffPolicyConfigError, match=r"max_num_gen_batches must be an integer: .* got 2.5"):
        _validate(FILTER + ["algorithm.filter_groups.max_num_gen_batches=2.5"])
    with pytest.raises(OffPolicyConfigError, match=r"actor_rollout_ref.rollout.n=1 gives one sample per group"):
        _validate(FILTER + ["actor_rollout_ref.rollout.n=1"])
    with pytest.raises(OffPolicyConfigError, match=r"set reward.reward_model.enable_resource_pool=true"):
        _validate(FILTER + ["reward.reward_model.enable=true"])


def _filter_config(tmp_path, metric, reward_source=None):
    """The composed config of a filtered run on a one-row repeat task; ``reward_source``: a reward function file."""
    files = write_splits(tmp_path, [make_row("a", 0, "train", 4)], [make_row("a", 0, "test", 4)])
    extra = [f"data.train_files={files['train_files']}", f"algorithm.filter_groups.metric={metric}"]
    if reward_source is not None:
        (tmp_path / "reward.py").write_text(reward_source)
        extra += [
            f"reward.custom_reward_function.path={tmp_path / 'reward.py'}",
            "reward.custom_reward_function.name=score",
        ]
    else:
        extra += ["reward.custom_reward_function.path=pkg://verl_offpolicy.cpu.task"]
    return compose_main_ppo("offpolicy_trainer", ["algorithm=opmd", *VALID_SIZES, *FILTER[:1], *extra])


DICT_REWARD = (
    "def score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n    return {'score': 1.0, 'hit': 1}\n"
)


@pytest.mark.parametrize(
    "metric,reward_source,allowed",
    [
        ("reward", None, None),  # verl's canonical reward: always there
        ("acc", None, None),  # a number-valued reward function: verl's manager names it acc
        ("bogus", None, "['acc', 'reward']"),
        ("hit", DICT_REWARD, None),  # a dict-valued one: its keys
        ("acc", DICT_REWARD, "['hit', 'reward', 'score']"),
    ],
)
def test_the_filter_metric_is_checked_against_the_reward_functions_answer(tmp_path, metric, reward_source, allowed):
    """The metric is looked up in each trajectory's reward_extra_info at the first filtered version (minutes into
    a run): startup calls the configured reward function on the first training row, as verl's naive manager does
    (a dict's keys; a number becomes ``acc``), and names the allowed values."""
    config = _filter_config(tmp_path, metric, reward_source)
    if allowed is None:
        check_filter_metric(config)
        return
    with pytest.raises(ValueError, match=rf"metric='{metric}' is not a value .* allowed values: {re.escape(allowed)}"):
        check_filter_metric(config)


def test_the_filter_metric_says_when_it_cannot_be_checked(tmp_path, capsys):
    config = _filter_config(tmp_path, "bogus")
    config.data.train_files = str(tmp_path / "absent.parquet")
    check_filter_metric(config)
    assert "metric='bogus' not checked before the run: no training file at data.train_files=" in capsys.readouterr().err


# ------------------------------------------------------------------------------ end to end

# (2, 1), steps 1..4, from docs/scheduler.md's table: versions 0 0 0 2, staleness 0 1 2 1; version 0 generates
# steps 1-3 (right before step 1), version 2 step 4 (right before step 3).
E2E_VERSIONS = [0, 0, 0, 2]
E2E_STALENESS = [0, 1, 2, 1]
GENERATED_BY = {1: 0, 2: 0, 3: 0, 4: 2}  # step -> the version whose rounds it shares
BATCH = 4  # tests/scenario_runs.SMALL_DEMO: 4 prompts x 4 samples per step


@queued_at_start(scope="module")
def colocated_dapo_run(demo_runs):
    """The colocated filtered run (the default tier's)."""
    return dapo_run(demo_runs, "colocated")


@queued_at_start(scope="module")
def extended_dapo_runs(demo_runs):
    """Both filtered runs (queued only in a session that selects an extended test)."""
    jobs = {mode: dapo_run(demo_runs, mode) for mode in ("colocated", "overlapped")}
    return lambda mode: jobs[mode].result()


@queued_at_start(scope="module")
def partial_dapo_run(demo_runs):
    """The overlapped filtered run with partial rollouts (queued only in a session that selects its test)."""
    partial = ["algorithm.offpolicy.partial_rollout=true", "algorithm.offpolicy.ratio_anchor=rollout"]
    return dapo_run(demo_runs, "overlapped", partial, name="dapo_partial_s2d1")


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_filtered_runs_keep_exact_versions(colocated_dapo_run):
    _check_filtered_run(colocated_dapo_run.result().metrics)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(1800)
def test_filtered_overlapped_run_keeps_exact_versions(extended_dapo_runs):
    _check_filtered_run(extended_dapo_runs("overlapped").metrics)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(1800)
def test_a_filtered_run_with_partial_rollouts_keeps_every_token_within_its_batchs_versions(partial_dapo_run):
    """With partial rollouts B_t is filtered when step t needs it, its top-ups sampled by the weights the rollout
    holds then: at (2, 1) version 0 for steps 1-2 and version 2 (pushed after step 2) for step 3's batch, scheduled
    at 0. Every token within [v(t), t − 1] and equal to the hf server's record (the run checks each), a batch's
    top-ups within its own versions, and the filter's accounting as without partial rollouts."""
    metrics = partial_dapo_run.result().metrics
    holds = {1: 0, 2: 0, 3: 2, 4: 2}  # the version the rollout holds when step t's batch is filtered
    for m in metrics:
        step = m["step"]
        assert E2E_VERSIONS[step - 1] <= m["offpolicy/token_version/min"], step
        assert m["offpolicy/token_version/max"] <= holds[step], step
        assert m["offpolicy/token_version/server_recorded_fraction"] == 1.0, step
        if step == 3 and m["offpolicy/filter_groups/gen_rounds"] > 1:
            assert m["offpolicy/token_version/max"] == 2  # its top-ups: sampled by version 2
    _check_filter_accounting(metrics, shared_rounds=False)


def _check_filtered_run(metrics):
    """The claim of the two tests above on a filtered run's metrics."""
    for key in ("mean", "max", "min"):  # verl's staleness of every trained trajectory, top-ups included
        assert [int(m[f"training/off_policy/trajectory_staleness/{key}"]) for m in metrics] == E2E_STALENESS
    # the rollout's own report of the weights of every trained trajectory is the scheduled version
    assert [(m["offpolicy/observed_version/min"], m["offpolicy/observed_version/max"]) for m in metrics] == [
        (v, v) for v in E2E_VERSIONS
    ]
    _check_filter_accounting(metrics, shared_rounds=True)


def _check_filter_accounting(metrics, shared_rounds: bool):
    """Every generated group trained, dropped or surplus; top-ups where groups were dropped, and at least one; with
    ``shared_rounds`` the batches of one version share their rounds (filtered together before its push)."""
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert [int(m["offpolicy/version"]) for m in metrics] == E2E_VERSIONS
    for m in metrics:
        generated, dropped = m["offpolicy/filter_groups/generated_groups"], m["training/filter_groups/evicted_samples"]
        surplus = m["training/filter_groups/discarded_surplus_samples"]
        assert generated == BATCH + dropped + surplus, m["step"]  # every generated group trained, dropped or surplus
        # a batch that lost groups was topped up (more groups, more rounds); one that lost none got nothing more
        assert (dropped > 0) == (generated > BATCH), m["step"]
        assert dropped == 0 or m["offpolicy/filter_groups/gen_rounds"] > 1, m["step"]
    rounds = {m["step"]: m["offpolicy/filter_groups/gen_rounds"] for m in metrics}
    if shared_rounds:
        by_version = {GENERATED_BY[step]: n for step, n in rounds.items()}
        assert all(n == by_version[GENERATED_BY[step]] for step, n in rounds.items())
    # the demo's tiny model gives many groups one reward on every sample: filtering acted, a top-up happened
    assert sum(m["training/filter_groups/evicted_samples"] for m in metrics) > 0
    assert max(rounds.values()) > 1


def _trained_groups(run) -> dict[int, list[tuple]]:
    """Per step, each trained prompt group's (prompt, sorted (response, score) of its samples), from verl's
    rollout dumps."""
    import json
    from collections import defaultdict
    from pathlib import Path

    out = {}
    for step in range(1, len(E2E_VERSIONS) + 1):
        groups = defaultdict(list)
        for line in (Path(run.output_dir) / "rollouts" / f"{step}.jsonl").read_text().splitlines():
            row = json.loads(line)
            groups[(row["uid"].split("_")[0], row["input"])].append((row["output"], row["score"]))
        out[step] = sorted((prompt, tuple(sorted(samples))) for (_, prompt), samples in groups.items())
    return out


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_only_groups_with_a_spread_are_trained(colocated_dapo_run):
    for step, groups in _trained_groups(colocated_dapo_run.result()).items():
        assert len(groups) == BATCH, step
        assert all(len({score for _, score in samples}) > 1 for _, samples in groups), step  # no zero-spread group


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(1800)
def test_both_modes_train_the_same_filtered_groups(extended_dapo_runs):
    colocated, overlapped = (
        _trained_groups(extended_dapo_runs("colocated")),
        _trained_groups(extended_dapo_runs("overlapped")),
    )
    # the same prompts drawn in the same order (the version's batches, then each round's top-ups in step order),
    # generated at the same versions: the same samples
    assert overlapped == colocated
