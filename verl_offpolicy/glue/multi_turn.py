"""Startup rules of verl's multi-turn rollout (``actor_rollout_ref.rollout.multi_turn``), before Ray starts.

verl reads these keys only inside its agent-loop workers, minutes into a run: an unknown tool-call format
or a tool config that does not load fails there, and ``multi_turn.enable=true`` with a single-turn agent
loop runs single-turn, silently. Here, with verl's own loaders, as the workers will:

- the agent loop (``agent.default_agent_loop``) must be able to call tools: one whose class is verl's
  single-turn loop (or a subclass, as ``seeded_single_turn_agent``) never does;
- ``multi_turn.format`` must name a parser of verl's ``ToolParser`` registry;
- ``multi_turn.tool_config_path`` must load (verl's ``initialize_tools_from_config``: the file, its classes,
  their schemas).
- ``agent.default_agent_loop`` must name a loop the workers will have (registered, or declared in
  ``agent.agent_loop_config_path``);
- the model's tokenizer (a local folder) must spell the format's call markers (the ``words`` format: its call
  token), a tool agent loop needs tools (``tool_config_path`` or ``function_tool_path``), and the turn limits are
  null or integers >= 1 (verl reads 0 as no limit).
"""

from __future__ import annotations

import contextlib
import io

from verl_offpolicy.glue.knobs import OffPolicyConfigError

MULTI_TURN = "actor_rollout_ref.rollout.multi_turn"
AGENT_LOOP = "actor_rollout_ref.rollout.agent.default_agent_loop"


def _enabled(view) -> bool:
    return bool(view.select(f"{MULTI_TURN}.enable", False))


def check_agent_loop(view) -> None:
    """``multi_turn.enable=true`` needs an agent loop that calls tools (not verl's single-turn one)."""
    if not _enabled(view):
        return
    from hydra.utils import get_class
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

    name = view.select(AGENT_LOOP)
    entry = _agent_loop_registry.get(name)
    if entry is None:
        return  # a loop of agent.agent_loop_config_path, registered in the workers: verl names it if unknown
    if issubclass(get_class(entry["_target_"]), SingleTurnAgentLoop):
        multi = sorted(n for n, e in _agent_loop_registry.items() if not issubclass(get_class(e["_target_"]), SingleTurnAgentLoop))
        raise OffPolicyConfigError(
            f"{MULTI_TURN}.enable=true, but {AGENT_LOOP}={name} is a single-turn agent loop: it never calls a tool. "
            f"Set {AGENT_LOOP} to a multi-turn one (registered: {', '.join(multi)}) or {MULTI_TURN}.enable=false"
        )


def check_tool_format(view) -> None:
    """``multi_turn.format`` names a registered tool-call parser."""
    if not _enabled(view):
        return
    from verl.experimental.agent_loop.tool_parser import ToolParser

    import verl.experimental.agent_loop  # noqa: F401 - its import registers verl's parsers (and ours)

    name = view.select(f"{MULTI_TURN}.format")
    if name not in ToolParser._registry:
        raise OffPolicyConfigError(
            f"{MULTI_TURN}.format={name!r} is not a registered tool-call parser; allowed values: "
            f"{', '.join(sorted(ToolParser._registry))}"
        )


def check_tool_config(view) -> None:
    """``multi_turn.tool_config_path`` loads with verl's loader: the file, its tool classes and schemas."""
    path = view.select(f"{MULTI_TURN}.tool_config_path")
    if not _enabled(view) or not path:
        return
    from verl.tools.tool_registry import initialize_tools_from_config
    from verl.utils.import_utils import resolve_config_path

    try:
        with contextlib.redirect_stdout(io.StringIO()):  # BaseTool prints each tool's schema
            tools = initialize_tools_from_config(resolve_config_path(str(path)))
    except Exception as exc:  # noqa: BLE001 - any failure is the answer, named
        raise OffPolicyConfigError(
            f"{MULTI_TURN}.tool_config_path={path}: the tools do not load ({type(exc).__name__}: {exc})"
        ) from None
    if not tools:
        raise OffPolicyConfigError(f"{MULTI_TURN}.tool_config_path={path} declares no tool (its `tools:` list is empty)")


AGENT_LOOP_CONFIG = "actor_rollout_ref.rollout.agent.agent_loop_config_path"


def _registered_agent_loops(view) -> set[str]:
    """The agent loops verl's workers will know: its registry after ``import verl.experimental.agent_loop`` (verl's,
    ours), plus the ``name`` of every entry of ``agent.agent_loop_config_path`` (loaded as verl's workers load it)."""
    import verl.experimental.agent_loop  # noqa: F401 - its import registers verl's loops
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    names = set(_agent_loop_registry)
    path = view.select(AGENT_LOOP_CONFIG)
    if path:
        from omegaconf import OmegaConf
        from verl.utils.import_utils import resolve_config_path

        try:
            names.update(str(entry.name) for entry in OmegaConf.load(resolve_config_path(str(path))))
        except Exception as exc:  # noqa: BLE001 - any failure is the answer, named
            raise OffPolicyConfigError(
                f"{AGENT_LOOP_CONFIG}={path}: verl's workers cannot load it as a list of agent loops with a `name` "
                f"each ({type(exc).__name__}: {exc})"
            ) from None
    return names


