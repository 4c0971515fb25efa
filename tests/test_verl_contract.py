"""The contract with verl: every verl (and TransferQueue) symbol the package imports, every keyword argument it
passes them, the hooks of verl's trainer it overrides, and the one pinned verl release.

The symbol and keyword lists are not written by hand: they are read from the package's source (every
``from verl... import X``, ``import verl...``, and every call of such a name with its keyword arguments, function-
local imports included), then checked against the installed verl: a symbol that is gone, or a keyword argument its
function no longer takes, fails naming both. Run it against a new verl before using the package there
(``verl_offpolicy.verl_pin`` says so at import). Checked by hand once, with a module added to the package that
imported ``verl.trainer.ppo.core_algos.no_such_symbol_here`` and called ``agg_loss(..., bogus_keyword=1)``: both
tests failed, naming the symbol with the importing file, and the keyword with the callee's signature.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from verl_offpolicy import verl_pin

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "verl_offpolicy"
CONTRACT_ROOTS = ("verl", "transfer_queue")


def _is_contract(module: str | None) -> bool:
    return bool(module) and module.split(".")[0] in CONTRACT_ROOTS


def _uses(path: Path) -> tuple[set[str], list[tuple[str, tuple[str, ...], int]]]:
    """(dotted symbols imported from verl/TransferQueue, [(dotted callee, keyword names, positional count)])."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: dict[str, str] = {}  # local name -> dotted path
    symbols: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and _is_contract(node.module):
            for alias in node.names:
                symbols.add(f"{node.module}.{alias.name}")
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _is_contract(alias.name):
                    symbols.add(alias.name)
                    names[alias.asname or alias.name.split(".")[0]] = (
                        alias.asname and alias.name or alias.name.split(".")[0]
                    )
    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        parts, func = [], node.func
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if isinstance(func, ast.Name) and func.id in names:
            dotted = ".".join([names[func.id], *reversed(parts)])
            keywords = tuple(k.arg for k in node.keywords if k.arg is not None)
            calls.append((dotted, keywords, len(node.args)))
    return symbols, calls


