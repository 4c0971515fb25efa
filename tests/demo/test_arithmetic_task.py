"""The arithmetic word-problem task (verl_offpolicy.demo.arithmetic) and its math-verify reward.

Expected values are hand-derived: pair counts (1-digit sums: 9 x 9 = 81 pairs; 1-digit differences
with a >= b: 9 + 8 + ... + 1 = 45), the answers read back from each question's own numbers, and
the texts of hand-written responses.
"""

import re

import pandas as pd
import pytest

from verl_offpolicy.demo import arithmetic
from verl_offpolicy.rewards.math_verify_reward import compute_score


def _numbers(row):
    return [int(x) for x in re.findall(r"\d+", row["prompt"][-1]["content"])]


def test_pair_counts_by_hand():
    assert len(arithmetic.operand_pairs(1, ("add",))) == 81
    assert len(arithmetic.operand_pairs(1, ("sub",))) == 45
    assert len(arithmetic.operand_pairs(2, ("add",))) == 99 * 99
    # a + b - c, 1 <= a, b, c <= 9, c < a + b: a sum s = a + b <= 9 (s - 1 pairs) excludes c = s..9 (10 - s
    # values): 1*8 + 2*7 + 3*6 + 4*5 + 5*4 + 6*3 + 7*2 + 8*1 = 120 of the 9**3 triples
    assert len(arithmetic.operand_pairs(1, ("add_sub",))) == 9**3 - 120


def test_problem_text_by_hand():
    text = arithmetic.problem_text("add", 3, 5, name="Mia", pronoun="She", obj="apples", template=0)
    assert text == "Mia has 3 apples. She buys 5 more apples. How many apples does Mia have now?"
    assert arithmetic.answer("add", 3, 5) == 8
    assert arithmetic.answer("sub", 9, 4) == 5
    text = arithmetic.problem_text("add_sub", 3, 5, 2, name="Tom", pronoun="He", obj="coins", template=0)
    assert (
        text == "Tom has 3 coins. He buys 5 more coins and then gives away 2 coins. How many coins does Tom have now?"
    )
    assert arithmetic.answer("add_sub", 3, 5, 2) == 6


def test_two_step_rows_carry_the_answer_of_their_three_numbers():
    train, val = arithmetic.generate(operations=("add_sub",), train_size=32, val_size=8, seed=1)
    for row in train + val:
        example_q, example_a, _ = row["prompt"]  # the two-step worked example: 12 + 5 - 3
        assert "12 + 5 = 17" in example_a["content"] and "17 - 3 = 14" in example_a["content"]
        assert example_a["content"].endswith("\\boxed{14}.") and "gives away 3" in example_q["content"]
        a, b, c = _numbers(row)  # the question holds exactly the three operands
        assert row["reward_model"]["ground_truth"] == str(a + b - c) and a + b - c >= 1
        assert {k: row["extra_info"][k] for k in "abc"} == {"a": a, "b": b, "c": c}


@pytest.mark.parametrize("operations", [("add",), ("sub",), ("add", "sub")])
def test_rows_are_verl_rlhf_rows_with_the_answer_of_their_own_numbers(operations):
    train, val = arithmetic.generate(operations=operations, train_size=64, val_size=8, seed=3)
    assert len(train) == 64 and len(val) == 8
    for row in train + val:
        assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        example_q, example_a, message = row["prompt"]  # one worked example (shots=1), then the question
        assert [example_q["role"], example_a["role"], message["role"]] == ["user", "assistant", "user"]
        assert example_a["content"].endswith("The answer is \\boxed{17}.")  # 12 + 5, worked in the example question
        assert "12" in example_q["content"] and "5 more" in example_q["content"]
        assert message["content"].endswith("Put the final answer in \\boxed{}.")
        a, b = _numbers(row)  # the question holds exactly the two operands
        op = row["extra_info"]["operation"]
        assert op in operations
        expected = a + b if op == "add" else a - b
        assert row["reward_model"]["ground_truth"] == str(expected)
        assert 1 <= a <= 9 and 1 <= b <= 9
        assert op == "add" or a >= b


def test_no_example_with_zero_shots():
    train, _ = arithmetic.generate(train_size=4, seed=0, shots=0)
    assert [len(r["prompt"]) for r in train] == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="shots"):
        arithmetic.generate(shots=2)


def test_seeded_and_deterministic():
    assert arithmetic.generate(seed=0) == arithmetic.generate(seed=0)
    assert arithmetic.generate(seed=0) != arithmetic.generate(seed=1)


def test_validation_pairs_are_never_trained_on():
    train, val = arithmetic.generate(train_size=2000, val_size=20, seed=0)
    key = lambda r: (r["extra_info"]["operation"], r["extra_info"]["a"], r["extra_info"]["b"])  # noqa: E731
    val_pairs = {key(r) for r in val}
    assert len(val_pairs) == 20  # each held-out pair once
    assert not val_pairs & {key(r) for r in train}
    # 2000 draws from the 61 train pairs (81 - round(81 * 0.25)) cover all of them
    assert len({key(r) for r in train}) == 81 - 20


def test_difficulty_knob():
    train, _ = arithmetic.generate(digits=2, train_size=200, seed=0)
    operands = [n for r in train for n in _numbers(r)]
    assert max(operands) <= 99 and any(n >= 10 for n in operands)


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"digits": 4}, "digits"),
        ({"operations": ("mul",)}, "operations"),
        ({"val_fraction": 1.0}, "val_fraction"),
        ({"val_size": 100}, "val_size"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, word):
    with pytest.raises(ValueError, match=word):
        arithmetic.generate(**kwargs)


def test_parquet_round_trip(tmp_path):
    paths = arithmetic.build_dataset(tmp_path, train_size=8, val_size=4, seed=0)
    train = pd.read_parquet(paths["train_files"])
    val = pd.read_parquet(paths["val_files"])
    assert len(train) == 8 and len(val) == 4
    assert [list(m.keys()) for m in train.iloc[0]["prompt"]] == [["role", "content"]] * 3
    assert train.iloc[0]["data_source"] == arithmetic.DATA_SOURCE


def test_reward_is_the_recipes_math_verify_module():
    """The task's reward function is the GPU recipes' math-verify reward, scoring a row's ground truth."""
    assert arithmetic.REWARD_FUNCTION_PATH == "pkg://verl_offpolicy.rewards.math_verify_reward"
    row = arithmetic.make_row(("add", 3, 5), __import__("random").Random(0), split="test", index=0)
    truth = row["reward_model"]["ground_truth"]
    assert compute_score(arithmetic.DATA_SOURCE, "3 + 5 = 8, so the answer is \\boxed{8}.", truth) == 1.0
    assert compute_score(arithmetic.DATA_SOURCE, "The answer is \\boxed{9}.", truth) == 0.0
    assert compute_score(arithmetic.DATA_SOURCE, "The answer is 8.", truth) == 0.0  # no box
