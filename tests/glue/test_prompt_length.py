"""``data.truncation`` on verl's agent-loop path (:mod:`verl_offpolicy.glue.prompt_length`), through verl's own
``AgentLoopBase._cap_text_prompt_length`` as ``import verl`` leaves it in every worker. The agent loop's ``self``
is a namespace with the three attributes the method reads (a real agent loop needs a rollout server)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


@pytest.fixture(scope="module")
def cap():
    import verl  # noqa: F401 - the plugin registers our import hooks
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase

    from verl_offpolicy.glue.patching import is_patched

    assert is_patched(AgentLoopBase._cap_text_prompt_length)
    return AgentLoopBase._cap_text_prompt_length


class _Tokenizer:
    def decode(self, ids):
        return " ".join(f"t{i}" for i in ids)


def _loop(mode: str, limit: int):
    return SimpleNamespace(
        rollout_config=SimpleNamespace(prompt_length=limit),
        data_config={"truncation": mode},
        tokenizer=_Tokenizer(),
    )


IDS = list(range(10))


@pytest.mark.parametrize(
    "mode,limit,kept",
    [
        ("left", 4, [6, 7, 8, 9]),  # the last 4
        ("right", 4, [0, 1, 2, 3]),  # the first 4
        ("middle", 4, [0, 1, 8, 9]),  # 2 first, 2 last
        ("middle", 5, [0, 1, 7, 8, 9]),  # floor(5/2) = 2 first, 3 last
    ],
)
def test_a_too_long_prompt_is_cut_as_data_truncation_says(cap, mode, limit, kept):
    assert cap(_loop(mode, limit), IDS) == kept


def _announced():
    from verl_offpolicy.glue.prompt_length import _announced

    return _announced


def test_truncation_error_stops_naming_the_length_the_limit_and_the_text(cap):
    from verl_offpolicy.glue.prompt_length import PromptTooLongError

    with pytest.raises(PromptTooLongError) as caught:
        cap(_loop("error", 4), IDS)
    message = str(caught.value)
    assert (
        "a prompt of 10 tokens exceeds actor_rollout_ref.rollout.prompt_length=4 and data.truncation=error" in message
    )
    assert "'t0 t1 t2" in message and "data.filter_overlong_prompts=true" in message


def test_a_prompt_that_fits_is_left_alone(cap):
    assert cap(_loop("error", 10), IDS) == IDS
    assert cap(_loop("right", 12), IDS) == IDS


def test_the_console_says_once_per_process_that_prompts_are_truncated(cap, capsys):
    _announced().discard("right")
    cap(_loop("right", 4), IDS)
    cap(_loop("right", 3), IDS)
    err = capsys.readouterr().err
    assert err.count("verl-offpolicy: warning: prompts longer than") == 1
    assert "right-truncated (data.truncation=right; the first had 10 tokens" in err
