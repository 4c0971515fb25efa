"""The examples' math-verify reward, called the way verl calls it: from a worker thread, and through
verl's real reward loop (``RewardLoopWorker`` -> ``load_reward_manager`` -> the ``naive`` reward
manager, which runs ``compute_score`` in the event loop's thread pool). No mocks: the tokenizer is a
real byte-level Hugging Face tokenizer built locally (no downloads)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
import pytest
import torch

from verl_offpolicy.rewards import math_verify_reward
from verl_offpolicy.rewards.math_verify_reward import compute_score, last_boxed

# (response, ground truth, expected score)
CASES = [
    pytest.param("so x = \\boxed{\\frac{1}{2}}", "0.5", 1.0, id="correct-boxed"),
    pytest.param("the answer is \\boxed{3}", "4", 0.0, id="wrong-boxed"),
    pytest.param("2 + 7 is \\boxed{}.", "9", 0.0, id="empty-boxed"),
    pytest.param("2 + 7 = 9, so the answer is \\boxed{5}", "9", 0.0, id="expression-outside-the-box"),
    pytest.param("the answer is 9", "9", 0.0, id="no-boxed-answer"),
    pytest.param("first \\boxed{4}, on reflection \\boxed{3}", "3", 1.0, id="last-box-counts"),
    pytest.param("first \\boxed{3}, on reflection \\boxed{4}", "3", 0.0, id="last-box-counts-wrong"),
    pytest.param("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0, id="nested-braces"),
    pytest.param("\\boxed{0.5}", "\\frac{1}{2}", 1.0, id="latex-equivalent"),
    pytest.param("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0, id="latex-equivalent-root"),
    pytest.param("\\boxed{\\frac{1}{2}", "0.5", 0.0, id="unclosed-box"),
]


def test_last_boxed_keeps_nested_braces_and_takes_the_last_box():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert last_boxed("\\boxed {x^{2}}") == "x^{2}"
    assert last_boxed("no box") is None
    assert last_boxed("\\boxed{open") is None


@pytest.mark.parametrize("response, truth, expected", CASES)
def test_scores_only_the_final_boxed_answer_from_a_worker_thread(response, truth, expected):
    """From a thread pool, as verl's reward manager calls it (math-verify's signal timeouts raise there)."""
    assert threading.current_thread() is threading.main_thread()
    with ThreadPoolExecutor(max_workers=2) as pool:
        assert pool.submit(compute_score, "math", response, truth).result(timeout=300) == expected


def test_an_answer_that_cannot_finish_scores_0_at_the_deadline_and_the_next_one_is_scored():
    """9^{9^{9^{9}}} never finishes (one long integer power, which no signal interrupts): the scoring
    process is killed at the deadline, the answer scores 0, and the next request gets a new process."""
    compute_score("math", "\\boxed{1}", "1")  # the scoring process is up (its start-up is not timed)
    first = math_verify_reward._SCORER.proc
    with ThreadPoolExecutor(max_workers=1) as pool:
        start = time.monotonic()
        assert (
            pool.submit(compute_score, "math", "\\boxed{9^{9^{9^{9}}}}", "3", timeout_seconds=2).result(timeout=300)
            == 0.0
        )
        assert time.monotonic() - start < 60
        assert not psutil.pid_exists(first.pid) or psutil.Process(first.pid).status() == psutil.STATUS_ZOMBIE
        assert pool.submit(compute_score, "math", "\\boxed{\\frac{1}{2}}", "0.5").result(timeout=300) == 1.0
    assert math_verify_reward._SCORER.proc.pid != first.pid


def _byte_tokenizer(path):
    """A real fast tokenizer over the 256 byte symbols (encodes and decodes any text exactly)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<pad>": 0, "</s>": 1, **{ch: i + 2 for i, ch in enumerate(sorted(alphabet))}}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>")
    tokenizer.save_pretrained(path)
    return tokenizer


def test_scores_through_verls_reward_loop(tmp_path):
    """verl's RewardLoopWorker loads the function from ``reward.custom_reward_function.path`` (as the
    examples set it) and scores a batch with the naive reward manager, concurrently in its thread pool."""
    from verl import DataProto
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

    from verl_offpolicy.glue.compose import compose_main_ppo

    tokenizer = _byte_tokenizer(tmp_path / "tokenizer")
    config = compose_main_ppo(
        "ppo_trainer",
        [
            f"actor_rollout_ref.model.tokenizer_path={tmp_path / 'tokenizer'}",
            f"reward.custom_reward_function.path={math_verify_reward.__file__}",
            "reward.custom_reward_function.name=compute_score",
        ],
    )
    worker = RewardLoopWorker(config)
    responses = [case.values[0] for case in CASES]
    truths = [case.values[1] for case in CASES]
    expected = [case.values[2] for case in CASES]

    encoded = [tokenizer.encode(r, add_special_tokens=False) for r in responses]
    assert [tokenizer.decode(ids) for ids in encoded] == responses
    width = max(map(len, encoded))
    response_ids = torch.zeros(len(encoded), width, dtype=torch.long)
    response_mask = torch.zeros(len(encoded), width, dtype=torch.long)
    for i, ids in enumerate(encoded):
        response_ids[i, : len(ids)] = torch.tensor(ids)
        response_mask[i, : len(ids)] = 1
    prompts = torch.full((len(encoded), 2), 2, dtype=torch.long)
    data = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": response_ids,
            "attention_mask": torch.cat([torch.ones_like(prompts), response_mask], dim=1),
        },
        non_tensors={
            "data_source": np.array(["math"] * len(encoded), dtype=object),
            "reward_model": np.array([{"ground_truth": t} for t in truths], dtype=object),
            "extra_info": np.array([{} for _ in truths], dtype=object),
        },
    )
    outputs = worker.loop.run_until_complete(worker.compute_score_batch(data))
    assert [out["reward_score"] for out in outputs] == expected


def test_an_escaped_brace_does_not_close_a_box():
    """``\\}`` is a literal brace in LaTeX: ``\\boxed{9\\}`` has no closing brace (it gave ``9\\``)."""
    from verl_offpolicy.rewards.math_verify_reward import last_boxed

    assert last_boxed(r"\boxed{9\}") is None
    assert last_boxed(r"\boxed{3} then \boxed{9\}") == "3"
    assert last_boxed(r"\boxed{\{1, 2\}}") == r"\{1, 2\}"


@pytest.mark.parametrize("value", [float("nan"), 0, -1.0, float("inf"), "30", True])
def test_timeout_seconds_must_be_a_positive_finite_number(value):
    """NaN raised inside verl's reward loop and 0 or below scored every answer 0, silently."""
    from verl_offpolicy.rewards.math_verify_reward import TIMEOUT_KEY, check_timeout_seconds, compute_score

    with pytest.raises(ValueError, match=rf"^{TIMEOUT_KEY} must be a finite number of seconds > 0"):
        check_timeout_seconds(value)
    with pytest.raises(ValueError, match=TIMEOUT_KEY):
        compute_score("math", r"\boxed{1}", "1", timeout_seconds=value)


def test_check_rejects_a_bad_timeout_at_startup():
    from tests.hydra_utils import VALID_SIZES, compose_and_check

    overrides = [
        "algorithm=grpo",
        *VALID_SIZES,
        "reward.custom_reward_function.path=pkg://verl_offpolicy.rewards.math_verify_reward",
        "+reward.custom_reward_function.reward_kwargs.timeout_seconds=0",
    ]
    with pytest.raises(ValueError, match="reward.custom_reward_function.reward_kwargs.timeout_seconds must be"):
        compose_and_check("offpolicy_trainer", overrides)
