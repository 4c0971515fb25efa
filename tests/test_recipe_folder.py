"""``recipe/offpolicy/``: the scheduler as a verl-recipe folder, and registration through
``VERL_USE_EXTERNAL_MODULES`` alone.

verl-recipe's README requires per recipe folder a ``README.md`` with a "Required `verl` version" section
linking ``REQUIRED_VERL.txt`` (key=value: UPSTREAM, MODE, VERL_COMMIT or a tag, PIP_INSTALL, NOTES,
REFRESH; read by its ``install_verl.sh`` with awk, ``#`` lines are comments), ``requirements.txt`` and
run scripts; a ``register.py`` makes ``VERL_USE_EXTERNAL_MODULES=recipe.<name>.register`` work (verl
imports those modules at ``import verl``, verl/__init__.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import verl_offpolicy
from tests.hydra_utils import compose_and_check
from verl_offpolicy.glue.registration import expected_names

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipe" / "offpolicy"
SCRIPT = RECIPE / "run_qwen2_5_1_5b_fsdp.sh"


def _required_verl() -> dict[str, str]:
    fields = {}
    for line in (RECIPE / "REQUIRED_VERL.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            fields[key] = value
    return fields


def test_folder_has_every_file_verl_recipe_requires():
    names = {p.name for p in RECIPE.iterdir()}
    assert {"README.md", "REQUIRED_VERL.txt", "requirements.txt", "register.py"} <= names
    assert any(n.startswith("run_") and n.endswith(".sh") for n in names)
    readme = (RECIPE / "README.md").read_text()
    assert "## Required `verl` version" in readme and "(REQUIRED_VERL.txt)" in readme


def test_required_verl_pins_verl_0_9_1_and_this_package_version():
    fields = _required_verl()
    assert {"UPSTREAM", "MODE", "PIP_INSTALL", "NOTES", "REFRESH"} <= set(fields)
    assert "VERL_COMMIT" in fields or "TAG" in fields
    assert fields["UPSTREAM"] == "https://github.com/verl-project/verl.git"
    assert (fields["MODE"], fields["TAG"], fields["PIP_INSTALL"]) == ("pinned_tag", "v0.9.1", "pip install verl==0.9.1")
    assert fields["VERL_OFFPOLICY_VERSION"] == verl_offpolicy.__version__
    pins = [
        line for line in (RECIPE / "requirements.txt").read_text().splitlines() if line and not line.startswith("#")
    ]
    assert pins == [f"verl-offpolicy=={verl_offpolicy.__version__}"]


def _fresh_state(env_update: dict[str, str]) -> dict:
    """A fresh process from the repository root (where ``recipe.offpolicy`` is importable, as from a
    verl checkout's root): what ``import verl`` alone registered, and the presets Hydra finds."""
    code = (
        "import json\n"
        "from verl_offpolicy.glue.diagnose import plugin_state\n"
        "state = plugin_state()\n"  # imports verl first: VERL_USE_EXTERNAL_MODULES acts there
        "from verl_offpolicy.glue.compose import compose_preset\n"
        "cfg = compose_preset('opmd', 'offpolicy_trainer')\n"
        "stock = compose_preset('rec_ring_nois', 'ppo_trainer')\n"
        "from omegaconf import OmegaConf\n"  # without our plugin the presets' resolver is missing: None
        "state['trainer_mode'] = OmegaConf.select(cfg, 'trainer.v1.trainer_mode', throw_on_resolution_failure=False)\n"
        "state['stock_loss'] = stock.actor_rollout_ref.actor.policy_loss.loss_mode\n"
        "print('STATE ' + json.dumps(state))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL")}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**env, **env_update},
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("STATE "))
    return json.loads(line[len("STATE ") :])


@pytest.mark.slow  # two fresh `import verl` processes
@pytest.mark.parametrize("module", ["recipe.offpolicy.register", "verl_offpolicy.register"])
def test_external_modules_alone_register_everything(module):
    """Entry points disabled (VERL_USE_EXTERNAL_PLUGINS=none): the module named in VERL_USE_EXTERNAL_MODULES
    registers every estimator, loss, the trainer mode and the CPU backend; the configs are on main_ppo's
    search path without any entry point."""
    state = _fresh_state({"VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": module})
    assert state["problem"] is None
    assert sorted((kind, name) for kind, name, ok in state["names"] if ok) == sorted(
        (e.kind, e.name) for e in expected_names()
    )
    assert {"adv_estimator", "policy_loss", "trainer"} <= {kind for kind, _, _ in state["names"]}
    assert state["trainer_mode"] == "offpolicy" and state["stock_loss"] == "rec"


@pytest.mark.slow
def test_without_the_module_disabled_entry_points_register_nothing():
    """The control: with entry points disabled and no module named, nothing is registered (so the test
    above measures VERL_USE_EXTERNAL_MODULES), and the finding names the fix."""
    state = _fresh_state({"VERL_USE_EXTERNAL_PLUGINS": "none"})
    assert not any(ok for _, _, ok in state["names"])
    assert "VERL_USE_EXTERNAL_MODULES=verl_offpolicy.register" in state["problem"]


def _print_args(**env: str) -> list[str]:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    proc = subprocess.run(
        ["bash", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": path, "DRY_RUN": "print", **env},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_run_script_composes_and_passes_the_startup_checks():
    argv = _print_args(PRESET="rec_ring_nois", SYNC_INTERVAL="4", SYNC_OFFSET="1", RATIO_ANCHOR="rollout")
    assert argv[:2] == ["--config-name", "offpolicy_trainer"]
    cfg = compose_and_check(argv[1], argv[2:])
    off = cfg.algorithm.offpolicy
    assert cfg.trainer.v1.trainer_mode == "offpolicy" and cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "rec"
    assert (off.sync_interval, off.sync_offset, off.ratio_anchor) == (4, 1, "rollout")


def test_run_script_rejects_unknown_values_with_allowed_ones():
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    for env, message in (
        ({"INFER_BACKEND": "trtllm"}, "unknown INFER_BACKEND 'trtllm'; allowed: vllm sglang"),
        ({"DRY_RUN": "yes"}, "unknown DRY_RUN 'yes'; allowed: 0 1 print"),
    ):
        proc = subprocess.run(
            ["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120, env={**os.environ, "PATH": path, **env}
        )
        assert proc.returncode == 2 and message in proc.stderr
