"""Partial rollouts (``algorithm.offpolicy.partial_rollout=true``, :mod:`verl_offpolicy.glue.scheduler.partial`).

Fast tier: the client's version segments and the server's own record across an interrupted call and across turns
(verl's real resume loop, ``FullyAsyncLLMServerClient``, over a scripted server call), the per-token check, its
comparison with the server's record and their negative controls, and the startup rules. End to end (e2e): the tool
task with a tool latency at (1, 1) in the overlapped mode, where a push falls between a trajectory's turns:
per-token versions within the contract on every step, each equal to the hf server's record, and trajectories that
span versions (on verl's vLLM rollout too, ``-m extended``). ``-m extended`` also holds the run resumed from its
step-3 checkpoint (the default run keeps the overlapped resume, the same save and restore of the FIFO, in
tests/scheduler/test_overlapped.py) and the same run with its pushes tagged one version ahead, which stops at its
first step (the default run keeps the per-token check's negative controls in the fast tier, on the check the run
calls).
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from tests.hydra_utils import VALID_SIZES, compose_main_ppo
from tests.jobs import queued_at_start
from tests.markers import needs_vllm
from tests.scenario_runs import PRIMARY_CONFIG, SMALL_DEMO, STANDALONE, dumped_batches, schedule, start_resumed
from tests.scenario_schedule import OVERLAPPED
from verl_offpolicy.glue.scheduler.audit import AUDIT_DIR_ENV, batch_path, weights_path
from verl_offpolicy.glue.scheduler.metrics import FRESH_LOGPROB_GAP_MAX, FRESH_TOKENS, SERVER_RECORDED_FRACTION
from verl_offpolicy.glue.scheduler.partial import (
    SAMPLED_VERSIONS,
    TOKEN_VERSIONS,
    UNRECORDED,
    CheckedVersions,
    VersionedClient,
    check_server_record,
    check_token_versions,
)
from verl_offpolicy.glue.scheduler.rollout import PUSH_VERSION_FAULT_ENV, ObservedVersionError
from verl_offpolicy.glue.validation import OffPolicyConfigError, validate_offpolicy_config

# ------------------------------------------------------------------------------ the client's segments


def _scripted(monkeypatch, script):
    """The base client's server call replaced by ``script`` (request id -> outputs, one per call: version, tokens,
    stop reason and, optionally, the server's own record of the call): the only stand-in here, for the Ray actor of
    a rollout server; verl's resume loop above it is real."""
    calls = {key: list(outputs) for key, outputs in script.items()}

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        version, tokens, stop, *sampled = calls[request_id].pop(0)
        fields = {"global_steps": version, **({SAMPLED_VERSIONS: sampled[0]} if sampled else {})}
        return TokenOutput(
            token_ids=list(range(tokens)), log_probs=[-1.0] * tokens, stop_reason=stop, extra_fields=fields
        )

    monkeypatch.setattr(LLMServerClient, "generate", generate)
    monkeypatch.setattr(asyncio, "sleep", _no_sleep)  # verl's loop waits 1 s before resending an aborted request


_real_sleep = asyncio.sleep


async def _no_sleep(seconds, *args):
    await _real_sleep(0)


def _client():
    client = VersionedClient.__new__(VersionedClient)  # no load balancer: the server call is scripted
    client.config = None  # verl's loop then reads no response length, and resumes (no async_training section)
    return client