def _package_uses() -> tuple[dict[str, set[str]], dict[str, list[tuple[tuple[str, ...], int, str]]]]:
    symbols: dict[str, set[str]] = {}
    calls: dict[str, list[tuple[tuple[str, ...], int, str]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(ROOT))
        found, used = _uses(path)
        for symbol in found:
            symbols.setdefault(symbol, set()).add(where)
        for dotted, keywords, positional in used:
            calls.setdefault(dotted, []).append((keywords, positional, where))
    return symbols, calls


def _resolve(dotted: str):
    """The object at ``dotted`` (a module, or an attribute chain under the longest importable module)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def _optional(symbol: str) -> bool:
    """A symbol the package imports only where its engine exists here (Megatron, vLLM: optional extras)."""
    return any(part in symbol for part in ("megatron", "vllm", "sglang"))


def test_every_verl_symbol_the_package_imports_exists():
    symbols, _ = _package_uses()
    assert len(symbols) >= 40 and "verl.trainer.ppo.core_algos.register_policy_loss" in symbols  # the scan sees them
    missing = []
    for symbol, where in sorted(symbols.items()):
        try:
            _resolve(symbol)
        except Exception as exc:  # noqa: BLE001 - ImportError/AttributeError; an optional engine may raise anything
            if _optional(symbol):
                continue  # its e2e tests import it where it runs (the CPU platform's vLLM shims)
            missing.append(f"{symbol} (imported by {', '.join(sorted(where))}): {type(exc).__name__}: {exc}")
    assert missing == []


def _signature(obj):
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def test_every_keyword_argument_the_package_passes_verl_is_accepted():
    """Each call of a verl (or TransferQueue) name: its keyword arguments are parameters of the callee (or it takes
    **kwargs), and its positional arguments fit."""
    _, calls = _package_uses()
    assert "verl.trainer.ppo.core_algos.agg_loss" in calls  # the scan sees calls
    problems = []
    for dotted, uses in sorted(calls.items()):
        try:
            obj = _resolve(dotted)
        except Exception:  # noqa: BLE001 - as above
            if not _optional(dotted):
                problems.append(f"{dotted} (called in {uses[0][2]}) no longer exists")
            continue
        if not callable(obj):
            continue
        signature = _signature(obj)
        if signature is None:
            continue
        params = signature.parameters
        kinds = {p.kind for p in params.values()}
        takes_kwargs = inspect.Parameter.VAR_KEYWORD in kinds
        takes_args = inspect.Parameter.VAR_POSITIONAL in kinds
        positional = [
            p
            for p in params.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in ("self", "cls")
        ]
        for keywords, count, where in uses:
            unknown = [k for k in keywords if k not in params and not takes_kwargs]
            if unknown:
                problems.append(
                    f"{dotted} (called in {where}) takes no keyword argument {unknown}; its signature: {signature}"
                )
            if count > len(positional) and not takes_args:
                problems.append(
                    f"{dotted} (called in {where}) takes {len(positional)} positional arguments, given {count}"
                )
    assert problems == []


# The hooks of verl's V1 trainer the scheduler's classes override, with the parameters verl calls them with.
PPO_TRAINER_HOOKS = {
    "on_init_end": (),
    "on_train_begin": (),
    "on_step_end": (),
    "on_validate_begin": (),
    "prepare_step": (),
    "on_sample_end": (),
    "_save_checkpoint": (),
    "_setup": (),
    "get_llm_client": (),
    "_rollout_server_managers": (),
    "fit": ("agent_loop_manager",),
    "_validate": (),
}


def test_the_trainer_hooks_the_scheduler_overrides_exist_with_their_parameters():
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from verl_offpolicy.glue.scheduler.colocated import ColocatedTrainer
    from verl_offpolicy.glue.scheduler.overlapped import OverlappedTrainer
    from verl_offpolicy.glue.scheduler.trainer import OffPolicyTrainer

    ours = {name for cls in (OffPolicyTrainer, ColocatedTrainer, OverlappedTrainer) for name in vars(cls)}
    assert set(PPO_TRAINER_HOOKS) - {"_validate"} <= ours  # the list is what the classes override
    problems = []
    for hook, expected in PPO_TRAINER_HOOKS.items():
        method = getattr(PPOTrainer, hook, None)
        if method is None:
            problems.append(f"verl's PPOTrainer has no {hook} (overridden by the offpolicy trainer)")
            continue
        params = tuple(p for p in inspect.signature(method).parameters if p != "self")
        if params != expected:
            problems.append(f"PPOTrainer.{hook}{params}: the offpolicy trainer expects {expected}")
    assert problems == []


# ------------------------------------------------------------------------------------ the pinned release


def test_the_tested_verl_is_installed_admitted_by_the_requirement_and_named_by_the_recipe():
    from packaging.requirements import Requirement

    assert verl_pin.installed_verl() == verl_pin.TESTED_VERL  # the README's setup installs the tested release
    text = (ROOT / "pyproject.toml").read_text()
    line = next(
        line for line in text.splitlines() if line.strip().startswith('"verl>') or line.strip().startswith('"verl=')
    )
    requirement = Requirement(line.strip().strip('",'))
    assert requirement.specifier.contains(verl_pin.TESTED_VERL), requirement
    fields = dict(
        line.split("=", 1)
        for line in (ROOT / "recipe/offpolicy/REQUIRED_VERL.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    assert (
        fields["TAG"] == f"v{verl_pin.TESTED_VERL}"
        and fields["PIP_INSTALL"] == f"pip install verl=={verl_pin.TESTED_VERL}"
    )
    setup = (ROOT / "README.md").read_text().split("\n```", 2)[1]
    assert re.search(rf'verl(\[[^\]]*\])?=={re.escape(verl_pin.TESTED_VERL)}"', setup), setup


def _with_verl_version(tmp_path: Path, version: str, code: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh process whose ``importlib.metadata`` finds verl ``version`` first on its path (a
    distribution record of that version, as another installed verl has; the verl code itself is the installed one)."""
    dist = tmp_path / f"verl-{version}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: verl\nVersion: {version}\n")
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=600)


@pytest.mark.slow  # fresh processes import verl
def test_an_untested_verl_is_named_at_import_and_stops_the_run_in_strict_mode(tmp_path):
    code = (
        "import json, verl\n"
        "from tests.hydra_utils import VALID_SIZES\n"
        "from verl_offpolicy.glue.compose import compose_main_ppo\n"
        "from verl_offpolicy.glue.validation import validate_offpolicy_config\n"
        "try:\n"
        "    validate_offpolicy_config(compose_main_ppo('offpolicy_trainer', ['algorithm=opmd', *VALID_SIZES]))\n"
        "    print(json.dumps({'error': None}))\n"
        "except Exception as exc:\n"
        "    print(json.dumps({'error': str(exc)}))\n"
    )
    lenient = _with_verl_version(tmp_path, "0.10.0", code)
    assert lenient.returncode == 0, lenient.stderr[-3000:]
    assert json.loads(lenient.stdout.strip().splitlines()[-1]) == {"error": None}
    warning = f"verl 0.10.0 is installed, but verl-offpolicy is tested on verl {verl_pin.TESTED_VERL}"
    assert lenient.stderr.count(warning) == 1 and verl_pin.CONTRACT_TEST in lenient.stderr, lenient.stderr[-3000:]
    strict = _with_verl_version(tmp_path, "0.10.0", code, **{verl_pin.STRICT_ENV: "1"})
    error = json.loads(strict.stdout.strip().splitlines()[-1])["error"]
    assert error.startswith(warning) and error.endswith(f"({verl_pin.STRICT_ENV}=1)"), error


def test_the_tested_verl_is_not_reported():
    assert verl_pin.untested_verl(verl_pin.TESTED_VERL) is None
    assert "verl 0.9.2 is installed" in verl_pin.untested_verl("0.9.2")
