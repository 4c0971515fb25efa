"""GPU recipe scripts: syntax, and their Hydra overrides compose and validate (DRY_RUN=1: no GPU, no data)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_offpolicy.rewards.math_verify_reward import compute_score

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
SCRIPTS = sorted(RECIPES.glob("*.sh"))
TRAINING = ["gsm8k_qwen2.5-1.5b.sh", "math_llama3.1-8b_megatron.sh", "guru_math_qwen2.5-7b.sh"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def _dry_run(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Run a recipe as in an activated environment: this python's bin directory first on PATH."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(
        ["bash", str(RECIPES / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": path, "DRY_RUN": "1", **env},
    )


@pytest.mark.parametrize("script", TRAINING)
@pytest.mark.parametrize("preset", ["rec_ring_nois", "agro", "pmd_partition"])
def test_recipe_composes_and_validates(script, preset):
    proc = _dry_run(script, preset)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert summary.startswith("ok: ")
    assert ("strategy=megatron" in summary) == ("megatron" in script)


def test_paper_off_policy_setting_reaches_the_scheduler():
    proc = _dry_run("gsm8k_qwen2.5-1.5b.sh", "rec_oneside_nois", SYNC_INTERVAL="20", SYNC_OFFSET="0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "sync_interval=20 sync_offset=0 ratio_anchor=behaviour" in proc.stdout


def test_recipe_rejects_unknown_preset_with_allowed_values():
    proc = _dry_run("gsm8k_qwen2.5-1.5b.sh", "rec_sideways")
    assert proc.returncode == 2
    assert "unknown preset 'rec_sideways'; allowed:" in proc.stderr and "rec_ring_nois" in proc.stderr


def test_recipe_extra_override_is_validated():
    proc = _dry_run("gsm8k_qwen2.5-1.5b.sh", "agro", "algorithm.kl_ctrl.kl_coef=0.3")
    assert proc.returncode == 1
    assert "to equal algorithm.offpolicy.beta" in proc.stderr


def test_prepare_data_rejects_unknown_dataset():
    proc = subprocess.run(
        ["bash", str(RECIPES / "prepare_data.sh"), "imagenet", "/tmp/unused"], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 2 and "allowed: gsm8k, math, guru_math" in proc.stderr


@pytest.mark.parametrize(
    "response,truth,expected",
    [
        ("so x = \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("the answer is \\boxed{3}", "4", 0.0),
        ("no final answer", "4", 0.0),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
    ],
)
def test_math_verify_reward(response, truth, expected):
    assert compute_score("math", response, truth) == expected
