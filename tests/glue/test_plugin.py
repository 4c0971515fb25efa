"""Registration through verl's ``verl.plugins`` entry point, in every process, and its loud failure."""

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest
import yaml
from omegaconf import OmegaConf

from tests.hydra_utils import VALID_SIZES
from verl_offpolicy.glue.compose import compose_main_ppo
from verl_offpolicy.glue.registration import expected_names

TIMEOUT = 240


def _run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT)


def test_entry_point_is_declared_in_verl_plugins_group():
    eps = {ep.name: ep.value for ep in entry_points(group="verl.plugins")}
    assert eps.get("verl_offpolicy") == "verl_offpolicy.glue.plugin"


@pytest.fixture(scope="module")
def after_import_verl():
    """What one fresh process sees after ``import verl`` alone, then as verl imports its registry modules
    (one process for the claims below: each fresh ``import verl`` costs seconds)."""
    code = """
import json, sys, verl
watched = ["verl.trainer.ppo.core_algos", "verl.trainer.ppo.v1.trainer_base", "verl.workers.rollout",
           "verl_offpolicy.glue.algorithms.rec", "verl_offpolicy.glue.scheduler.trainer"]
after_import = [m for m in watched if m in sys.modules]
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
losses = "rec" in POLICY_LOSS_REGISTRY
trainer_early = "verl_offpolicy.glue.scheduler.trainer" in sys.modules
from verl.trainer.ppo.v1 import get_trainer_cls
trainer = [get_trainer_cls(name).__name__ for name in ("offpolicy", "offpolicy_overlapped")]
from verl_offpolicy.glue.registration import expected_names, registration_failure
print(json.dumps({"after_import": after_import, "losses": losses, "trainer_early": trainer_early, "trainer": trainer,
                  "failure": registration_failure(),
                  "missing": [e.name for e in expected_names() if not e.lookup(e.name)]}))
"""
    proc = _run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a fresh process imports verl
def test_import_verl_alone_registers_every_name_in_a_fresh_process(after_import_verl):
    assert (after_import_verl["failure"], after_import_verl["missing"]) == (None, [])
    assert len(expected_names()) >= 10


@pytest.mark.slow  # a fresh process imports verl
def test_our_adapters_imported_before_verls_registry_module_still_register_every_name():
    """A user's code (or a test) importing our adapters first: importing verl's core_algos from them ran our
    registration while the adapters module was half-initialised, and no name of ours was registered."""
    code = """
import json
import verl_offpolicy.glue.algorithms.adapters
from verl_offpolicy.glue.registration import expected_names, registration_failure
print(json.dumps({"failure": registration_failure(),
                  "missing": [e.name for e in expected_names() if not e.lookup(e.name)]}))
"""
    proc = _run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"failure": None, "missing": []}


def _defined_by_us(entry) -> bool:
    """A registry value of ours: a function or class of verl_offpolicy, or the dotted path of one
    (verl's adapter dict holds paths, its agent-loop registry ``{"_target_": path}``)."""
    if isinstance(entry, dict):
        entry = entry.get("_target_", "")
    module = entry if isinstance(entry, str) else getattr(entry, "__module__", "")
    return module.startswith("verl_offpolicy.")


