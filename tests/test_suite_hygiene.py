"""The test suite's own rules: CI fails on an empty suite, every subprocess has a timeout, tests share
helpers under public names, every test that starts Ray, a training run or doctor is marked e2e, and
every fixture that queues the session's shared jobs queues them at the session's start."""

import ast
import functools
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
CHECKED_DIRS = ("tests", "benchmarks")


def _ci_run(tmp_path: Path, test_command: str, ruff_rc: int = 0) -> subprocess.CompletedProcess:
    """The real ``.ci/run`` in a copy of the repository whose README's test command is ``test_command``
    (and whose install command does nothing; its ruff a stub exiting ``ruff_rc``)."""
    (tmp_path / ".ci").mkdir()
    shutil.copy2(REPO_ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    ruff = tmp_path / ".venv" / "bin" / "ruff"
    ruff.parent.mkdir(parents=True)
    ruff.write_text(f"#!/bin/sh\nexit {ruff_rc}\n")
    ruff.chmod(0o755)
    (tmp_path / "README.md").write_text(f"# x\n\n```\ntrue && .venv/bin/verl-offpolicy demo\n{test_command}\n```\n")
    return subprocess.run(["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("rc", [0, 1, 5])
def test_ci_passes_on_its_test_commands_exit_code_only(tmp_path, rc):
    """pytest's exit 5 (no test collected) is a broken suite: CI fails with that code and says why."""
    proc = _ci_run(tmp_path, f"exit {rc}")
    assert proc.returncode == rc, proc.stdout + proc.stderr
    assert ("collected no tests" in proc.stdout) == (rc == 5), proc.stdout


def test_ci_fails_on_a_lint_finding_before_the_tests(tmp_path):
    proc = _ci_run(tmp_path, "echo TESTS-RAN", ruff_rc=1)
    assert proc.returncode == 1 and "FAILED: ruff" in proc.stdout and "TESTS-RAN" not in proc.stdout


def _python_files() -> list[Path]:
    return sorted(p for d in CHECKED_DIRS for p in (REPO_ROOT / d).rglob("*.py"))


SUBPROCESS_WAITS = {"run", "check_output", "check_call", "call"}


def test_every_subprocess_call_has_a_timeout():
    """subprocess.run/check_output/check_call/call in tests/ and benchmarks/ pass ``timeout=``."""
    checked, missing = 0, []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "subprocess"
                and node.func.attr in SUBPROCESS_WAITS
            ):
                checked += 1
                if not any(k.arg == "timeout" for k in node.keywords):
                    missing.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert missing == []
    assert checked >= 10  # the scan sees the suite's calls (this file's own included)


def test_no_test_module_imports_a_private_name_of_another_test_module():
    """What tests share lives in helper modules under public names (e.g. tests/loss_helpers.py)."""
    private = []
    for path in sorted((REPO_ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
                private += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert private == []


# ------------------------------------------------------------------ the e2e marker

# What starts a Ray cluster, a main_ppo training run, the demo or doctor's Ray probe (see
# pyproject.toml's `e2e` marker): these names (called or handed to a caller), `ray.init(...)`, or a
# command list with the CLI's "doctor" subcommand. Not detected: a `verl-offpolicy demo` command line (tests
# also run it to
# see it refuse bad input before Ray); test_cpu_e2e.py, which runs it, is marked as a whole.
E2E_CALLS = {"run_demo", "demo_command", "ray_worker_state"}
E2E_SUBCOMMANDS = {"doctor"}
# What starts a fresh Python process (see the `slow` marker): the harness's runners, or [sys.executable, ...].
PYTHON_RUNNERS = {"run_isolated", "isolated", "run_main_ppo"}
HELPER_TARGET = re.compile(r"^tests\.([\w.]+):(\w+)$")  # run_isolated("tests.<module>:<function>")


@functools.lru_cache(maxsize=None)
def suite_modules() -> list[Path]:
    """Every test module of the suite, in tests/ and its folders (which mirror the package)."""
    return sorted((REPO_ROOT / "tests").rglob("test_*.py"))


def _module_of(path: Path) -> str:
    """``algorithms.test_oapl`` for tests/algorithms/test_oapl.py (the module name under tests)."""
    return ".".join(path.relative_to(REPO_ROOT / "tests").with_suffix("").parts)


@functools.cache
def _module_defs(module: str) -> tuple[dict[str, ast.AST], dict[str, str], ast.Module]:
    """Top-level functions/classes of tests/<module>.py, and the names it imports from tests.* modules (parsed
    once per session: the scans below walk every test's helpers and fixtures, module by module)."""
    tree = ast.parse(
        (REPO_ROOT / "tests" / f"{module.replace('.', '/')}.py").read_text()
    )  # tests/<package>/<module>.py too
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    imported = {  # at the top or inside a function
        a.asname or a.name: node.module.split(".", 1)[1]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests.")
        for a in node.names
    }
    return defs, imported, tree


def _starts_e2e(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in E2E_CALLS:  # called, or handed to a caller (a thread pool's submit)
            return True
        if isinstance(n, ast.Call):
            f = n.func
            if (
                isinstance(f, ast.Attribute)
                and f.attr == "init"
                and isinstance(f.value, ast.Name)
                and f.value.id == "ray"
            ):
                return True
        if isinstance(n, ast.List | ast.Tuple) and any(
            isinstance(e, ast.Constant) and e.value in E2E_SUBCOMMANDS for e in n.elts
        ):
            return True
    return False


def _is_sys_executable(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "executable"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def _starts_python(node: ast.AST) -> bool:
    """A fresh Python process: a command list that starts with ``sys.executable``, or one of the harness's runners."""
    for n in ast.walk(node):
        if isinstance(n, ast.List | ast.Tuple) and n.elts and _is_sys_executable(n.elts[0]):
            return True
        if isinstance(n, ast.Name) and n.id in PYTHON_RUNNERS:
            return True
    return False


def _reaches_e2e(module: str, name: str, seen: set[tuple[str, str]], starts=_starts_e2e) -> bool:
    """Whether tests/<module>.py's ``name`` (a test, fixture or helper) starts e2e work, following the
    helpers and fixtures it uses in tests/ (same module, imported from tests.*, conftest.py's fixtures,
    or run_isolated targets)."""
    if (module, name) in seen:
        return False
    seen.add((module, name))
    defs, imported, _ = _module_defs(module)
    if name not in defs:
        if name in imported:
            return _reaches_e2e(imported[name], name, seen, starts)
        return module != "conftest" and _reaches_e2e("conftest", name, seen, starts)
    node = defs[name]
    if starts(node):
        return True
    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        used |= {a.arg for a in node.args.args}  # fixtures
    targets = [
        HELPER_TARGET.match(n.value).groups()
        for n in ast.walk(node)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and HELPER_TARGET.match(n.value)
    ]
    fixtures = _module_defs("conftest")[0]
    return any(
        _reaches_e2e(module, u, seen, starts)
        for u in used
        if u != name and (u in defs or u in imported or u in fixtures)
    ) or any(_reaches_e2e(m, f, seen, starts) for m, f in targets)


def _marked(node: ast.AST, markers: tuple[str, ...]) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr in markers for n in ast.walk(node))


def _e2e_tests(starts=_starts_e2e, markers: tuple[str, ...] = ("e2e",)) -> tuple[set[str], set[str]]:
    """(tests that start e2e work, tests marked e2e), as ``file::function``; with ``starts`` and
    ``markers``, the same for another kind of work and the markers that may carry it."""
    starting, marked = set(), set()
    for path in suite_modules():
        defs, _, tree = _module_defs(_module_of(path))
        module_marked = any(
            isinstance(n, ast.Assign)
            and any(getattr(t, "id", None) == "pytestmark" for t in n.targets)
            and _marked(n, markers)
            for n in tree.body
        )
        for name, node in defs.items():
            if not name.startswith("test_"):
                continue
            test_id = f"{path.name}::{name}"
            if _reaches_e2e(_module_of(path), name, set(), starts):
                starting.add(test_id)
            if module_marked or any(_marked(d, markers) for d in node.decorator_list):
                marked.add(test_id)
    return starting, marked


def test_every_test_that_starts_ray_a_run_the_demo_or_doctor_is_marked_e2e():
    starting, marked = _e2e_tests()
    assert sorted(starting - marked) == []
    # The scan finds them through helpers, fixtures and run_isolated targets.
    assert {
        "test_cli.py::test_doctor_reports_every_name_in_driver_and_ray_worker",
        "test_cpu_rollout.py::test_rollout_logprobs_match_trainer_after_weight_sync",
        "test_scheduler_e2e.py::test_logged_versions_and_staleness_follow_the_spec",
        "test_cpu_e2e.py::test_grpo_learns_through_main_ppo_on_cpu_on_loopback_and_leaves_nothing_behind",
        "test_plugin.py::test_doctor_reports_a_broken_registration_module",
    } <= starting


def test_every_test_that_starts_a_python_process_is_out_of_the_fast_tier():
    """A fresh Python process costs seconds (importing verl: ~5 s on 2 cores), so tests that start one
    are marked ``slow`` (or ``e2e``): the fast tier (``-m "not e2e and not slow"``) stays about a minute."""
    starting, marked = _e2e_tests(_starts_python, ("slow", "e2e", "extended", "real_model"))
    assert sorted(starting - marked) == []
    assert {
        "test_smollm2.py::test_gguf_found_through_metadata_without_importing_the_module",
        "test_cpu_registration.py::test_cpu_process_can_start_verls_separate_async",
    } <= starting


# ------------------------------------------------------------------ the session's shared jobs


def _decorator_name(node: ast.AST) -> str:
    """``queued_at_start`` of ``@queued_at_start(...)``, ``fixture`` of ``@pytest.fixture(...)``."""
    node = node.func if isinstance(node, ast.Call) else node
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def test_every_fixture_that_queues_shared_jobs_is_queued_at_the_sessions_start():
    """A test module's fixture that takes ``demo_runs`` is declared ``@queued_at_start`` (tests/jobs.py), not
    ``@pytest.fixture``: conftest then queues its jobs at the session's start and they run beside the rest
    of the suite, instead of starting when the first end-to-end test asks for them."""
    queued, plain = set(), []
    for path in suite_modules():
        defs, _, _ = _module_defs(_module_of(path))
        for name, node in defs.items():
            if not isinstance(node, ast.FunctionDef) or "demo_runs" not in {a.arg for a in node.args.args}:
                continue
            decorators = {_decorator_name(d) for d in node.decorator_list}
            if "queued_at_start" in decorators:
                queued.add(f"{path.name}::{name}")
            elif "fixture" in decorators:
                plain.append(f"{path.name}::{name}")
    assert plain == []
    assert {
        "test_scheduler_e2e.py::runs",
        "test_overlapped.py::resumed_run",
        "test_cpu_e2e.py::learn_run",
        "test_verl_async_modes.py::async_run",
        "test_cli.py::doctor_run",
    } <= queued
