"""Startup rules of verl's multi-turn rollout (``actor_rollout_ref.rollout.multi_turn``), before Ray starts.

verl reads these keys only inside its agent-loop workers, minutes into a run: an unknown tool-call format
or a tool config that does not load fails there, and ``multi_turn.enable=true`` with a single-turn agent
loop runs single-turn, silently. Here, with verl's own loaders, as the workers will:

- the agent loop (``agent.default_agent_loop``) must be able to call tools: one whose class is verl's
  single-turn loop (or a subclass, as ``seeded_single_turn_agent``) never does;
- ``multi_turn.format`` must name a parser of verl's ``ToolParser`` registry;
- ``multi_turn.tool_config_path`` must load (verl's ``initialize_tools_from_config``: the file, its classes,
  their schemas).
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


RULES = (check_agent_loop, check_tool_format, check_tool_config)