def test_an_interrupted_call_and_a_later_turn_record_their_versions(monkeypatch):
    """Trajectory a: turn 1 is cut by a push after 3 tokens at version 0 and resumed for 2 at version 1; turn 2 (after
    the tool) samples 4 at version 1. Trajectory b, in its own task: 5 tokens at version 1. Hand-derived segments:
    a [[0, 3], [1, 6]], b [[1, 5]]; turn 1's output carries the same list, so the agent loop's kept extra_fields see
    turn 2."""
    _scripted(monkeypatch, {"a": [(0, 3, "aborted"), (1, 2, "stop"), (1, 4, "stop")], "b": [(1, 5, "stop")]})
    client = _client()

    async def trajectory(request_id, turns):
        outputs = [await client.generate(request_id=request_id, prompt_ids=[1], sampling_params={}) for _ in turns]
        return outputs

    async def main():
        return await asyncio.gather(trajectory("a", [1, 2]), trajectory("b", [1]))

    (a1, a2), (b1,) = asyncio.run(main())
    assert a1.token_ids == [0, 1, 2, 0, 1]  # verl's loop merged the interrupted call
    assert a1.extra_fields[TOKEN_VERSIONS] == [[0, 3], [1, 6]]
    assert a2.extra_fields[TOKEN_VERSIONS] is a1.extra_fields[TOKEN_VERSIONS]
    assert b1.extra_fields[TOKEN_VERSIONS] == [[1, 5]]
    assert (a1.extra_fields["min_global_steps"], a1.extra_fields["max_global_steps"]) == (0, 1)
    assert a1.extra_fields[SAMPLED_VERSIONS] == [[UNRECORDED, 9]]  # this server keeps no record of its own


def test_the_servers_own_record_is_collected_per_trajectory(monkeypatch):
    """The server reports each call's record (here turn 1's first call: 3 tokens at 0; its resumed call: 2 at 1; turn
    2: 4 at 1, with one call of a server that keeps none): hand-merged [[0, 3], [1, 6], [unrecorded, 2]], beside the
    client's own [[0, 3], [1, 8]]."""
    _scripted(
        monkeypatch,
        {"a": [(0, 3, "aborted", [[0, 3]]), (1, 2, "stop", [[1, 2]]), (1, 4, "stop", [[1, 4]]), (1, 2, "stop")]},
    )
    client = _client()

    async def main():
        return [await client.generate(request_id="a", prompt_ids=[1], sampling_params={}) for _ in range(3)]

    first, *_ = asyncio.run(main())
    assert first.extra_fields[TOKEN_VERSIONS] == [[0, 3], [1, 8]]
    assert first.extra_fields[SAMPLED_VERSIONS] == [[0, 3], [1, 6], [UNRECORDED, 2]]


# ------------------------------------------------------------------------------ the per-token check

# Step 5 (the trainer's weights at version 4) trains a batch scheduled at version 2; the rollout held 0, 2 and 4.
HELD = {0, 2, 4}
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])


def _fields(*rows, sampled=None):
    fields = [{TOKEN_VERSIONS: [list(s) for s in row]} for row in rows]
    for field, record in zip(fields, sampled or (), strict=False):
        field[SAMPLED_VERSIONS] = [list(s) for s in record]
    return fields


def test_a_batch_within_the_contract_gives_its_statistics():
    """Row 0: 2 tokens at 2, then 4 (its segments hold 4 tokens; the mask keeps 3); row 1: 2 tokens at 4.
    Versions 2, 2, 4, 4, 4: mean 16/5, staleness 4 − v: 2, 2, 0, 0, 0 (mean 4/5, max 2); row 0 spans."""
    stats, recorded, versions = check_token_versions(5, 2, HELD, _fields([(2, 2), (4, 2)], [(4, 2)]), MASK)
    assert versions.tolist() == [[2, 2, 4, -1], [4, 4, -1, -1]]  # laid onto the mask, -1 outside it
    assert recorded is None  # no server record to compare with
    assert (stats.version_min, stats.version_max, stats.tokens) == (2, 4, 5)
    assert stats.version_mean == pytest.approx(16 / 5)
    assert stats.staleness_mean == pytest.approx(4 / 5) and stats.staleness_max == 2
    assert stats.spanning_fraction == 0.5
    assert stats.tokens_per_version == {2: 2, 4: 3}


