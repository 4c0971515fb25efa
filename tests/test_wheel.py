"""The built distribution: a wheel and an sdist that pass ``twine check``, and a brand-new venv that has
only the wheel of this package (no checkout on ``sys.path``) running ``verl-offpolicy doctor`` and a
``--cfg job`` compose of ``+algorithm=opmd`` on stock ``main_ppo``, from a directory outside the checkout.

Offline and fast: the build runs without isolation (the test environment has setuptools), from a copy of
the sources (a build writes ``*.egg-info`` into its source tree); the new venv has no pip and installs the
wheel with this environment's pip (``pip --python``, ``--no-deps --no-index``); its dependencies (torch,
verl, Ray, ...) come from this environment's site-packages through a ``.pth`` file that points at a copy
of its directory listing (symlinks) without this package's own entries (the editable install's finder
and metadata), so only the wheel provides ``verl_offpolicy``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import verl
from omegaconf import OmegaConf

import verl_offpolicy
from verl_offpolicy.configs import preset_names

ROOT = Path(__file__).resolve().parents[1]
VERSION = verl_offpolicy.__version__
SOURCES = ("pyproject.toml", "README.md", "verl_offpolicy", "hydra_plugins")
TIMEOUT = 900

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]  # a build, a venv, fresh `import verl` processes


def _run(cmd, timeout=TIMEOUT, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(ROOT / name, src / name)
    out = tmp / "dist"
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)])
    return out


def _own_entries(name: str) -> bool:
    """This package's entries in a site-packages directory (an editable install's finder and metadata)."""
    lowered = name.lower().replace("-", "_")
    return lowered.startswith(("verl_offpolicy", "__editable__.verl_offpolicy", "__editable___verl_offpolicy")) or (
        lowered == "hydra_plugins"
    )


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory) -> tuple[Path, dict[str, str], Path]:
    tmp = tmp_path_factory.mktemp("venv")
    env_dir = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)])
    python = env_dir / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    deps = tmp / "deps"  # this environment's site-packages minus this package
    deps.mkdir()
    ours = Path(verl.__file__).resolve().parents[1]
    for entry in ours.iterdir():
        if not _own_entries(entry.name):
            (deps / entry.name).symlink_to(entry)
    (site / "_test_deps.pth").write_text(f"{deps}\n")
    (wheel,) = dist.glob("*.whl")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("VERL_USE_EXTERNAL")}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}"
    env["VIRTUAL_ENV"] = str(env_dir)
    work = tmp / "work"  # outside the checkout
    work.mkdir()
    return env_dir, env, work


def test_wheel_and_sdist_pass_twine_check_and_carry_everything(dist):
    wheel, sdist = next(dist.glob("*.whl")), next(dist.glob("*.tar.gz"))
    assert (
        wheel.name == f"verl_offpolicy-{VERSION}-py3-none-any.whl" and sdist.name == f"verl_offpolicy-{VERSION}.tar.gz"
    )
    proc = _run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)])
    assert proc.stdout.count("PASSED") == 2
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "hydra_plugins/verl_offpolicy_searchpath/__init__.py" in names
    assert {f"verl_offpolicy/configs/algorithm/{p}.yaml" for p in preset_names()} <= names
    assert {
        "verl_offpolicy/configs/offpolicy_trainer.yaml",
        "verl_offpolicy/configs/cpu/demo.yaml",
        "verl_offpolicy/register.py",
    } <= names
    entry_points = zipfile.ZipFile(wheel).read(f"verl_offpolicy-{VERSION}.dist-info/entry_points.txt").decode()
    assert "[verl.plugins]\nverl_offpolicy = verl_offpolicy.glue.plugin" in entry_points
    assert "verl-offpolicy = verl_offpolicy.cli:main" in entry_points
    members = set(tarfile.open(sdist).getnames())
    assert {
        f"verl_offpolicy-{VERSION}/{f}"
        for f in ("pyproject.toml", "README.md", "verl_offpolicy/configs/algorithm/opmd.yaml")
    } <= members


def test_fresh_venv_imports_the_wheel_not_a_checkout(venv):
    env_dir, env, work = venv
    code = (
        "import json, os, sys, verl_offpolicy, hydra_plugins.verl_offpolicy_searchpath as h\n"
        "from importlib import metadata\n"
        "print(json.dumps({'pkg': verl_offpolicy.__file__, 'plugin': h.__file__, 'version': "
        "metadata.version('verl-offpolicy'),"
        " 'holders': [p for p in sys.path if os.path.isdir(os.path.join(p or '.', 'verl_offpolicy'))]}))"
    )
    info = json.loads(
        _run([str(env_dir / "bin" / "python"), "-c", code], cwd=work, env=env).stdout.strip().splitlines()[-1]
    )
    site = str(env_dir / "lib")
    assert info["pkg"].startswith(site) and info["plugin"].startswith(site), info
    assert info["version"] == VERSION
    assert len(info["holders"]) == 1 and info["holders"][0].startswith(site), info  # only the venv's site-packages


def test_fresh_venv_composes_a_preset_on_stock_main_ppo(venv):
    env_dir, env, work = venv
    proc = _run(
        [str(env_dir / "bin" / "python"), "-m", "verl.trainer.main_ppo", "+algorithm=opmd", "--cfg", "job"],
        cwd=work,
        env=env,
    )
    cfg = OmegaConf.create(proc.stdout)
    assert cfg.algorithm.adv_estimator == "opmd" and cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "opmd"
    assert cfg.algorithm.offpolicy.tau == 1.0


def test_fresh_venv_registers_through_the_register_module_alone(venv):
    env_dir, env, work = venv
    proc = _run(
        [str(env_dir / "bin" / "python"), "-m", "verl_offpolicy.glue.diagnose"],
        cwd=work,
        env={**env, "VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": "verl_offpolicy.register"},
    )
    state = json.loads(proc.stdout.strip().splitlines()[-1].removeprefix("VERL_OFFPOLICY_STATE "))
    assert state["problem"] is None and all(ok for _, _, ok in state["names"])


@pytest.mark.e2e  # doctor starts a Ray worker
@pytest.mark.extended  # minutes of Ray probe; the checkout's doctor runs in the default tier (tests/test_cli.py)
def test_fresh_venv_passes_doctor(venv):
    env_dir, env, work = venv
    proc = _run(
        [str(env_dir / "bin" / "verl-offpolicy"), "doctor", "--timeout", "600"], cwd=work, env=env, timeout=1500
    )
    assert "verl-offpolicy doctor: everything is registered and visible." in proc.stdout
    assert re.search(rf"^  verl-offpolicy +{re.escape(VERSION)}$", proc.stdout, flags=re.M)
    assert (
        proc.stdout.count("MISSING") == 0 and f"offpolicy_trainer: {len(preset_names())} presets checked" in proc.stdout
    )