def test_name_lists_equal_what_our_decorators_registered():
    """Drift: every name in glue/registration.py's lists is registered by our code, and every entry our
    code put into a verl registry is in a list (so doctor and the startup checks know it)."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.experimental.agent_loop.tool_parser import ToolParser
    from verl.plugin.platform import PlatformRegistry
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
    from verl.workers.rollout import base, replica

    from verl_offpolicy.glue import registration as reg

    assert all(e.lookup(e.name) for e in expected_names())  # imports every registry module (hooks fire)
    registries = {
        "ADV_ESTIMATORS": (reg.ADV_ESTIMATORS, ADV_ESTIMATOR_REGISTRY),
        "POLICY_LOSSES": (reg.POLICY_LOSSES, POLICY_LOSS_REGISTRY),
        "TRAINERS": (reg.TRAINERS, TRAINER_REGISTRY),
        "PLATFORMS": (reg.PLATFORMS, PlatformRegistry._platforms),
        "ROLLOUTS (replicas)": (reg.ROLLOUTS, replica.RolloutReplicaRegistry._registry),
        "ROLLOUTS (adapters)": (reg.ROLLOUTS, {name: v for (name, _mode), v in base._ROLLOUT_REGISTRY.items()}),
        "AGENT_LOOPS": (reg.AGENT_LOOPS, _agent_loop_registry),
        "TOOL_PARSERS": (reg.TOOL_PARSERS, ToolParser._registry),
    }
    for list_name, (listed, registry) in registries.items():
        ours = sorted(name for name, entry in registry.items() if _defined_by_us(entry))
        assert ours == sorted(listed), f"{list_name} in glue/registration.py is not what our code registered"
    assert len(expected_names()) == sum(len(v) for k, (v, _) in registries.items() if k != "ROLLOUTS (adapters)")


@pytest.mark.slow  # a fresh process imports verl
def test_plugins_disabled_means_nothing_registered_until_our_config_is_built():
    """VERL_USE_EXTERNAL_PLUGINS=none really skips us; building our typed config registers on demand."""
    code = """
import os, verl
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
before = "rec" in POLICY_LOSS_REGISTRY
from verl_offpolicy.glue.config import OffPolicyLossConfig
OffPolicyLossConfig(loss_mode="rec")
print(before, "rec" in POLICY_LOSS_REGISTRY)
"""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "none"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["False", "True"]


BROKEN = """
import sys
# Make one of our registration modules fail to import, as a broken install would.
sys.modules["verl_offpolicy.glue.algorithms.rec"] = None
"""
CAUSE = "import of verl_offpolicy.glue.algorithms.rec halted; None in sys.modules"


@pytest.mark.slow  # a fresh process imports verl
def test_failed_registration_is_logged_at_error_and_main_ppo_stops_at_startup_with_the_cause():
    """Stock ``python -m verl.trainer.main_ppo +algorithm=...`` with a registration that raises."""
    code = (
        BROKEN
        + f"""
import runpy
sys.argv = ["main_ppo", "+algorithm=rec_oneside_nois", *{VALID_SIZES!r}]
runpy.run_module("verl.trainer.main_ppo", run_name="__main__")
"""
    )
    proc = _run_python(code)
    assert proc.returncode != 0
    assert "ERROR" in proc.stderr and "verl-offpolicy failed to register its algorithms" in proc.stderr
    user_error = proc.stderr.strip().splitlines()[-1]
    assert user_error.startswith("verl-offpolicy: invalid configuration:")
    assert CAUSE in user_error
    assert "ray init kwargs" not in proc.stdout, "Ray was started although the config is unusable"
    assert "Unsupported loss mode" not in proc.stderr


@pytest.mark.slow  # a fresh process imports verl
def test_failed_registration_surfaces_in_verl_validate_config_without_our_callback():
    """Even without the Hydra callback, verl's own validate_config builds our loss config and fails with the cause."""
    code = (
        BROKEN
        + f"""
from verl_offpolicy.glue.compose import compose_main_ppo
from verl.utils.config import validate_config
cfg = compose_main_ppo("ppo_trainer", ["+algorithm=rec_ring_nois", *{VALID_SIZES!r}])
try:
    validate_config(cfg, use_reference_policy=False, use_critic=False)
except Exception as exc:
    print("RAISED", exc)
"""
    )
    proc = _run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RAISED" in proc.stdout and CAUSE in proc.stdout
    assert "policy_loss 'rec'" in proc.stdout


@pytest.mark.slow  # a fresh process imports verl
def test_import_verl_stays_cheap_and_registration_follows_verls_own_imports(after_import_verl):
    """`import verl` imports none of verl's registry modules for us; each registers when verl imports it."""
    report = {k: after_import_verl[k] for k in ("after_import", "losses", "trainer_early", "trainer")}
    assert report == {
        "after_import": [],
        "losses": True,
        "trainer_early": False,
        "trainer": ["ColocatedTrainer", "OverlappedTrainer"],
    }