@pytest.mark.parametrize(
    "rows, message",
    [
        (([(2, 3)], [(3, 2)]), r"tagged with versions \[3\] that the rollout never held"),
        (([(0, 3)], [(2, 2)]), "older than the batch's scheduled version 2"),
        (([(2, 1)], [(2, 2)]), "has 3 response-mask tokens but its version segments"),
    ],
    ids=["a version never pushed", "a token older than its batch", "a token without a version"],
)
def test_negative_control_a_token_off_its_version_stops_the_run(rows, message):
    with pytest.raises(ObservedVersionError, match=message):
        check_token_versions(5, 2, HELD, _fields(*rows), MASK)


def test_a_token_newer_than_the_trainers_weights_stops_the_run():
    with pytest.raises(ObservedVersionError, match=r"newer than the trainer's weights \(version 3\)"):
        check_token_versions(4, 2, HELD, _fields([(2, 3)], [(4, 2)]), MASK)


# The client's record of the batch above, laid on MASK: row 0 = 2, 2, 4; row 1 = 4, 4.
CLIENT = _fields([(2, 2), (4, 2)], [(4, 2)])


def _versions():
    return torch.tensor([[2, 2, 4, 0], [4, 4, 0, 0]])


def test_the_clients_record_equals_the_servers_on_every_token():
    """Both rows have the server's record (row 0 split differently: 2, then 4 over 3 tokens); 5 of 5 tokens
    compared. A server that keeps none (vLLM) leaves nothing to compare: None."""
    sampled = [[(2, 2), (4, 3)], [(4, 2)]]
    assert check_server_record(5, _fields([(2, 2), (4, 2)], [(4, 2)], sampled=sampled), MASK, _versions()) == 1.0
    assert check_server_record(5, CLIENT, MASK, _versions()) is None
    unrecorded = [[(UNRECORDED, 4)], [(UNRECORDED, 2)]]
    assert check_server_record(5, _fields([(2, 2), (4, 2)], [(4, 2)], sampled=unrecorded), MASK, _versions()) is None
    # one row recorded: its 3 tokens of 5
    one = _fields([(2, 2), (4, 2)], [(4, 2)], sampled=[[(2, 2), (4, 1)]])
    assert check_server_record(5, one, MASK, _versions()) == pytest.approx(3 / 5)


@pytest.mark.parametrize(
    "sampled, message",
    [
        ([[(2, 3)], [(4, 2)]], "token 2 of response 0, recorded as version 4, sampled with version 2"),
        ([[(2, 2), (4, 1)], [(None, 2)]], "token 0 of response 1, recorded as version 4, sampled with weights only"),
        ([[(2, 2), (UNRECORDED, 1)], [(4, 2)]], "token 2 of response 0, recorded as version 4, sampled with no record"),
        ([[(2, 2)], [(4, 2)]], "response 0 has 3 response-mask tokens but its version segments"),
    ],
    ids=["another version", "weights partly loaded", "a call without a record", "a token the server never sampled"],
)
def test_negative_control_a_token_off_the_servers_record_stops_the_run(sampled, message):
    fields = _fields([(2, 2), (4, 2)], [(4, 2)], sampled=sampled)
    with pytest.raises(ObservedVersionError, match=message):
        check_server_record(5, fields, MASK, _versions())
    with pytest.raises(ObservedVersionError, match=message):  # the per-token check makes the comparison
        check_token_versions(5, 2, HELD, fields, MASK)


def test_fresh_token_metrics_are_the_hand_derived_gap_on_the_trainers_own_tokens():
    """Tokens (0, 1) and (1, 0) are fresh: gaps |−2 − (−2.25)| = 0.25 and |−1 − (−1.125)| = 0.125; the stale token
    (0, 0, gap 0.5) and the padding (gap inf) are not counted."""
    from verl_offpolicy.glue.scheduler.metrics import FRESH_LOGPROB_GAP_MAX, FRESH_TOKENS, fresh_token_metrics

    trainer = torch.tensor([[-1.0, -2.0], [-1.0, 0.0]])
    rollout = torch.tensor([[-1.5, -2.25], [-1.125, -math.inf]])
    fresh = torch.tensor([[False, True], [True, False]])
    assert fresh_token_metrics(trainer, rollout, fresh) == {FRESH_TOKENS: 2.0, FRESH_LOGPROB_GAP_MAX: 0.25}
    assert fresh_token_metrics(trainer, rollout, torch.zeros(2, 2, dtype=torch.bool)) == {FRESH_TOKENS: 0.0}


