"""Multi-turn tool agents on the CPU path (docs/multi_turn.md): the ``words`` tool-call format, the tiny tool
task (its tool, data and reward), verl's tool agent loop on the ``hf`` server (the response mask of a
trajectory with a tool call) and the startup rules of ``actor_rollout_ref.rollout.multi_turn``.

The end-to-end runs of the tool task through the scheduler are in tests/scheduler/test_multi_turn_e2e.py.
"""

from __future__ import annotations

import asyncio

import pytest
from verl.experimental.agent_loop.tool_parser import ToolParser
from verl.tools.tool_registry import load_all_tools

from tests.cpu_harness import isolated
from tests.hydra_utils import VALID_SIZES, compose_main_ppo
from verl_offpolicy.cpu.tool_parser import CALL_TOKEN
from verl_offpolicy.demo.models import _tool_task_overrides
from verl_offpolicy.demo.tiny import TOOL_ROLE, TOOL_TASK_TOKENS, build_tokenizer
from verl_offpolicy.demo.tool_task import ANSWER_SLOTS, REPLY_WORDS, TOOL_CONFIG, compute_score
from verl_offpolicy.glue.registration import WORD_TOOL_PARSER
from verl_offpolicy.glue.validation import OffPolicyConfigError, validate_offpolicy_config

MULTI_TURN = "actor_rollout_ref.rollout.multi_turn"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tool_tokenizer"), task="tool")


def _schemas():
    return [tool.tool_schema for tool in load_all_tools(TOOL_CONFIG, None)]


# ---------------------------------------------------------------- the words format


def test_the_call_token_is_a_word_of_the_tool_tokenizer(tokenizer):
    assert CALL_TOKEN in TOOL_TASK_TOKENS and TOOL_ROLE in TOOL_TASK_TOKENS
    assert tokenizer.convert_tokens_to_ids(CALL_TOKEN) != tokenizer.unk_token_id


@pytest.mark.parametrize(
    "words,content,name",
    [
        ("e <|call|>", "e", "lookup"),  # the run's only tool, whatever comes before
        ("<|call|>", "", "lookup"),
        ("a lookup <|call|>", "a", "lookup"),  # named
        ("a b </s>", "a b", None),  # no call token: no call
    ],
)
def test_the_words_parser_reads_a_call(tokenizer, words, content, name):
    parser = ToolParser.get_tool_parser(WORD_TOOL_PARSER, tokenizer)
    assert parser.stop_token_ids == [tokenizer.convert_tokens_to_ids(CALL_TOKEN)]
    ids = tokenizer.convert_tokens_to_ids(words.split())
    text, calls = asyncio.run(parser.extract_tool_calls(ids, _schemas()))
    assert text == content
    assert [(c.name, c.arguments) for c in calls] == ([(name, "{}")] if name else [])


def test_the_words_parser_refuses_a_tokenizer_without_the_call_token(tmp_path):
    with pytest.raises(ValueError, match=r"multi_turn.format=words needs the token '<\|call\|>'"):
        ToolParser.get_tool_parser(WORD_TOOL_PARSER, build_tokenizer(tmp_path, task="repeat"))


# ---------------------------------------------------------------- the tool task


def test_the_lookup_tool_answers_its_rows_value():
    (tool,) = load_all_tools(TOOL_CONFIG, None)

    async def call():
        instance, _ = await tool.create(create_kwargs={"value": "f"})
        response, reward, _ = await tool.execute(instance, {})
        await tool.release(instance)
        return response.text, reward

    assert asyncio.run(call()) == (" ".join(["f"] * REPLY_WORDS), 0.0)


@pytest.mark.parametrize(
    "trajectory,score",
    [
        # decoded as verl's reward loop does (special tokens dropped): turn 1, <|call|>, the tool's reply, turn 2
        ("<|call|> <|tool|> c c c c c c c", 1.0),
        ("e <|call|> <|tool|> c c c c c e c", 0.75),  # 3 of the 4 answer slots
        ("<|call|> <|tool|> c c c", 0.0),  # no answer
        ("c c c c c c c c", 0.0),  # no call: the value cannot be known, a guess earns nothing
        # the reply after the first call is the tool's; turn 2's 4 slots are a, <|call|>, <|tool|>, c (words the
        # model wrote: it gets no second reply, max_assistant_turns=2): 1 of 4
        ("<|call|> <|tool|> c c c a <|call|> <|tool|> c c c c", 0.25),
    ],
)
def test_the_tool_task_reward_reads_the_answer_after_the_tools_reply(trajectory, score):
    assert REPLY_WORDS == 3 and ANSWER_SLOTS == 4  # the hand cases above
    assert compute_score("verl_offpolicy/lookup", trajectory, "c") == score


@pytest.mark.slow  # the hf server in a fresh process
def test_tool_output_is_outside_the_response_mask(tmp_path):
    """verl's tool agent loop (seeded) with the real hf server on the untrained tiny tool model: a trajectory
    that calls the tool has mask 1 on every token the model sampled (up to and including the call token, and
    its second turn) and 0 on the tool's reply and the next generation prompt, with log-prob 0 there."""
    report = isolated("tests.scenario_tool_agent:tool_trajectories", timeout=600, workdir=str(tmp_path), samples=16)
    called = [t for t in report["trajectories"] if t["num_turns"] >= 3]
    assert called, "no sample of 16 called the tool: the check below would test nothing"
    for t in called:
        call = t["tokens"].index(CALL_TOKEN)
        context = 1 + REPLY_WORDS + 1  # <|tool|>, the reply, <|assistant|>
        assert t["tokens"][call + 1 : call + 1 + context] == [TOOL_ROLE, *["c"] * REPLY_WORDS, "<|assistant|>"]
        expected = [1] * (call + 1) + [0] * context + [1] * (len(t["tokens"]) - call - 1 - context)
        assert t["mask"] == expected[: len(t["tokens"])]
        assert all(lp == 0.0 for lp, m in zip(t["log_probs"], t["mask"], strict=True) if m == 0)
        assert all(lp < 0.0 for lp, m in zip(t["log_probs"], t["mask"], strict=True) if m == 1)
    assert (
        any(t["num_turns"] == 2 for t in report["trajectories"]) or len(called) == 16
    )  # turn 1 without a call ends it


