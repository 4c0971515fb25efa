"""The test suite's own rules: CI fails on an empty suite, every subprocess has a timeout."""

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
CHECKED_DIRS = ("tests", "benchmarks")


def _ci_run(tmp_path: Path, test_command: str) -> subprocess.CompletedProcess:
    """The real ``.ci/run`` in a copy of the repository whose README's test command is ``test_command``
    (and whose install command does nothing)."""
    (tmp_path / ".ci").mkdir()
    shutil.copy2(REPO_ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    (tmp_path / "README.md").write_text(f"# x\n\n```\ntrue && .venv/bin/verl-offpolicy demo\n{test_command}\n```\n")
    return subprocess.run(["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("rc", [0, 1, 5])
def test_ci_passes_on_its_test_commands_exit_code_only(tmp_path, rc):
    """pytest's exit 5 (no test collected) is a broken suite: CI fails with that code and says why."""
    proc = _ci_run(tmp_path, f"exit {rc}")
    assert proc.returncode == rc, proc.stdout + proc.stderr
    assert ("collected no tests" in proc.stdout) == (rc == 5), proc.stdout


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
    for path in sorted((REPO_ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
                private += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert private == []