def _engine_comparison(monkeypatch, checked=None):
    """Step 3 (the trainer's weights: version 2) of a partial run, its batch stale (scheduled at version 1). Row 0:
    tokens of versions 1, 2, 2; row 1: 2, 2 (and one padding position). ``checked``: what the step's per-token check
    laid out (:class:`CheckedVersions`), or None. Returns the TransferQueue reads (keys, fields) and the metrics."""
    from types import MethodType, SimpleNamespace

    from omegaconf import OmegaConf
    from tensordict import NonTensorStack, TensorDict

    from tests.loss_helpers import nested
    from verl_offpolicy.glue.scheduler import overlapped
    from verl_offpolicy.glue.scheduler.trainer import OffPolicyTrainer

    stored = {
        "old_log_probs": nested([torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([-1.0, -1.0])]),
        "rollout_log_probs": nested([torch.tensor([-1.5, -2.25, -3.0]), torch.tensor([-1.125, -1.0])]),
        "response_mask": nested([torch.tensor([1, 1, 1]), torch.tensor([1, 1])]),
        "extra_fields": NonTensorStack({TOKEN_VERSIONS: [[1, 1], [2, 2]]}, {TOKEN_VERSIONS: [[2, 2]]}),
    }
    reads = []

    def read(keys, fields, partition):
        reads.append((list(keys), sorted(fields)))
        return TensorDict({f: stored[f] for f in fields}, batch_size=len(keys))

    monkeypatch.setattr(overlapped.store, "read", read)
    config = {"algorithm": {"rollout_correction": None}}
    config["actor_rollout_ref"] = {"rollout": {"calculate_log_probs": True}}
    fake = SimpleNamespace(
        config=OmegaConf.create(config),
        offpolicy=SimpleNamespace(partial_rollout=True),
        global_steps=3,
        replay_buffer=SimpleNamespace(current=SimpleNamespace(behaviour=False)),
        _checked_versions=checked,
    )
    fake._engine_mismatch_pair = MethodType(OffPolicyTrainer._engine_mismatch_pair, fake)
    batch = SimpleNamespace(keys=["a", "b", "pad"], tags=[{}, {}, {"is_padding": True}], partition_id="train")
    metrics = {}
    overlapped.OverlappedTrainer._log_engine_mismatch(fake, batch, metrics)
    return reads, metrics


def test_the_overlapped_trainer_compares_the_engines_on_the_tokens_its_own_weights_sampled(monkeypatch):
    """The engines are compared on the four version-2 tokens, read from TransferQueue for the real rows only: gaps
    0, 0.25, 0.125, 0 (hand-derived), the version-1 token's 0.5 left out (:func:`_engine_comparison`)."""
    from verl_offpolicy.glue.scheduler.metrics import FRESH_LOGPROB_GAP_MAX, FRESH_TOKENS

    reads, metrics = _engine_comparison(monkeypatch)
    assert reads == [(["a", "b"], ["extra_fields", "old_log_probs", "response_mask", "rollout_log_probs"])]
    assert metrics[FRESH_TOKENS] == 4.0 and metrics[FRESH_LOGPROB_GAP_MAX] == 0.25
    assert "offpolicy/engine_mismatch/kl" in metrics