# ---------------------------------------------------------------- startup rules


def _validate(extra=()):
    tool = [o for o in _tool_task_overrides() if not o.startswith("reward.")]
    validate_offpolicy_config(compose_main_ppo("offpolicy_trainer", ["algorithm=opmd", *VALID_SIZES, *tool, *extra]))


@pytest.fixture()
def train_file(tmp_path):
    """A training parquet in verl's layout; ``train_file(agent_name)`` adds verl's per-row ``agent_name`` column
    (as verl's multi-turn preprocessing writes it)."""
    import pandas as pd

    def write(agent_name=None):
        rows = {
            "prompt": [[{"role": "user", "content": "1+1"}]] * 2,
            "data_source": ["t"] * 2,
            "reward_model": [{"style": "rule", "ground_truth": "2"}] * 2,
        }
        if agent_name is not None:
            rows["agent_name"] = [agent_name] * 2
        path = tmp_path / f"train_{agent_name}.parquet"
        pd.DataFrame(rows).to_parquet(path)
        return f"data.train_files={path}"

    return write


def test_the_tool_demos_settings_validate():
    _validate()


@pytest.mark.parametrize(
    "override,message",
    [
        (
            "actor_rollout_ref.rollout.agent.default_agent_loop=seeded_single_turn_agent",
            r"default_agent_loop=seeded_single_turn_agent is a single-turn agent loop and data.train_files has no "
            r"'agent_name' column: it never calls a tool\. "
            r"Set .* to a multi-turn one \(registered: .*seeded_tool_agent.*tool_agent",
        ),
        (
            "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent",
            r"single_turn_agent is a single-turn agent loop",
        ),
        (
            f"{MULTI_TURN}.format=bogus",
            r"format='bogus' is not a registered tool-call parser; allowed values: .*hermes.*words",
        ),
        (
            f"{MULTI_TURN}.tool_config_path=/nonexistent/tools.yaml",
            r"tool_config_path=/nonexistent/tools.yaml: the tools do not load \(FileNotFoundError",
        ),
    ],
)
def test_a_multi_turn_setting_that_cannot_run_is_refused_at_startup(override, message, train_file):
    with pytest.raises(OffPolicyConfigError, match=message):
        _validate([override, train_file()])


SINGLE_TURN_DEFAULT = "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent"


def test_the_datas_agent_name_column_picks_the_loop(train_file):
    """verl picks the loop per row from `agent_name` (its gsm8k multi-turn preprocessing writes tool_agent into
    every row): verl's default single_turn_agent then never runs, and nothing is refused."""
    _validate([SINGLE_TURN_DEFAULT, train_file("tool_agent")])
    with pytest.raises(
        OffPolicyConfigError,
        match=r"the rows of data.train_files name single-turn agent loops in their "
        r"'agent_name' column \(single_turn_agent\)",
    ):
        _validate([SINGLE_TURN_DEFAULT, train_file("single_turn_agent")])
    with pytest.raises(
        OffPolicyConfigError,
        match=r"single_turn_agent is a single-turn agent loop and data.train_files "
        r"has no 'agent_name' column",
    ):
        _validate([SINGLE_TURN_DEFAULT, train_file()])


def test_training_data_not_readable_here_is_a_warning_naming_the_column(caplog):
    """A cluster path on a login node: the column cannot be read, so a warning, not a refusal."""
    with caplog.at_level("WARNING"):
        _validate([SINGLE_TURN_DEFAULT, "data.train_files=/cluster/only/train.parquet"])
    assert "whether its rows name a multi-turn loop in their 'agent_name' column" in caplog.text


def test_a_tool_config_whose_class_does_not_import_is_refused(tmp_path):
    bad = tmp_path / "tools.yaml"
    bad.write_text(open(TOOL_CONFIG).read().replace("tool_task.LookupTool", "tool_task.NoSuchTool"))
    with pytest.raises(
        OffPolicyConfigError,
        match=rf"tool_config_path={bad}: tool class NoSuchTool is not in its module "
        r"verl_offpolicy.demo.tool_task \(renamed or removed",
    ):
        _validate([f"{MULTI_TURN}.tool_config_path={bad}"])
    missing = tmp_path / "tools_missing_module.yaml"
    missing.write_text(
        open(TOOL_CONFIG).read().replace("verl_offpolicy.demo.tool_task.LookupTool", "gone_package.tools.LookupTool")
    )
    with pytest.raises(
        OffPolicyConfigError,
        match=r"tool class LookupTool cannot be imported: its module gone_package.tools "
        r"raises ModuleNotFoundError",
    ):
        _validate([f"{MULTI_TURN}.tool_config_path={missing}"])


def test_single_turn_runs_are_not_checked_for_tools():
    """multi_turn.enable=false (verl's default): the tool keys are not read, so nothing is refused."""
    _validate(
        [
            f"{MULTI_TURN}.enable=false",
            f"{MULTI_TURN}.format=bogus",
            "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent",
        ]
    )
