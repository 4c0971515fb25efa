"""The reward of the synthetic "repeat the symbol" task (its data: :mod:`verl_offpolicy.demo.repeat_task`).

Prompt: ``repeat <s>`` for a symbol ``s``. Reward: the fraction of the response budget filled with ``s``,

    r = #{response words equal to s} / max_response_length  in [0, 1],

so it is dense (a random model already scores ~1/|vocab| per token, so GRPO groups have non-zero
advantages) and cannot be gamed by stopping early. verl's reward loop loads it in its own processes
with verl's custom reward function mechanism:

    reward.custom_reward_function.path=pkg://verl_offpolicy.cpu.task
    reward.custom_reward_function.name=compute_score

``compute_score_binary`` is the same task with a 0/1 reward (the first word is the symbol or not), for
algorithms defined on verifiable 0/1 rewards (TOPR's ``signed`` mapping).
"""

from __future__ import annotations

from typing import Any, Optional

REWARD_FUNCTION_PATH = "pkg://verl_offpolicy.cpu.task"
REWARD_FUNCTION_NAME = "compute_score"
# A row's budget (``extra_info``): what the reward divides by.
BUDGET_KEY = "max_response_length"
# A row's response cap (``extra_info``, optional): the seeded agent loops pass it to the rollout as the sample's
# ``max_tokens`` (the long-tailed variant of the task sets it to the row's budget; verl caps it at its own
# ``response_length``).
ROW_MAX_TOKENS_KEY = "max_tokens"


def score(response_words: list[str], target: str, budget: int) -> float:
    """Fraction of ``budget`` filled with ``target`` (words beyond the budget do not count)."""
    if budget <= 0:
        return 0.0
    return sum(word == target for word in response_words[:budget]) / budget


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: Optional[dict[str, Any]] = None,
    **kwargs: Any,
) -> float:
    """verl custom reward function (``reward.custom_reward_function``) of the repeat task."""
    words = solution_str.split()
    budget = None
    if isinstance(extra_info, dict):
        budget = extra_info.get(BUDGET_KEY)
    if not budget:
        budget = max(len(words), 1)
    return score(words, str(ground_truth), int(budget))


def compute_score_binary(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: Optional[dict[str, Any]] = None,
    **kwargs: Any,
) -> float:
    """The repeat task with a verifiable 0/1 reward (``reward.custom_reward_function.name=compute_score_binary``):
    1 if the response's first word is the symbol (the answer is right), else 0."""
    return float(solution_str.split()[:1] == [str(ground_truth)])
