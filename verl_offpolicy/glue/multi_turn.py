"""Startup rules of verl's multi-turn rollout (``actor_rollout_ref.rollout.multi_turn``), before Ray starts.

verl reads these keys only inside its agent-loop workers, minutes into a run: an unknown tool-call format
or a tool config that does not load fails there, and ``multi_turn.enable=true`` with a single-turn agent
loop runs single-turn, silently. Here, with verl's own loaders, as the workers will:

- the agent loop must be able to call tools: one whose class is verl's single-turn loop (or a subclass, as
  ``seeded_single_turn_agent``) never does. verl picks it per row from the data's ``agent_name`` column when
  there is one (its multi-turn preprocessing writes ``tool_agent``), else ``agent.default_agent_loop``;
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


AGENT_NAME_COLUMN = "agent_name"  # verl's per-row choice of agent loop (AgentLoopManager), over default_agent_loop
TRAIN_FILES = "data.train_files"


def _single_turn(name: str) -> bool | None:
    """Whether the registered agent loop ``name`` is verl's single-turn loop (or a subclass); None if unregistered
    (a loop of ``agent.agent_loop_config_path``, registered in the workers: verl names it if unknown)."""
    from hydra.utils import get_class
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

    entry = _agent_loop_registry.get(name)
    return None if entry is None else issubclass(get_class(entry["_target_"]), SingleTurnAgentLoop)


def _train_files(view) -> list[str]:
    files = view.select(TRAIN_FILES)
    if files is None:
        return []
    return [files] if isinstance(files, str) else [str(f) for f in files]


def agent_names_in_data(view) -> set[str] | None:
    """The values of verl's ``agent_name`` column in the training files (verl's multi-turn preprocessing writes
    ``tool_agent`` into every row): an empty set if a file has no such column, None if a file cannot be read here
    (a cluster path on a login node)."""
    import os

    import pyarrow.parquet as pq

    names: set[str] = set()
    for path in _train_files(view):
        if not os.path.isfile(path):
            return None
        try:
            if AGENT_NAME_COLUMN not in pq.read_schema(path).names:
                return set()
            names.update(str(v) for v in pq.read_table(path, columns=[AGENT_NAME_COLUMN]).column(0).to_pylist())
        except Exception:  # noqa: BLE001 - not a parquet verl reads here: the data checks name it
            return None
    return names


def check_agent_loop(view) -> None:
    """``multi_turn.enable=true`` needs an agent loop that calls tools (not verl's single-turn one): the rows'
    ``agent_name`` when the training data has that column (verl picks the loop per row), else
    ``agent.default_agent_loop``."""
    if not _enabled(view):
        return
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    name = view.select(AGENT_LOOP)
    if not _single_turn(name):
        return
    in_data = agent_names_in_data(view)
    multi = sorted(n for n in _agent_loop_registry if not _single_turn(n))
    if in_data is None:
        import logging

        logging.getLogger(__name__).warning(
            "%s.enable=true with %s=%s (a single-turn loop): %s cannot be read here, so whether its rows name a "
            "multi-turn loop in their %r column (as verl's multi-turn preprocessing writes) is not checked",
            MULTI_TURN,
            AGENT_LOOP,
            name,
            TRAIN_FILES,
            AGENT_NAME_COLUMN,
        )
        return
    single = sorted(n for n in in_data if _single_turn(n))
    if in_data and not single:
        return  # every row names a loop that calls tools (or one registered in the workers)
    where = (
        f"the rows of {TRAIN_FILES} name single-turn agent loops in their {AGENT_NAME_COLUMN!r} column "
        f"({', '.join(single)})"
        if in_data
        else f"{AGENT_LOOP}={name} is a single-turn agent loop and {TRAIN_FILES} has no {AGENT_NAME_COLUMN!r} column"
    )
    raise OffPolicyConfigError(
        f"{MULTI_TURN}.enable=true, but {where}: it never calls a tool. Set {AGENT_LOOP} to a multi-turn one "
        f"(registered: {', '.join(multi)}), write it into the data's {AGENT_NAME_COLUMN!r} column, or set "
        f"{MULTI_TURN}.enable=false"
    )


def check_tool_format(view) -> None:
    """``multi_turn.format`` names a registered tool-call parser."""
    if not _enabled(view):
        return
    import verl.experimental.agent_loop  # noqa: F401 - its import registers verl's parsers (and ours)
    from verl.experimental.agent_loop.tool_parser import ToolParser

    name = view.select(f"{MULTI_TURN}.format")
    if name not in ToolParser._registry:
        raise OffPolicyConfigError(
            f"{MULTI_TURN}.format={name!r} is not a registered tool-call parser; allowed values: "
            f"{', '.join(sorted(ToolParser._registry))}"
        )


def _unimportable_tool_class(path: str) -> str | None:
    """The first ``class_name`` of the tool config at ``path`` that does not import, named with its module and the
    cause (verl's loader would raise a bare AttributeError or ModuleNotFoundError), else None."""
    import importlib

    from omegaconf import OmegaConf

    try:
        tools = OmegaConf.to_container(OmegaConf.load(path)).get("tools") or []
    except Exception:  # noqa: BLE001 - verl's loader reports a file it cannot read
        return None
    for tool in tools:
        class_name = tool.get("class_name") if isinstance(tool, dict) else None
        if not class_name or "." not in str(class_name):
            continue
        module_name, _, attribute = str(class_name).rpartition(".")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - named
            return (
                f"tool class {attribute} cannot be imported: its module {module_name} raises "
                f"{type(exc).__name__}: {exc}"
            )
        if not hasattr(module, attribute):
            return (
                f"tool class {attribute} is not in its module {module_name} "
                f"(renamed or removed; class_name={class_name})"
            )
    return None


def check_tool_config(view) -> None:
    """``multi_turn.tool_config_path`` loads with verl's loader: the file, its tool classes and schemas."""
    path = view.select(f"{MULTI_TURN}.tool_config_path")
    if not _enabled(view) or not path:
        return
    from verl.tools.tool_registry import initialize_tools_from_config
    from verl.utils.import_utils import resolve_config_path

    resolved = resolve_config_path(str(path))
    unimportable = _unimportable_tool_class(resolved)
    if unimportable:
        raise OffPolicyConfigError(f"{MULTI_TURN}.tool_config_path={path}: {unimportable}")
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # BaseTool prints each tool's schema
            tools = initialize_tools_from_config(resolved)
    except Exception as exc:  # noqa: BLE001 - any failure is the answer, named
        raise OffPolicyConfigError(
            f"{MULTI_TURN}.tool_config_path={path}: the tools do not load ({type(exc).__name__}: {exc})"
        ) from None
    if not tools:
        raise OffPolicyConfigError(
            f"{MULTI_TURN}.tool_config_path={path} declares no tool (its `tools:` list is empty)"
        )


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
        raise OffPolicyConfigError(
            str(exc) if key in str(exc) else f"{key} cannot be used with this model's tokenizer: {exc}"
        ) from None
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
    check_agent_loop_registered,
    check_agent_loop,
    check_tool_format,
    check_tool_format_tokenizer,
    check_tool_config,
    check_tools_declared,
    check_turn_limits,
)
