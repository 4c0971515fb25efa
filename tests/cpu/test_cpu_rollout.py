"""The hf rollout backend: generation semantics, log-probs, and the trainer -> rollout weight sync."""

import pytest
import torch

from tests.cpu_harness import isolated
from verl_offpolicy.cpu.sampling import SamplingKey, sample_next

TIMEOUT = 300


def _key(**kw):
    base = dict(temperature=1.0, top_p=1.0, top_k=-1, repetition_penalty=1.0, ignore_eos=False)
    base.update(kw)
    return SamplingKey(**base)


def test_sample_next_logprob_is_temperature_scaled_and_renormalised_over_the_kept_set():
    """What vLLM reports under processed_logprobs (verl's default): log_softmax(logits/T) over the top-k set,
    i.e. log p_T(y) − log S with S the kept mass p_T(top 3); without truncation, log_softmax(logits/T)."""
    torch.manual_seed(0)
    logits = torch.randn(64, 10)
    gen = torch.Generator().manual_seed(0)
    for temperature in (0.5, 1.0, 2.0):
        tokens, log_probs = sample_next(logits, _key(temperature=temperature, top_k=3), gen)
        full = torch.log_softmax(logits / temperature, dim=-1)
        kept_mass = full.exp().topk(3, dim=-1).values.sum(dim=-1)
        torch.testing.assert_close(log_probs, full.gather(1, tokens[:, None]).squeeze(1) - kept_mass.log())
        top3 = logits.topk(3, dim=-1).indices
        assert bool((top3 == tokens[:, None]).any(dim=1).all())
        tokens, log_probs = sample_next(logits, _key(temperature=temperature), gen)
        torch.testing.assert_close(log_probs, full.gather(1, tokens[:, None]).squeeze(1))


def test_sample_next_greedy_top_p_and_repetition_penalty():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9]])
    gen = torch.Generator().manual_seed(0)
    tokens, log_probs = sample_next(logits, _key(temperature=0), gen)
    assert tokens.tolist() == [1]
    torch.testing.assert_close(log_probs, torch.log_softmax(logits, -1)[:, 1])
    # top_p just above the top token's mass keeps tokens 1 and 3 only.
    p1 = torch.softmax(logits, -1)[0, 1].item()
    seen = set()
    for _ in range(200):
        t, _ = sample_next(logits, _key(top_p=p1 + 1e-3), gen)
        seen.add(t.item())
    assert seen == {1, 3}
    # reported over the kept pair: token 1: 3 − log(e³ + e^2.9) = −0.64440, token 3: 2.9 − log(e³ + e^2.9) = −0.74440
    for _ in range(20):
        t, lp = sample_next(logits, _key(top_p=p1 + 1e-3), gen)
        assert lp.item() == pytest.approx({1: -0.644397, 3: -0.744397}[t.item()], abs=1e-5)
    # A strong repetition penalty on token 1 makes greedy pick token 3.
    tokens, _ = sample_next(logits, _key(temperature=0, repetition_penalty=10.0), gen, torch.tensor([[1]]))
    assert tokens.tolist() == [3]


def test_sample_next_reports_what_vllm_reports_for_each_logprobs_mode():
    """vLLM 0.30's Sampler: raw_* before the penalty, temperature and truncation; processed_* after them."""
    import math

    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9]])
    key = _key(temperature=2.0, top_k=2)  # kept: tokens 1 and 3, processed logits 1.5 and 1.45
    z_raw = math.log(1 + math.exp(3) + math.exp(1) + math.exp(2.9))
    z_kept = math.log(math.exp(1.5) + math.exp(1.45))
    expected = {
        "processed_logprobs": {1: 1.5 - z_kept, 3: 1.45 - z_kept},
        "processed_logits": {1: 1.5, 3: 1.45},
        "raw_logprobs": {1: 3 - z_raw, 3: 2.9 - z_raw},
        "raw_logits": {1: 3.0, 3: 2.9},
        None: {1: 3 - z_raw, 3: 2.9 - z_raw},  # null: vLLM's default, raw_logprobs
    }
    for mode, values in expected.items():
        gen = torch.Generator().manual_seed(0)
        for _ in range(10):
            t, value = sample_next(logits, key, gen, logprobs_mode=mode)
            assert value.item() == pytest.approx(values[t.item()], abs=1e-5), (mode, t.item())
    # greedy with a penalty of 10 on token 1: logits [0, 0.3, 1, 2.9] pick token 3; raw modes ignore the penalty
    greedy, seen = _key(temperature=0, repetition_penalty=10.0), torch.tensor([[1]])
    z_penalised = math.log(1 + math.exp(0.3) + math.exp(1) + math.exp(2.9))
    for mode, value in (
        ("processed_logprobs", 2.9 - z_penalised),
        ("raw_logprobs", 2.9 - z_raw),
        ("processed_logits", 2.9),
    ):
        t, got = sample_next(logits, greedy, torch.Generator(), seen, logprobs_mode=mode)
        assert t.tolist() == [3] and got.item() == pytest.approx(value, abs=1e-5), mode
    with pytest.raises(ValueError, match="logprobs_mode='logprobs'; allowed values: processed_logprobs, raw_logprobs"):
        sample_next(logits, key, torch.Generator(), logprobs_mode="logprobs")


