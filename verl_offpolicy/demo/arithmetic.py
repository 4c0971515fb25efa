"""Grade-school arithmetic word problems for a real instruct model on the CPU, scored by math-verify.

A problem is a sentence pair about a person and objects ("Mia has 3 apples. She buys 5 more apples.
How many apples does Mia have now?") followed by :data:`INSTRUCTION`, which asks for the answer in
``\\boxed{}``, after one worked example exchange (:data:`EXAMPLE`, ``shots=1``; ``shots=0`` leaves
it out). The answer is ``a + b`` (``add``), ``a - b`` with ``a >= b`` (``sub``), or, in two steps,
``a + b - c`` with ``c < a + b`` (``add_sub``: "... buys b more ... then gives away c ...").

Difficulty knob ``digits``: operands are drawn from ``[1, 10**digits - 1]``. An earlier experiment
with SmolLM2-135M-Instruct (no worked example, math-verify on the whole response rather than the last
box) found single-digit sums right in 12/16 greedy answers and 19-25% of samples (mixed groups), and
two-digit sums right in 0-12% greedy (almost no signal); the demo therefore uses ``digits=1``.

Train/validation split: the operand pairs ``(operation, a, b)`` are shuffled with ``seed`` and the
first ``val_fraction`` of them are held out, so no validation pair is ever trained on; each row then
gets a name, an object and a template from the same seeded generator. Same arguments, same files.

The rows are verl's RLHF parquet format: ``prompt`` is a chat message list, and verl's own data path
(``RLHFDataset``/the agent loop) applies the tokenizer's chat template. The reward is the GPU
recipes' math-verify reward (:mod:`verl_offpolicy.rewards.math_verify_reward`: the response's last
``\\boxed{}`` against ``reward_model.ground_truth``)::

    reward.custom_reward_function.path=pkg://verl_offpolicy.rewards.math_verify_reward
    reward.custom_reward_function.name=compute_score
"""

from __future__ import annotations

import os
import random
from typing import Any, Sequence

DATA_SOURCE = "verl_offpolicy/arithmetic"
ABILITY = "math"
REWARD_FUNCTION_PATH = "pkg://verl_offpolicy.rewards.math_verify_reward"
REWARD_FUNCTION_NAME = "compute_score"
INSTRUCTION = "Put the final answer in \\boxed{}."
OPERATIONS = ("add", "sub", "add_sub")

NAMES = (
    ("Mia", "She"),
    ("Tom", "He"),
    ("Ava", "She"),
    ("Leo", "He"),
    ("Zoe", "She"),
    ("Sam", "He"),
    ("Lily", "She"),
    ("Ben", "He"),
)
OBJECTS = ("apples", "marbles", "stickers", "pencils", "cookies", "books", "shells", "coins")
TEMPLATES = {
    "add": (
        "{name} has {a} {obj}. {pronoun} buys {b} more {obj}. How many {obj} does {name} have now?",
        "{name} had {a} {obj}. A friend gave {name} {b} {obj}. How many {obj} does {name} have in total?",
    ),
    "sub": (
        "{name} has {a} {obj}. {pronoun} gives away {b} {obj}. How many {obj} does {name} have left?",
        "{name} had {a} {obj} and lost {b} of them. How many {obj} does {name} have now?",
    ),
    "add_sub": (
        "{name} has {a} {obj}. {pronoun} buys {b} more {obj} and then gives away {c} {obj}. How many {obj} does "
        "{name} have now?",
        "{name} had {a} {obj}. A friend gave {name} {b} more {obj}, and then {name} lost {c} {obj}. How many "
        "{obj} does {name} have now?",
    ),
}


def answer(operation: str, a: int, b: int, c: int = 0) -> int:
    """``a + b`` for ``add``, ``a - b`` for ``sub``, ``a + b - c`` for ``add_sub``."""
    return {"add": a + b, "sub": a - b, "add_sub": a + b - c}[operation]


def operand_pairs(digits: int, operations: Sequence[str]) -> list[tuple]:
    """Every ``(operation, a, b)`` with ``1 <= a, b <= 10**digits - 1`` (``a >= b`` for ``sub``), and every
    ``("add_sub", a, b, c)`` with ``1 <= a, b, c <= 10**digits - 1`` and ``c < a + b``, in a fixed order."""
    if not isinstance(digits, int) or not 1 <= digits <= 3:
        raise ValueError(f"digits must be 1, 2 or 3, got {digits!r}")
    unknown = [op for op in operations if op not in OPERATIONS]
    if unknown or not operations:
        raise ValueError(f"operations must be a non-empty subset of {OPERATIONS}, got {list(operations)}")
    numbers = range(1, 10**digits)
    out = []
    for op in operations:
        if op == "add_sub":
            out += [(op, a, b, c) for a in numbers for b in numbers for c in numbers if c < a + b]
        else:
            out += [(op, a, b) for a in numbers for b in numbers if op == "add" or a >= b]
    return out