@pytest.mark.slow  # a fresh process imports verl
def test_stock_main_ppo_hydra_app_composes_our_preset():
    """verl's own ``main_ppo`` Hydra app (``--cfg job --resolve`` prints the composed, resolved config and exits) finds
    ``+algorithm=opmd`` through our SearchPathPlugin, with nothing but the installed package."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl.trainer.main_ppo",
            "+algorithm=opmd",
            "algorithm.offpolicy.tau=0.5",
            "--cfg",
            "job",
            "--resolve",
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd="/",  # not the repository: the configs must come from the installed package
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["algorithm"]["adv_estimator"] == "opmd"
    assert cfg["algorithm"]["offpolicy"]["tau"] == 0.5
    assert (
        cfg["actor_rollout_ref"]["actor"]["policy_loss"]["_target_"] == "verl_offpolicy.glue.config.OffPolicyLossConfig"
    )
    assert cfg["trainer"]["v1"]["trainer_mode"] == "offpolicy"
    # The package's one compose helper (CLI, tests, harness) composes exactly what main_ppo's app does.
    ours = compose_main_ppo("ppo_trainer", ["+algorithm=opmd", "algorithm.offpolicy.tau=0.5"])
    assert yaml.safe_load(OmegaConf.to_yaml(ours, resolve=True)) == cfg


# ------------------------------------------------- a broken install: one readable line everywhere

MISSING_DEPENDENCY = "verl_offpolicy_missing_dependency"
CPU_PATH_VARIABLES = ("VERL_PLATFORM", "VERL_ENGINE_DEVICE")


@pytest.fixture(scope="module")
def broken_install(tmp_path_factory):
    """A copy of the package under test whose registration module cannot import (a missing dependency),
    first on PYTHONPATH of every process started with the returned environment (Ray workers included)."""
    import shutil
    from pathlib import Path

    import verl_offpolicy

    root = tmp_path_factory.mktemp("broken")
    package = Path(verl_offpolicy.__file__).parent
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(package, root / "verl_offpolicy", ignore=ignore)
    shutil.copytree(package.parent / "hydra_plugins", root / "hydra_plugins", ignore=ignore)
    registration = root / "verl_offpolicy" / "glue" / "registration.py"
    text = registration.read_text()
    anchor = "from __future__ import annotations\n"
    assert anchor in text
    registration.write_text(text.replace(anchor, f"{anchor}import {MISSING_DEPENDENCY}\n", 1))
    # A GPU user's environment: none of the CPU path's variables (an earlier in-process test may have
    # selected the CPU platform in this process; with a broken install that platform does not exist).
    env = {k: v for k, v in os.environ.items() if k not in CPU_PATH_VARIABLES}
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}


def _one_readable_line(output: str) -> None:
    assert "Traceback" not in output, output[-3000:]
    assert "Error locating target" not in output, output[-3000:]
    lines = [line for line in output.splitlines() if f"No module named '{MISSING_DEPENDENCY}'" in line]
    assert lines, output[-3000:]
    assert all("verl_offpolicy/glue/registration.py" in line for line in lines), lines


@pytest.mark.parametrize(
    "entry_point",
    [
        [sys.executable, "-c", "import verl"],
        [sys.executable, "-m", "verl.trainer.main_ppo", "--config-name", "offpolicy_trainer", "algorithm=opmd"],
        [sys.executable, "-m", "verl_offpolicy.cli", "check", "--config-name", "offpolicy_trainer", "algorithm=opmd"],
    ],
    ids=["import_verl", "main_ppo", "check"],
)
@pytest.mark.slow  # a fresh process imports verl
def test_broken_registration_module_gives_one_readable_message(broken_install, entry_point, tmp_path):
    # cwd: main_ppo's Hydra writes its run directory there
    proc = subprocess.run(
        entry_point, capture_output=True, text=True, timeout=TIMEOUT, env=broken_install, cwd=tmp_path
    )
    _one_readable_line(proc.stdout + proc.stderr)
    if entry_point[-1] == "import verl":
        assert "ERROR" in proc.stderr and "verl-offpolicy registered nothing in this process" in proc.stderr
    else:
        assert proc.returncode != 0
        assert "broken installation" in proc.stderr.strip().splitlines()[-1]
        assert "ray init kwargs" not in proc.stdout, "Ray was started although nothing of ours can load"


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(900)
def test_doctor_reports_a_broken_registration_module(broken_install, tmp_path):
    """doctor on the broken install: one readable line, the missing module among its findings. Extended
    tier: ``import verl``, ``main_ppo`` and ``check`` on the same install give that line in the default run
    (:func:`test_broken_registration_module_gives_one_readable_message`)."""
    proc = subprocess.run(
        [sys.executable, "-m", "verl_offpolicy.cli", "doctor"],
        capture_output=True,
        text=True,
        timeout=840,
        env=broken_install,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stdout[-3000:]
    _one_readable_line(proc.stdout + proc.stderr)
    findings = proc.stdout.partition("verl-offpolicy doctor found problems:")[2]
    assert f"No module named '{MISSING_DEPENDENCY}'" in findings


@pytest.mark.slow  # a fresh process imports verl
def test_main_ppo_without_our_plugin_stops_before_ray_naming_the_setting(tmp_path):
    """`VERL_USE_EXTERNAL_PLUGINS=none`: the driver registers our names on its own (our validation imports
    them), the Ray workers will not; verl used to start Ray and fail a minute later with "Unknown trainer
    'offpolicy'". Our primary config's callback stops main_ppo first, naming the setting and the fix."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl.trainer.main_ppo",
            "--config-name",
            "offpolicy_trainer",
            "algorithm=opmd",
            *VALID_SIZES,
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=tmp_path,
        env={**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "none"},
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "verl-offpolicy: invalid configuration: the Ray workers of this run will not have verl-offpolicy"
    )
    assert "trainer.v1.trainer_mode=offpolicy" in last
    assert (
        "VERL_USE_EXTERNAL_PLUGINS=none disables verl's plugins" in last and "unset VERL_USE_EXTERNAL_PLUGINS" in last
    )
    assert "ray init kwargs" not in proc.stdout