def check_agent_loop_registered(view) -> None:
    """``agent.default_agent_loop`` names an agent loop the workers will have: a registered one or one declared in
    ``agent.agent_loop_config_path`` (verl looks it up per batch, minutes into the run, with a KeyError)."""
    name = view.select(AGENT_LOOP)
    if name is None:
        return
    known = _registered_agent_loops(view)
    if name not in known:
        raise OffPolicyConfigError(
            f"{AGENT_LOOP}={name!r} is not an agent loop verl's workers will have; allowed values: "
            f"{', '.join(sorted(known))}, or declare it (name, _target_) in a file named by {AGENT_LOOP_CONFIG}"
        )


def _local_tokenizer(view):
    """The tokenizer verl's workers load (``model.tokenizer_path``, else ``model.path``) when it is a local folder,
    loaded as verl loads it; None when it is not on this machine (a hub name, a cluster path)."""
    import os

    path = view.select("actor_rollout_ref.model.tokenizer_path") or view.select("actor_rollout_ref.model.path")
    if not path or not os.path.isdir(os.path.expanduser(str(path))):
        return None
    from verl.utils import hf_tokenizer

    trust = bool(view.select("actor_rollout_ref.model.trust_remote_code", False))
    return hf_tokenizer(os.path.expanduser(str(path)), trust_remote_code=trust)


def check_tool_format_tokenizer(view) -> None:
    """The tool-call format can be spelled by the model's tokenizer (checked when the tokenizer is a local folder):
    verl's parser is built with it, as the agent loop builds it (the ``words`` format needs its call token in the
    vocabulary), and each marker the parser looks for (``<tool_call>``, ...) must encode without the unknown token
    and decode back to itself: a model that cannot write the marker never calls a tool."""
    if not _enabled(view):
        return
    from verl.experimental.agent_loop.tool_parser import ToolParser

    name = view.select(f"{MULTI_TURN}.format")
    if name not in ToolParser._registry:
        return  # check_tool_format names it
    tokenizer = _local_tokenizer(view)
    if tokenizer is None:
        return
    key = f"{MULTI_TURN}.format={name}"
    try:
        parser = ToolParser.get_tool_parser(name, tokenizer)
    except Exception as exc:  # noqa: BLE001 - the parser's own refusal, named
        raise OffPolicyConfigError(str(exc) if key in str(exc) else f"{key} cannot be used with this model's tokenizer: {exc}") from None
    markers = sorted({v for k, v in vars(parser).items() if k.endswith("_token") and isinstance(v, str) and v})
    for marker in markers:
        ids = tokenizer.encode(marker, add_special_tokens=False)
        if tokenizer.unk_token_id in ids or tokenizer.decode(ids) != marker:
            raise OffPolicyConfigError(
                f"{key} marks a call with {marker!r}, which this model's tokenizer cannot spell (it encodes to "
                f"{tokenizer.convert_ids_to_tokens(ids)}): the model could never call a tool. Choose a format whose "
                f"markers its vocabulary holds (registered: {', '.join(sorted(ToolParser._registry))})"
            )


def check_tools_declared(view) -> None:
    """A tool agent loop (verl's ``ToolAgentLoop`` or a subclass) with multi-turn on needs tools:
    ``multi_turn.tool_config_path`` or ``multi_turn.function_tool_path``; without either it never calls one."""
    if not _enabled(view):
        return
    if view.select(f"{MULTI_TURN}.tool_config_path") or view.select(f"{MULTI_TURN}.function_tool_path"):
        return
    from hydra.utils import get_class
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

    name = view.select(AGENT_LOOP)
    entry = _agent_loop_registry.get(name)
    if entry is None or not issubclass(get_class(entry["_target_"]), ToolAgentLoop):
        return  # a loop of its own (agent_loop_config_path) may take its turns from elsewhere
    raise OffPolicyConfigError(
        f"{MULTI_TURN}.enable=true with {AGENT_LOOP}={name} (a tool agent loop), but {MULTI_TURN}.tool_config_path and "
        f"{MULTI_TURN}.function_tool_path are null: the model has no tool to call. Set {MULTI_TURN}.tool_config_path "
        f"to a tool config (docs/multi_turn.md), or {MULTI_TURN}.enable=false"
    )


def check_turn_limits(view) -> None:
    """``max_assistant_turns`` / ``max_user_turns``: null (no limit) or an integer >= 1. verl reads 0 as no limit
    and a negative bound ends every trajectory after its first turn."""
    if not _enabled(view):
        return
    for key in ("max_assistant_turns", "max_user_turns"):
        value = view.select(f"{MULTI_TURN}.{key}")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise OffPolicyConfigError(
                f"{MULTI_TURN}.{key}={value!r} is not valid; allowed: an integer >= 1, or null for no limit "
                "(verl reads 0 as no limit and a negative bound as one turn)"
            )


RULES = (
    check_agent_loop_registered, check_agent_loop, check_tool_format, check_tool_format_tokenizer, check_tool_config,
    check_tools_declared, check_turn_limits,
)

