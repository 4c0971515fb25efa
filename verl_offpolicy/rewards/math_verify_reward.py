"""Math answer reward with math-verify, for ``reward.custom_reward_function.path`` (Guru-Math recipe).

Calls ``math_verify.parse``/``verify`` directly: verl's ``reward_score.math_verify`` wrapper uses a
spawn process pool that silently returns 0.0 when imported without a ``__main__`` guard.
"""

from math_verify import parse, verify


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """1.0 if the response's final answer is mathematically equivalent to ``ground_truth``, else 0.0."""
    gold = parse(f"\\boxed{{{ground_truth}}}")
    answer = parse(solution_str)
    if not gold or not answer:
        return 0.0
    return 1.0 if verify(gold, answer) else 0.0