def test_the_workers_plugin_setting_is_read_from_the_config_and_accepts_our_module():
    """The workers' environment includes the config's runtime_env; the documented alternative
    (VERL_USE_EXTERNAL_MODULES=verl_offpolicy.register) is not refused, another module is."""
    from verl_offpolicy.startup import check_workers_plugin_setting

    env = "+ray_kwargs.ray_init.runtime_env.env_vars"
    base = ["algorithm=opmd", *VALID_SIZES, f"{env}.VERL_USE_EXTERNAL_PLUGINS=none"]
    check_workers_plugin_setting(
        compose_main_ppo("offpolicy_trainer", [*base, f"{env}.VERL_USE_EXTERNAL_MODULES=verl_offpolicy.register"])
    )
    other = compose_main_ppo("offpolicy_trainer", [*base, f"{env}.VERL_USE_EXTERNAL_MODULES=something_else"])
    with pytest.raises(
        ValueError, match="VERL_USE_EXTERNAL_PLUGINS=none disables verl's plugins.*VERL_USE_EXTERNAL_MODULES="
    ):
        check_workers_plugin_setting(other)


@pytest.mark.slow  # a fresh process imports verl
def test_main_ppo_rejects_an_algorithm_choice_that_is_no_preset(tmp_path):
    """verl's own `algorithm/rollout_correction.yaml` is in the `algorithm` group: our primary config's
    callback stops main_ppo before Ray, listing the presets."""
    from verl_offpolicy.configs import preset_names

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl.trainer.main_ppo",
            "--config-name",
            "offpolicy_trainer",
            "algorithm=rollout_correction",
            *VALID_SIZES,
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "verl-offpolicy: invalid configuration: algorithm=rollout_correction is not a verl-offpolicy preset"
    )
    assert all(name in last for name in preset_names())
    assert "ray init kwargs" not in proc.stdout
