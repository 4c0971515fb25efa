"""The configured reward function called before the run on the first training row, as verl's reward loop calls it.

Two startup checks read what the reward function answers before Ray starts: ``algorithm.filter_groups.metric``
must be a name it returns (:func:`verl_offpolicy.glue.scheduler.filtering.check_filter_metric`), and TOPR's
``signed`` reward mapping needs rewards in {0, 1} (:func:`verl_offpolicy.glue.algorithms.topr.check_topr_reward_range`).
:func:`first_row_answers` gives both the function's answers, or why they cannot be known before the run.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from omegaconf import OmegaConf

# verl's registered reward managers whose reward_extra_info is the reward function's dict (or {"acc": score}
# for a number), and whose reward is its "score" (or the number): experimental/reward_loop/reward_manager/
# {naive,dapo,gdpo,remote}.py.
DICT_OR_ACC_MANAGERS = ("naive", "dapo", "gdpo", "remote")
# The solution the probe scores as the row's own ground truth (a correct answer).
GROUND_TRUTH = None


def first_row_answers(config: Any, solutions: Sequence[str | None] = (GROUND_TRUTH,)) -> list[Any] | str:
    """The reward function's answer (a number or a dict) for each of ``solutions`` on the first training row
    (:data:`GROUND_TRUTH`: the row's ground truth as the response), called as verl's naive reward manager calls it.
    A string says why that cannot be known before the run (another reward manager, a reward model, no training
    file yet)."""
    import asyncio
    import inspect

    import pandas as pd
    from verl.trainer.ppo.reward import get_custom_reward_fn

    manager = OmegaConf.select(config, "reward.reward_manager", default=None) or {}
    if manager.get("source", "register") != "register" or manager.get("name", "naive") not in DICT_OR_ACC_MANAGERS:
        return f"reward.reward_manager {manager.get('source')}:{manager.get('name')} builds its own reward_extra_info"
    if OmegaConf.select(config, "reward.reward_model.enable", default=False):
        return "a reward model scores the samples"
    files = OmegaConf.select(config, "data.train_files", default=None)
    first = files if isinstance(files, str) else (list(files)[0] if files else None)
    if not first or not os.path.isfile(os.path.expanduser(first)):
        return f"no training file at data.train_files={first!r} yet"
    row = pd.read_parquet(os.path.expanduser(first)).iloc[0]
    truth = (row.get("reward_model") or {}).get("ground_truth", "")
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
    function = get_custom_reward_fn(config)
    if function is None:
        from verl.utils.reward_score import default_compute_score as function
    answers = []
    for solution in solutions:
        solution = str(truth) if solution is GROUND_TRUTH else solution
        result = function(
            data_source=row.get("data_source"), solution_str=solution, ground_truth=truth, extra_info=extra
        )
        if inspect.isawaitable(result):
            result = asyncio.run(result)
        answers.append(result)
    return answers


def reward_of(answer: Any) -> float:
    """The trajectory reward verl's reward manager takes from one answer: a dict's ``score``, or the number."""
    return float(answer["score"] if isinstance(answer, dict) else answer)