def test_the_engine_comparison_takes_the_versions_its_steps_check_laid_out(monkeypatch):
    """The step's check laid out the same versions (keys in another order, beside a longer trajectory "c" that the
    batch does not train, so one column wider than the batch's padding): the comparison reads no ``extra_fields``
    and gives the same hand-derived numbers; a check of another step is not used."""
    from verl_offpolicy.glue.scheduler.metrics import FRESH_LOGPROB_GAP_MAX, FRESH_TOKENS

    laid_out = torch.tensor([[2, 2, -1, -1], [1, 2, 2, -1], [2, 2, 2, 2]])  # b, a, c
    reads, metrics = _engine_comparison(monkeypatch, CheckedVersions(3, ["b", "a", "c"], laid_out))
    assert reads == [(["a", "b"], ["old_log_probs", "response_mask", "rollout_log_probs"])]
    assert metrics[FRESH_TOKENS] == 4.0 and metrics[FRESH_LOGPROB_GAP_MAX] == 0.25
    assert "offpolicy/engine_mismatch/kl" in metrics
    reads, metrics = _engine_comparison(monkeypatch, CheckedVersions(2, ["b", "a", "c"], laid_out))
    assert "extra_fields" in reads[0][1] and metrics[FRESH_TOKENS] == 4.0


def test_a_step_without_the_trainers_own_tokens_reads_nothing_for_the_engine_comparison(monkeypatch):
    """Every token of the checked batch is of version 1 (stale at step 3): no log-prob is read, the count is 0."""
    from verl_offpolicy.glue.scheduler.metrics import FRESH_TOKENS

    stale = CheckedVersions(3, ["a", "b"], torch.tensor([[1, 1, 1], [1, 1, -1]]))
    reads, metrics = _engine_comparison(monkeypatch, stale)
    assert reads == [] and metrics == {FRESH_TOKENS: 0.0}


def test_checked_versions_rows_follow_the_keys_asked_for():
    checked = CheckedVersions(4, ["x", "y"], torch.tensor([[1, 2, -1], [3, 3, 3]]))
    assert checked.rows(["y", "x"]).tolist() == [[3, 3, 3], [1, 2, -1]]
    assert checked.rows(["x"], width=5).tolist() == [[1, 2, -1, -1, -1]]
    assert checked.rows(["y"], width=2).tolist() == [[3, 3]]
    assert checked.rows(["x", "z"]) is None


def test_a_trajectory_without_versions_names_the_agent_loop():
    with pytest.raises(ObservedVersionError, match="carries no per-token versions"):
        check_token_versions(5, 2, HELD, [{}, {}], MASK)


# ------------------------------------------------------------------------------ startup rules

PARTIAL = "algorithm.offpolicy.partial_rollout=true"


def _validate(extra, preset="opmd"):
    validate_offpolicy_config(compose_main_ppo("ppo_trainer", [f"+algorithm={preset}", *VALID_SIZES, *extra]))


@pytest.mark.slow
def test_partial_rollouts_are_the_overlapped_modes():
    _validate(OVERLAPPED + [PARTIAL, "algorithm.offpolicy.sync_offset=1"])
    # group filtering: B_t filtered when its step needs it, top-ups sampled by the weights the rollout holds then
    _validate(OVERLAPPED + [PARTIAL, "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=reward"])
    refused = {
        "the colocated mode": ([PARTIAL, "algorithm.offpolicy.sync_offset=1"], "nothing is in flight at a push"),
        "verl's own trainer": ([PARTIAL, "trainer.use_v1=false"], "is a mode of verl-offpolicy's overlapped scheduler"),
        "the behaviour anchor": (
            OVERLAPPED + [PARTIAL, "algorithm.offpolicy.ratio_anchor=behaviour"],
            "cannot use algorithm.offpolicy.ratio_anchor=behaviour",
        ),
        "sglang": (OVERLAPPED + [PARTIAL, "actor_rollout_ref.rollout.name=sglang"], "reports no version"),
        "not a boolean": (OVERLAPPED + ["algorithm.offpolicy.partial_rollout=sometimes"], "must be true or false"),
    }
    for what, (extra, message) in refused.items():
        with pytest.raises((OffPolicyConfigError, ValueError), match=message):
            _validate(extra)
            pytest.fail(f"{what} was accepted")