@pytest.mark.parametrize("value", [-1, "fast", True, float("inf")])
def test_a_bad_token_latency_names_the_key(value):
    from verl_offpolicy.cpu.hf_options import HFRolloutError, token_latency

    with pytest.raises(HFRolloutError, match=r"engine_kwargs\.hf\.token_latency_s=.*must be a number of seconds >= 0"):
        token_latency({"token_latency_s": value})
    assert token_latency({}) == 0.0 and token_latency({"token_latency_s": 0.02}) == 0.02


@pytest.mark.slow
def test_server_generation_semantics_against_transformers(tmp_path):
    report = isolated("tests.scenario_rollout:rollout_server_semantics", timeout=TIMEOUT, workdir=str(tmp_path))
    assert report["batched_equals_single"]
    assert report["greedy_is_argmax"]
    assert report["max_tokens_respected"]
    assert report["top_k1_is_greedy"]
    assert report["no_logprobs_when_not_asked"]
    cut, expected = report["stops_at_stop_token"]
    assert cut == expected and len(expected) <= 4
    assert report["stop_reasons"] == ["completed"]
    for temperature, diff in report["sampled_logprob_max_diff"].items():
        assert diff < 1e-4, (temperature, diff)
    assert report["partial_update_refused"]
    assert report["global_steps_after_update"] == 7
    assert report["generation_uses_new_weights"]
    assert report["rejected_while_paused"]
    assert report["serves_after_resume"]
    # Its own record of the weights that sampled each token: none before the first update, none while an update is
    # partly loaded (the refused one, after a complete one tagged 3), version 7 after the next complete one; nothing
    # sampled, nothing recorded.
    for name, version in (("sampled_at_start", None), ("sampled_partly_loaded", None), ("sampled_after_update", 7)):
        record, tokens = report[name]
        assert tokens > 0 and record == [[version, tokens]], (name, record, tokens)
    assert report["sampled_rejected"] == []
    # token latency 0.01 s, 5 tokens: a sleep after each of the first 4 steps, none over the latency
    latency = report["token_latency"]
    assert len(latency["sleeps"]) == 4 and all(0 <= s <= 0.01 for s in latency["sleeps"]), latency
    assert latency["same_sample"]


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_bad_continuous_batching_names_the_key(value):
    from verl_offpolicy.cpu.hf_options import HFRolloutError, continuous_batching

    with pytest.raises(HFRolloutError, match=r"engine_kwargs\.hf\.continuous_batching=.*must be true .* or false"):
        continuous_batching({"continuous_batching": value})
    assert continuous_batching({}) is False and continuous_batching({"continuous_batching": True}) is True


@pytest.mark.slow
@pytest.mark.parametrize("continuous", [True, False], ids=["continuous", "by-priority"])
def test_continuous_batching_lets_short_requests_join_a_long_one_with_the_same_samples(tmp_path, continuous):
    """A 40-token request of priority 1 generates (10 ms a step); once it has 5 tokens, four 4-token requests of
    priority 2 arrive. With continuous batching they join it (the long one is preempted and prefilled again with its
    tokens so far) and finish first; by priority they wait for it. Every request gets the tokens it gets alone (its
    own sampler survives the preemption) and the same log-probs within fp32 rounding. An abort ends a preempted
    request that waits for its next batch (it holds tokens of the weights an update replaces) and keeps a fresh one."""
    report = isolated(
        "tests.scenario_rollout:rollout_continuous_batching", timeout=TIMEOUT, workdir=str(tmp_path),
        continuous=continuous,
    )  # fmt: skip
    if continuous:
        assert report["completion_order"][-1] == 0 and sorted(report["completion_order"][:4]) == [1, 2, 3, 4]
        assert report["preemptions"] >= 1
    else:
        assert report["completion_order"][0] == 0 and report["preemptions"] == 0
    assert report["lengths"] == {"0": 40, "1": 4, "2": 4, "3": 4, "4": 4}
    assert all(report["same_tokens"].values()), report["same_tokens"]
    assert report["log_prob_gap"] < 1e-5
    assert report["aborted_preempted"] == ["aborted", [5, 6]]
    assert report["still_pending"] == ["fresh"]


