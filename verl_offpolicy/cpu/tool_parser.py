"""``words``: a tool-call format a word-level tokenizer can emit, registered in verl's ``ToolParser`` registry.

verl's formats (``hermes``, ``gpt-oss``, ...) wrap JSON in markers; a word-level vocabulary (the tiny
demo model's) cannot spell JSON. Here a call is the token :data:`CALL_TOKEN`, optionally preceded by the
tool's name::

    lookup <|call|>      -> lookup()
    <|call|>             -> the run's only tool, called without arguments

Generation stops at the call token (``stop_token_ids``), so a call ends the model's turn, as a Qwen3
model's EOS after ``</tool_call>`` does. The text before the call is the turn's content; a turn without
the call token calls nothing. Arguments are not expressible: the tools this format serves take their
inputs from the trajectory (verl's ``tools_kwargs``), as the tiny tool task's does.
"""

from __future__ import annotations

from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser

from verl_offpolicy.glue.registration import WORD_TOOL_PARSER

CALL_TOKEN = "<|call|>"


@ToolParser.register(WORD_TOOL_PARSER)
class WordToolParser(ToolParser):
    """``[name] <|call|>`` (module docstring)."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer)
        call_id = tokenizer.convert_tokens_to_ids(CALL_TOKEN)
        if call_id is None or call_id == tokenizer.unk_token_id:
            raise ValueError(
                f"actor_rollout_ref.rollout.multi_turn.format={WORD_TOOL_PARSER} needs the token {CALL_TOKEN!r} in "
                "the tokenizer's vocabulary (the tiny tool model's has it); use verl's hermes format for other models"
            )
        self.call_id = int(call_id)

    @property
    def stop_token_ids(self) -> list[int]:
        return [self.call_id]

    async def extract_tool_calls(self, responses_ids: list[int], tools=None) -> tuple[str, list[FunctionCall]]:
        ids = list(responses_ids)
        if self.call_id not in ids:
            return self.tokenizer.decode(ids, skip_special_tokens=True), []
        before = ids[: ids.index(self.call_id)]
        words = self.tokenizer.decode(before, skip_special_tokens=True).split()
        names = [tool.function.name for tool in tools or []]
        if words and words[-1] in names:
            name, words = words[-1], words[:-1]
        elif len(names) == 1:
            name = names[0]
        else:
            name = words[-1] if words else ""  # verl's loop answers an unknown name with the tools it has
        return " ".join(words), [FunctionCall(name=name, arguments="{}")]
