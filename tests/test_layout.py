"""The package's layering, read from the source (every import statement, function-local ones too):
no import cycles between verl_offpolicy's modules, the scheduler part imports nothing of the CPU backend
nor of the demo tooling, and the process-management module stays free of verl, torch and the rest of the
package (the demo, doctor and the tests import it)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "verl_offpolicy"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module named by an import statement of ``path`` (``from a import b`` gives a and a.b)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: (_imports(path) & set(modules)) - {name} for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every back edge of a depth-first search, as the cycle it closes."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, path)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return cycles


def test_the_import_graph_is_acyclic():
    graph = _graph()
    assert (
        len(graph) >= 25 and "verl_offpolicy.demo.process" in graph["verl_offpolicy.demo.run"]
    )  # the scan sees imports
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


def test_the_cpu_backend_imports_nothing_of_the_demo_tooling():
    """What runs inside verl's processes (verl_offpolicy.cpu*) never needs the tooling that drives main_ppo from
    outside."""
    graph = _graph()
    backend = {name for name in graph if name == "verl_offpolicy.cpu" or name.startswith("verl_offpolicy.cpu.")}
    assert len(backend) >= 10 and "verl_offpolicy.demo.run" in graph  # the scan sees both parts
    upward = {
        name: sorted(n for n in graph[name] if n == "verl_offpolicy.demo" or n.startswith("verl_offpolicy.demo."))
        for name in backend
    }
    assert {name: found for name, found in upward.items() if found} == {}


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every package module ``start`` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_the_scheduler_part_imports_nothing_of_the_cpu_backend_or_the_demo():
    """verl_offpolicy.glue.scheduler* runs on any backend: it reaches no verl_offpolicy.cpu* or
    verl_offpolicy.demo* module, directly or through the modules it imports."""
    graph = _graph()
    scheduler = sorted(name for name in graph if name.startswith("verl_offpolicy.glue.scheduler"))
    assert "verl_offpolicy.glue.scheduler.trainer" in scheduler  # the scan sees the part
    assert "verl_offpolicy.glue.scheduler.checks" in _reachable(graph, "verl_offpolicy.glue.scheduler.trainer")
    forbidden = ("verl_offpolicy.cpu", "verl_offpolicy.demo")
    reached = {name: sorted(m for m in _reachable(graph, name) if m.startswith(forbidden)) for name in scheduler}
    assert reached == {name: [] for name in scheduler}


# The floors below the verl adapters: what glue may import of the package (the rest stands above it).
BELOW_GLUE = (
    "verl_offpolicy.glue",
    "verl_offpolicy.core",
    "verl_offpolicy.configs",
    "verl_offpolicy.rewards",
    "verl_offpolicy.verl_pin",
)


def test_the_verl_adapters_import_nothing_above_them():
    """verl_offpolicy.glue* imports only glue, core, configs, rewards and the verl pin: never the CPU backend, the
    demo, doctor, the CLI or the startup callback (entry points stand above what they drive)."""
    graph = _graph()
    glue = sorted(name for name in graph if name.startswith("verl_offpolicy.glue"))
    assert "verl_offpolicy.glue.validation" in glue and "verl_offpolicy.startup" in graph  # the scan sees both floors
    upward = {
        name: sorted(m for m in graph[name] if m != "verl_offpolicy" and not m.startswith(BELOW_GLUE)) for name in glue
    }
    assert {name: found for name, found in upward.items() if found} == {}


def test_reachable_follows_imports_transitively():
    assert _reachable({"a": {"b"}, "b": {"c"}, "c": set()}, "a") == {"b", "c"}


def test_process_management_imports_no_verl_torch_or_other_package_module():
    imported = _imports(PACKAGE / "demo" / "process.py")
    top = {name.split(".")[0] for name in imported}
    assert not top & {"verl", "torch", "verl_offpolicy"}, sorted(imported)


# verl's policy-loss registry calls fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
# config, rollout_is_weights): our registered losses must take those seven positionally.
VERL_LOSS_SIGNATURE = (
    "old_log_prob",
    "log_prob",
    "advantages",
    "response_mask",
    "loss_agg_mode",
    "config",
    "rollout_is_weights",
)
MAX_POSITIONAL = 6


def _positional(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    names = [a.arg for a in node.args.posonlyargs + node.args.args]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


def _long_signatures(source: str) -> list[tuple[str, int]]:
    """(function, positional parameter count) of each function of ``source`` over MAX_POSITIONAL
    positional parameters, other than one with exactly verl's policy-loss signature."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = _positional(node)
            if len(names) > MAX_POSITIONAL and tuple(names) != VERL_LOSS_SIGNATURE:
                found.append((node.name, len(names)))
    return found


def test_no_function_takes_more_than_six_positional_parameters():
    """Past six, parameters are keyword-only (or a small dataclass): a call reads as what it sets."""
    found = {str(p.relative_to(PACKAGE.parent)): _long_signatures(p.read_text()) for p in PACKAGE.rglob("*.py")}
    assert {path: names for path, names in found.items() if names} == {}


def test_long_signature_scan_sees_positional_and_keyword_only_parameters():
    assert _long_signatures("def f(a, b, c, d, e, f, g): pass") == [("f", 7)]
    assert _long_signatures("def f(a, b, c, d, e, f, *, g): pass") == []
    assert _long_signatures("class C:\n    def m(self, a, b, c, d, e, f): pass") == []
    assert _long_signatures("def f(" + ", ".join(VERL_LOSS_SIGNATURE) + "): pass") == []


TESTS = Path(__file__).resolve().parent


def _test_imports() -> dict[str, set[str]]:
    """tests/ module name -> the tests/ modules it imports (``tests.x``), function-local imports too."""
    modules = {
        "tests." + ".".join(p.relative_to(TESTS).with_suffix("").parts): p
        for p in TESTS.rglob("*.py")
        if p.stem != "__init__"
    }
    return {name: {m for m in _imports(path) if m in modules} - {name} for name, path in modules.items()}


def test_no_test_module_is_imported_by_another_module():
    """Shared constants and runs live in the support modules (scenario_*, jobs, hydra_utils, ...): a test module
    imports those, never another test module, and a support module imports no test module."""
    graph = _test_imports()
    assert "tests.scenario_schedule" in graph["tests.scheduler.test_scheduler_e2e"]  # the scan sees the imports
    upward = {name: sorted(m for m in deps if m.rsplit(".", 1)[-1].startswith("test_")) for name, deps in graph.items()}
    assert {name: found for name, found in upward.items() if found} == {}


def test_the_support_modules_import_no_cycle():
    assert _cycles(_test_imports()) == []


def test_no_test_support_function_takes_more_than_six_positional_parameters():
    found = {p.name: _long_signatures(p.read_text()) for p in TESTS.rglob("*.py")}
    assert {path: names for path, names in found.items() if names} == {}


def test_the_scheduler_reaches_transfer_queue_through_its_store_module_only():
    """Everything the scheduler keeps in TransferQueue (the FIFO's tags, its resume state, the fields it rewrites)
    goes through glue/scheduler/store.py: a verl without TransferQueue is one module to port."""
    scheduler = PACKAGE / "glue" / "scheduler"
    users = sorted(
        p.name for p in scheduler.glob("*.py") if any(m.split(".")[0] == "transfer_queue" for m in _imports(p))
    )
    assert users == ["store.py"]