@pytest.mark.slow
def test_server_generates_the_lowest_priority_first_with_the_same_samples(tmp_path):
    """Streaming in the overlapped mode rests on this: 3 priorities x 8 requests, sent interleaved and at
    once, come back priority 1 first, then 2, then 3 (one generation batch each, where without priorities
    the 24 share one batch), and every request gets the tokens it gets without priorities (its seed)."""
    report = isolated("tests.scenario_rollout:rollout_priority_order", timeout=TIMEOUT, workdir=str(tmp_path))
    assert report["completion_order"] == [1] * 8 + [2] * 8 + [3] * 8
    assert report["batches"] == 3
    assert report["unprioritised_batches"] == 1
    assert report["same_samples"]


@pytest.mark.e2e  # a Ray cluster for the rollout server
@pytest.mark.slow
def test_rollout_logprobs_match_trainer_after_weight_sync(tmp_path):
    """Trainer (FSDP2 TrainingWorker) weights -> adapter -> Ray server; then both score the same tokens."""
    report = isolated(
        "tests.scenario_rollout:rollout_vs_trainer_after_sync", timeout=TIMEOUT, workdir=str(tmp_path), temperature=0.7
    )
    print(report)
    assert report["global_steps"] == 1
    assert report["tokens_compared"] > 0
    # Before the sync the rollout still has the checkpoint weights: the gap is large...
    assert report["max_abs_logprob_diff_before_sync"] > 1e-2
    # ...after it, rollout and trainer agree to float32 rounding (fp32 on both sides).
    assert report["max_abs_logprob_diff_after_sync"] < 1e-4


@pytest.mark.parametrize("bad", ["tensor_model_parallel_size", "data_parallel_size"])
def test_parallelism_other_than_one_is_refused(bad):
    from types import SimpleNamespace

    from verl_offpolicy.cpu.hf_options import HFRolloutError
    from verl_offpolicy.cpu.hf_server import check_rollout_parallelism

    cfg = SimpleNamespace(tensor_model_parallel_size=1, data_parallel_size=1, pipeline_model_parallel_size=1)
    setattr(cfg, bad, 2)
    with pytest.raises(HFRolloutError, match=f"actor_rollout_ref.rollout.{bad}=2"):
        check_rollout_parallelism(cfg)


def test_sampling_of_a_request_does_not_depend_on_its_batch():
    """Each row draws from its own generator: batched and one-by-one sampling give the same tokens."""
    torch.manual_seed(0)
    logits = torch.randn(6, 11)
    key = _key(temperature=0.9, top_k=5)
    seeds = [3, 14, 15, 92, 65, 35]
    batched, _ = sample_next(logits, key, [torch.Generator().manual_seed(s) for s in seeds])
    alone = [
        sample_next(logits[i : i + 1], key, [torch.Generator().manual_seed(s)])[0].item() for i, s in enumerate(seeds)
    ]
    assert batched.tolist() == alone
    reordered, _ = sample_next(logits.flip(0), key, [torch.Generator().manual_seed(s) for s in reversed(seeds)])
    assert reordered.flip(0).tolist() == batched.tolist()


def test_request_seeds_are_reproducible_and_distinct_per_occurrence():
    """A server's seeds (HFRolloutServer.request_seeds): config seed 7, replica 0, weights version 3."""
    from verl_offpolicy.cpu.sampling import RequestSeeds

    key = _key(temperature=1.0)
    a, b = RequestSeeds(7, 0), RequestSeeds(7, 0)
    seeds_a = [a.next(key, [1, 2, 3], 3) for _ in range(4)]
    seeds_b = [b.next(key, [1, 2, 3], 3) for _ in range(4)]
    assert seeds_a == seeds_b and len(set(seeds_a)) == 4  # same sequence in a fresh server, distinct samples
    assert RequestSeeds(7, 0).next(key, [1, 2, 3], 4) != seeds_a[0]  # new weights, new draws
    assert a.next(_key(temperature=0), [1, 2, 3], 3) == 0  # greedy consumes nothing
    assert a.occurrences(key, [1, 2, 3]) == 4
    # an explicit per-request seed (seeded_single_turn_agent) replaces the occurrence count
    explicit = [RequestSeeds(7, 0).next(key, [1, 2, 3], 3, seed=s) for s in (5, 5, 6)]
    assert explicit[0] == explicit[1] != explicit[2]
    # ... whichever replica serves it (the load balancer's choice does not change a seeded sample), while
    # unseeded requests draw differently on two replicas (their occurrence counts are per server)
    assert RequestSeeds(7, 1).next(key, [1, 2, 3], 3, seed=5) == explicit[0]
    assert RequestSeeds(7, 1).next(key, [1, 2, 3], 3) != seeds_a[0]
    # a weight update starts every prompt's count again
    a.reset()
    assert a.occurrences(key, [1, 2, 3]) == 0 and a.next(key, [1, 2, 3], 3) == seeds_a[0]