def problem_text(
    operation: str, a: int, b: int, c: int = 0, *, name: str, pronoun: str, obj: str, template: int
) -> str:
    """The question: ``TEMPLATES[operation][template]`` about ``name`` (``pronoun``) and ``a``, ``b`` (``c``)
    ``obj``."""
    return TEMPLATES[operation][template].format(name=name, pronoun=pronoun, a=a, b=b, c=c, obj=obj)


# One worked example, as a first user/assistant exchange (shots=1): SmolLM2-135M-Instruct asked for
# \boxed{} without it never wrote one (measured: 0 of 16 sampled answers boxed, so every reward was 0).
EXAMPLE = (
    "Ben has 12 pens. He buys 5 more pens. How many pens does Ben have now?",
    "Ben has 12 pens and buys 5 more, so he has 12 + 5 = 17 pens. The answer is \\boxed{17}.",
)


# The worked example of a two-step problem (``add_sub``): with the one-step example SmolLM2-135M-Instruct
# answered a + b - c problems by their last step alone (greedy 4 of 64 right, benchmarks/results/smollm2_task_probe.md).
TWO_STEP_EXAMPLE = (
    "Ben has 12 pens. He buys 5 more pens and then gives away 3 pens. How many pens does Ben have now?",
    "Ben has 12 pens and buys 5 more, so he has 12 + 5 = 17 pens. He gives away 3, so he has 17 - 3 = 14 pens. "
    "The answer is \\boxed{14}.",
)
EXAMPLES = {"add": EXAMPLE, "sub": EXAMPLE, "add_sub": TWO_STEP_EXAMPLE}


def messages(question: str, shots: int, example: tuple[str, str] = EXAMPLE) -> list[dict[str, str]]:
    """The chat: ``shots`` (0 or 1) worked example exchanges (``example``: question, answer), then the question
    with :data:`INSTRUCTION`."""
    if shots not in (0, 1):
        raise ValueError(f"shots must be 0 or 1, got {shots!r}")
    example = [
        {"role": "user", "content": f"{example[0]} {INSTRUCTION}"},
        {"role": "assistant", "content": example[1]},
    ]
    return [*example[: 2 * shots], {"role": "user", "content": f"{question} {INSTRUCTION}"}]


def make_row(problem: tuple, rng: random.Random, *, split: str, index: int, shots: int = 1) -> dict[str, Any]:
    """One parquet row for ``problem`` = ``(operation, a, b)`` or ``("add_sub", a, b, c)``; name, object and
    template drawn from ``rng``."""
    operation, *operands = problem
    name, pronoun = rng.choice(NAMES)
    obj = rng.choice(OBJECTS)
    template = rng.randrange(len(TEMPLATES[operation]))
    question = problem_text(operation, *operands, name=name, pronoun=pronoun, obj=obj, template=template)
    result = answer(operation, *operands)
    extra = dict(zip("abc", operands))
    return {
        "data_source": DATA_SOURCE,
        "prompt": messages(question, shots, EXAMPLES[operation]),
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": str(result)},
        "extra_info": {"split": split, "index": index, "operation": operation, **extra, "answer": result},
    }


def generate(
    *,
    digits: int = 1,
    operations: Sequence[str] = ("add",),
    train_size: int = 256,
    val_size: int = 16,
    val_fraction: float = 0.25,
    seed: int = 0,
    shots: int = 1,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, validation rows): see the module docstring for the split and the difficulty knob.

    Train rows draw their operand pairs with replacement from the train pairs; validation rows are
    the first ``val_size`` held-out pairs (each once).
    """
    pairs = operand_pairs(digits, operations)
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    rng = random.Random(seed)
    rng.shuffle(pairs)
    n_val = max(1, round(len(pairs) * val_fraction))
    held_out, train_pairs = pairs[:n_val], pairs[n_val:]
    if val_size > len(held_out):
        raise ValueError(
            f"val_size={val_size} exceeds the {len(held_out)} held-out pairs (digits={digits}, "
            f"val_fraction={val_fraction})"
        )
    train = [make_row(rng.choice(train_pairs), rng, split="train", index=i, shots=shots) for i in range(train_size)]
    val = [make_row(pair, rng, split="test", index=i, shots=shots) for i, pair in enumerate(held_out[:val_size])]
    return train, val


def build_dataset(out_dir: str | os.PathLike, **kwargs: Any) -> dict[str, str]:
    """Write ``train.parquet`` and ``val.parquet`` (:func:`generate` with ``kwargs``) to ``out_dir``; return
    their paths."""
    from verl_offpolicy.demo.repeat_task import write_splits

    return write_splits(out_dir, *generate(**kwargs))
