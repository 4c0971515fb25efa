"""Another package's function under one of our names (verl keeps one per name and its
``register_policy_loss`` replaces silently): replaced with a warning when registered before ours,
a startup error when registered after, and reported by ``doctor``'s probe with both origins.

Each case is a fresh process: registration order is what is tested."""

import json
import os
import subprocess
import sys

import pytest

from verl_offpolicy.doctor import _print_registry, fresh_process_state

pytestmark = pytest.mark.slow  # fresh processes import verl
TIMEOUT = 300

# A module that verl imports before its plugins (VERL_USE_EXTERNAL_MODULES), as verl itself or another
# plugin would define the names first: a loss and an estimator under two of our names.
FOREIGN = """
from verl.trainer.ppo.core_algos import register_adv_est, register_policy_loss

@register_policy_loss("topr")
def their_topr(*args, **kwargs):
    raise AssertionError("not ours")

@register_adv_est("opmd")
def their_opmd(*args, **kwargs):
    raise AssertionError("not ours")
"""


@pytest.fixture
def foreign_first(tmp_path):
    (tmp_path / "their_losses.py").write_text(FOREIGN)
    return {
        **os.environ,
        "VERL_USE_EXTERNAL_MODULES": "their_losses",
        "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p),
    }


def test_a_name_registered_before_ours_is_served_by_ours_and_doctor_reports_both_origins(foreign_first, capsys):
    code = """
import json, verl
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
print(json.dumps([POLICY_LOSS_REGISTRY["topr"].__module__, ADV_ESTIMATOR_REGISTRY["opmd"].__module__]))
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], env=foreign_first, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [
        "verl_offpolicy.glue.algorithms.topr",
        "verl_offpolicy.glue.algorithms.opmd",
    ]
    assert "replaces the policy_loss 'topr' registered earlier by their_losses.their_topr" in proc.stderr

    state = fresh_process_state(foreign_first, TIMEOUT)  # doctor's probe of a fresh `import verl` process
    assert state["problem"] is None and all(ok for _, _, ok in state["names"])
    found = {(c["kind"], c["name"]): c for c in state["collisions"]}
    assert set(found) == {("policy_loss", "topr"), ("adv_estimator", "opmd")}
    assert "registered first by their_losses.their_topr" in found[("policy_loss", "topr")]["message"]
    # a name known to mean different maths elsewhere says so (verl#6986's topr normalises by length)
    assert "truncates the length-normalised sequence ratio" in found[("policy_loss", "topr")]["message"]
    assert "length-normalised" not in found[("adv_estimator", "opmd")]["message"]
    assert not any(c["fatal"] for c in found.values())  # ours serves both names
    problems = _print_registry("fresh process", state)
    assert len(problems) == 2 and "COLLISION policy_loss" in capsys.readouterr().out


def test_a_name_registered_after_ours_stops_a_run_that_selects_it_naming_both():
    code = """
import json, verl
from verl.trainer.ppo.core_algos import register_policy_loss
from verl_offpolicy.glue.config import OffPolicyLossConfig
OffPolicyLossConfig(loss_mode="rec")  # ours, before the other package registers

@register_policy_loss("rec")
def late_rec(*args, **kwargs):
    pass

from omegaconf import OmegaConf
from verl_offpolicy.glue.registration import collisions
from verl_offpolicy.glue.validation import check_registered  # the startup validation's first rule

def selecting(loss_mode):
    return OmegaConf.create({"actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": loss_mode}}}})

try:
    check_registered(selecting("rec"))
    error = None
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
check_registered(selecting("opmd"))  # a name nobody else claims still passes
print(json.dumps({"error": error, "collisions": collisions()}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["error"].startswith(
        "RegistrationError: verl-offpolicy: policy_loss 'rec' in verl's registry is __main__.late_rec"
    )
    assert "actor_rollout_ref.actor.policy_loss.loss_mode=rec would not run verl-offpolicy's" in out["error"]
    assert [(c["kind"], c["name"], c["fatal"]) for c in out["collisions"]] == [("policy_loss", "rec", True)]