# ------------------------------------------------------------------------------ end to end

# (1, 1): version t − 1 generates B_t+1 while step t trains, and the push of version t comes one step later, while
# B_t+1 waits for its tool (which takes longer than a step): a push falls between the turns of B_3's trajectories
# (versions 1 and 2). The versions of steps 1..4 (docs/scheduler.md, v(t) = s·max(0, ⌊(t − d − 1)/s⌋)):
SETTING, SCHEDULED, STEPS, TIMEOUT = (1, 1), {1: 0, 2: 0, 3: 1, 4: 2}, 4, 900
# Step 2 trains in 0.4-0.7 s on an idle machine. If it takes longer than B_3's turns and tool together (a loaded
# machine: the vLLM run starting beside it), B_3 ends before the push and nothing spans one: the tool's seconds are
# the margin against load (2 s was too little once).
TOOL_LATENCY_S = 6.0
# The partial tool run saves after step 3 (B_4 of version 2 queued, in flight at the save: the save drains it) and
# is resumed from there.
RESUME_STEP = 3


# The rollouts a partial run is verified on: overlay and model (vLLM's CPU attention needs head_dim >= 32).
ROLLOUTS = {"hf": (STANDALONE, "tiny-tool"), "vllm": (["+cpu_rollout=[vllm,standalone]"], "tiny-tool-h32")}


def _once_dir(demo_runs, name: str) -> Path:
    """A session directory made once: a fixture's body runs at the session's start and again for every test that
    uses it, and a path in a run's overrides or environment is part of the run's key (a new one: a second run)."""
    return demo_runs.once((name,), lambda: demo_runs.tmp_dir(name))


def _partial_overrides(demo_runs, rollout="hf") -> list[str]:
    from verl_offpolicy.demo.tool_task import write_tool_config

    tool_config = write_tool_config(_once_dir(demo_runs, "partial_tool_config") / "lookup_tool.yaml", TOOL_LATENCY_S)
    return SMALL_DEMO + schedule(*SETTING) + ROLLOUTS[rollout][0] + [
        PARTIAL,
        "algorithm.offpolicy.ratio_anchor=rollout",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}",
    ]  # fmt: skip


def _partial_tool_run(demo_runs, env=None, name="partial_tool", steps=STEPS, rollout="hf", extra=()):
    overrides, model = _partial_overrides(demo_runs, rollout) + list(extra), ROLLOUTS[rollout][1]
    timeout = TIMEOUT * (2 if rollout == "vllm" else 1)
    return demo_runs.start("opmd", steps, overrides, PRIMARY_CONFIG, timeout, name=name, env=env, model=model)


def _audited_partial_tool_run(demo_runs):
    """The hf partial tool run, saving at step RESUME_STEP, with the audit hook on; (the job, the audit folder)."""
    folder = _once_dir(demo_runs, "partial_tool_audit")
    job = _partial_tool_run(demo_runs, env={AUDIT_DIR_ENV: str(folder)}, extra=[f"trainer.save_freq={RESUME_STEP}"])
    return job, folder


@queued_at_start()
def partial_tool_run(demo_runs):
    """The hf partial tool run (:func:`_audited_partial_tool_run`): (the job, the audit folder)."""
    return _audited_partial_tool_run(demo_runs)


@queued_at_start()
def partial_tool_resumed(demo_runs):
    """The same run resumed from its step-RESUME_STEP checkpoint (``-m extended``): (the uninterrupted job, the
    resumed one)."""
    uninterrupted, _ = _audited_partial_tool_run(demo_runs)
    resumed = start_resumed(
        demo_runs,
        uninterrupted,
        RESUME_STEP,
        preset="opmd",
        steps=STEPS,
        overrides=_partial_overrides(demo_runs),
        config_name=PRIMARY_CONFIG,
        timeout=TIMEOUT,
        name="partial_tool_resumed",
        model=ROLLOUTS["hf"][1],
    )
    return uninterrupted, resumed


