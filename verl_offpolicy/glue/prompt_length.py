"""``data.truncation`` on verl's agent-loop path: a prompt longer than ``actor_rollout_ref.rollout.prompt_length``.

verl 0.9.1's ``RLHFDataset`` drops prompts longer than ``data.max_prompt_length`` when
``data.filter_overlong_prompts`` is true (its default) and reads ``data.truncation`` nowhere; its agent loop
(``AgentLoopBase._cap_text_prompt_length``, ``verl/experimental/agent_loop/agent_loop.py``) left-truncates every
longer prompt, with one logger warning per prompt, whatever ``data.truncation`` says. With
``filter_overlong_prompts=false`` a 100k-token prompt is then trained on as its last ``prompt_length`` tokens
and the console shows nothing. :func:`install_truncation_rule` makes the agent loop do what ``data.truncation``
says, with the arithmetic of verl's own ``tokenize_and_postprocess_data`` (``verl/utils/torch_functional.py``):

- ``error`` (verl's default): the run stops, naming the prompt's length, the limit, the start of its text and
  the keys that fix it;
- ``left`` / ``right`` / ``middle``: the prompt's last, first, or first and last tokens are kept, and the
  process says so once on the console (a line on standard error, which Ray shows on the driver's console).
"""

from __future__ import annotations

import sys

from verl_offpolicy.glue.knobs import OffPolicyConfigError, select
from verl_offpolicy.glue.patching import patch_once

TRUNCATION_KEY = "data.truncation"
TRUNCATION_MODES = ("error", "left", "right", "middle")  # verl/utils/torch_functional.py: tokenize_and_postprocess_data
LIMIT_KEY = "actor_rollout_ref.rollout.prompt_length"
SHOWN_CHARS = 80  # of a too-long prompt's text, in its error


class PromptTooLongError(ValueError):
    """A prompt longer than ``rollout.prompt_length`` under ``data.truncation=error``."""


def truncated(prompt_ids: list[int], limit: int, mode: str) -> list[int]:
    """``prompt_ids`` cut to ``limit`` tokens as verl's ``tokenize_and_postprocess_data`` cuts under ``mode``:
    left keeps the last ``limit``, right the first ``limit``, middle the first ⌊limit/2⌋ and the last
    ``limit - ⌊limit/2⌋``."""
    if mode == "left":
        return prompt_ids[-limit:]
    if mode == "right":
        return prompt_ids[:limit]
    head = limit // 2
    return prompt_ids[:head] + prompt_ids[len(prompt_ids) - (limit - head) :]


def too_long_message(length: int, limit: int, text: str) -> str:
    return (
        f"a prompt of {length} tokens exceeds {LIMIT_KEY}={limit} and {TRUNCATION_KEY}=error (the prompt begins "
        f"{text[:SHOWN_CHARS]!r}): set data.filter_overlong_prompts=true (verl drops prompts longer than "
        f"data.max_prompt_length), raise data.max_prompt_length, or set {TRUNCATION_KEY} to one of "
        f"{', '.join(m for m in TRUNCATION_MODES if m != 'error')}"
    )


_announced: set[str] = set()  # the modes this process has said it truncates with


def _cap_by_truncation(original):
    def _cap_text_prompt_length(self, prompt_ids):
        limit = self.rollout_config.prompt_length
        if len(prompt_ids) <= limit:
            return prompt_ids
        mode = self.data_config.get("truncation", "error")
        if mode not in TRUNCATION_MODES:
            return original(self, prompt_ids)  # refused at startup; a config built without it keeps verl's rule
        if mode == "error":
            text = self.tokenizer.decode(prompt_ids[: SHOWN_CHARS * 2]) if self.tokenizer is not None else ""
            raise PromptTooLongError(too_long_message(len(prompt_ids), limit, text))
        if mode not in _announced:
            _announced.add(mode)
            print(
                f"verl-offpolicy: warning: prompts longer than {LIMIT_KEY}={limit} tokens are {mode}-truncated "
                f"({TRUNCATION_KEY}={mode}; the first had {len(prompt_ids)} tokens)",
                file=sys.stderr,
                flush=True,
            )
        return truncated(prompt_ids, limit, mode)

    return _cap_text_prompt_length


def install_truncation_rule() -> None:
    """Rebind verl's ``AgentLoopBase._cap_text_prompt_length`` to :func:`_cap_by_truncation`'s (once)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase

    patch_once(AgentLoopBase, "_cap_text_prompt_length", _cap_by_truncation)


def check_truncation(view) -> None:
    """``data.truncation`` is a mode verl knows (else verl's dataset would not say so until it truncates)."""
    mode = select(view.cfg, TRUNCATION_KEY)
    if mode is not None and mode not in TRUNCATION_MODES:
        raise OffPolicyConfigError(f"{TRUNCATION_KEY}={mode!r} is not valid; allowed: {', '.join(TRUNCATION_MODES)}")


RULES = (check_truncation,)