@queued_at_start()
def vllm_partial_tool_run(demo_runs):
    return _partial_tool_run(demo_runs, name="partial_tool_vllm", rollout="vllm")


@queued_at_start()
def wrong_version_partial_run(demo_runs):
    return _partial_tool_run(demo_runs, env={PUSH_VERSION_FAULT_ENV: "1"}, name="partial_wrong_version", steps=2)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_partial_tool_run_keeps_every_token_within_its_batchs_versions(partial_tool_run):
    """(1, 1): v(t) = 0, 0, 1, 2. Every step's tokens lie in [v(t), t − 1] (the run checks each token and would stop
    otherwise; here the logged range is read back), the push does not wait, and at least one step trains
    trajectories that span versions (a push between turns: the tool takes longer than a step). On the tokens the
    trainer's own weights sampled (version t − 1), the rollout's log-prob equals the trainer's recomputation. The hf
    server's own record of the weights that sampled each token covers every token, and the run compared each with
    the client's record (it would stop at the first that differs)."""
    _check_partial_run(partial_tool_run[0].result(), server_record=True)


def recomputed_log_probs(model, input_ids: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
    """log π(response token | its prefix) from one full forward pass of ``model`` over prompt + response (temperature
    1, the demo's): the recomputation, with no KV cache carried across a push."""
    with torch.no_grad():
        logits = model(input_ids[None]).logits[0].float()
    start = len(input_ids) - len(responses)
    return torch.log_softmax(logits[start - 1 : -1], dim=-1).gather(-1, responses[:, None])[:, 0]


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_tokens_rollout_log_prob_equals_a_recomputation_with_the_trainers_weights_of_its_version(
    partial_tool_run,
):
    """The audit hook saved the weights the trainer sent as each version and every trained batch. For every response
    token of every step, its rollout log-prob (the engine's, which the ``rollout`` anchor trains with) equals a full
    forward pass of the trainer's weights of the version the token is tagged with, within fp32 rounding: the tokens
    older than the trainer's weights too, and both sides of a trajectory that spans a push (the tokens after it
    sampled by the new weights over a prefix the old ones wrote)."""
    import yaml
    from transformers import AutoModelForCausalLM

    result, folder = partial_tool_run[0].result(), partial_tool_run[1]
    config = yaml.safe_load((Path(result.output_dir) / "hydra" / ".hydra" / "config.yaml").read_text())
    assert config["actor_rollout_ref"]["rollout"]["temperature"] == 1.0  # what recomputed_log_probs assumes
    model = AutoModelForCausalLM.from_pretrained(config["actor_rollout_ref"]["model"]["path"], dtype=torch.float32)
    model.eval()
    compared, old, spanning_compared = Counter(), 0, 0
    for step in range(1, STEPS + 1):
        batch = torch.load(batch_path(folder, step))
        versions, mask, rollout = batch["token_versions"], batch["response_mask"].bool(), batch["rollout_log_probs"]
        for version in sorted(set(versions[mask].tolist())):
            model.load_state_dict(torch.load(weights_path(folder, version)))
            for i, (ids, responses) in enumerate(zip(batch["input_ids"], batch["responses"], strict=True)):
                n = len(responses)
                at = mask[i, :n] & (versions[i, :n] == version)
                if not at.any():
                    continue
                gap = (recomputed_log_probs(model, ids, responses)[at] - rollout[i, :n][at]).abs().max().item()
                assert gap < 1e-4, (step, version, i, gap)
                compared[step, version] += int(at.sum())
                old += int(at.sum()) if version < step - 1 else 0
                spanning_compared += int(len(set(versions[i][mask[i]].tolist())) > 1)
        assert sum(n for (s, _), n in compared.items() if s == step) == int(mask.sum()), step  # every token
    assert old > 0 and spanning_compared > 0, (compared, old, spanning_compared)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(2400)
def test_a_partial_tool_run_resumed_from_its_checkpoint_trains_the_saved_batch(partial_tool_resumed):
    """Resumed from the step-3 checkpoint (the save drained B_4, version 2, in flight when it began): step 4 trains
    B_4 as saved, sample for sample the uninterrupted run's step 4 (nothing lost, nothing generated twice), its
    tokens all of version 2 (v(4), none newer than the weights of step 3), each checked per token against the
    versions held before the save and the server's record."""
    uninterrupted, resumed_job = partial_tool_resumed
    reference = uninterrupted.result()
    resumed, log, metrics = resumed_job.result()
    assert f"offpolicy scheduler: restored 1 queued batches for steps [{STEPS}]" in log, log[-3000:]
    assert sorted(s for s in metrics if s >= 1) == [STEPS]
    row = metrics[STEPS]
    assert (row["offpolicy/token_version/min"], row["offpolicy/token_version/max"]) == (2.0, 2.0)
    assert row["offpolicy/token_staleness/max"] == 1.0
    dumps = dumped_batches(resumed / "rollouts", [STEPS])
    assert dumps == dumped_batches(Path(reference.output_dir) / "rollouts", [STEPS]) and dumps[STEPS]


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(3600)
@needs_vllm
def test_a_partial_tool_run_on_verls_vllm_rollout_keeps_every_token_within_its_batchs_versions(vllm_partial_tool_run):
    """The same run on verl's vLLM rollout (its own pool): verl aborts and resumes vLLM's requests at each push, and
    vLLM tags every call with its weights version (it keeps no per-token record of its own: nothing compared)."""
    _check_partial_run(vllm_partial_tool_run.result(), server_record=False)


def _check_partial_run(result, server_record: bool) -> None:
    scheduled = SCHEDULED
    spanning = []
    for row in result.metrics:
        step = row["step"]
        low, high = row["offpolicy/token_version/min"], row["offpolicy/token_version/max"]
        assert scheduled[step] <= low <= high <= step - 1, (step, low, high)
        assert row["offpolicy/token_staleness/max"] == (step - 1) - low
        per_version = {k: v for k, v in row.items() if k.startswith("offpolicy/token_version/tokens_at_offset_")}
        assert sum(per_version.values()) > 0
        if "offpolicy/sync_wait_s" in row:
            assert row["offpolicy/sync_wait_s"] == 0.0
        spanning.append(row["offpolicy/token_version/spanning_fraction"])
        assert row.get(SERVER_RECORDED_FRACTION) == (1.0 if server_record else None), step
        # the tokens the trainer's own weights sampled: the rollout's log-prob is the trainer's recomputation (fp32)
        all_tokens = sum(per_version.values())
        fresh = row[FRESH_TOKENS]
        assert fresh == per_version.get(f"offpolicy/token_version/tokens_at_offset_{step - 1 - scheduled[step]}", 0)
        if step - 1 == scheduled[step]:
            assert fresh == all_tokens, step  # a fresh batch: every token
        if fresh:
            assert row[FRESH_LOGPROB_GAP_MAX] < 1e-4, (step, row[FRESH_LOGPROB_GAP_MAX])
        if row["offpolicy/token_version/spanning_fraction"] > 0:
            assert high > low
            assert row["training/off_policy/trajectory_spans/max"] >= 2  # verl's own count agrees
    assert [row["step"] for row in result.metrics] == [1, 2, 3, 4]
    assert max(spanning) > 0, spanning


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(1200)
def test_negative_control_a_partial_run_with_mislabelled_pushes_stops(wrong_version_partial_run):
    """The pushes are tagged one version ahead: step 1's tokens carry version 1, which was never pushed."""
    from verl_offpolicy.demo.errors import DemoError

    with pytest.raises(DemoError):
        wrong_version_partial_run.result()
    log = (wrong_version_partial_run.output_dir / "train.log").read_text(errors="replace")
    assert "of step 1 has tokens tagged with versions [1] that the rollout never held" in log, log[-3000:]
    assert "step:1 - " not in log
