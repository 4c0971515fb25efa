"""Each family declares its knobs once (glue/knobs.py); the typed sections and knobs.yaml come from them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from verl_offpolicy.glue import config
from verl_offpolicy.glue.family import Family
from verl_offpolicy.glue.knobs import Knob

CONFIGS = Path(config.__file__).resolve().parents[1] / "configs"


def test_knobs_yaml_is_generated_from_the_declarations():
    """Drift: the YAML the presets start from is exactly what the families declare (regenerate with
    ``python -m verl_offpolicy.configs --write-knobs``)."""
    assert (CONFIGS / config.KNOBS_YAML).read_text() == config.knobs_yaml()


def test_every_knob_default_reaches_the_yaml_and_the_section():
    text = yaml.safe_load((CONFIGS / config.KNOBS_YAML).read_text())
    offpolicy = text["algorithm"]["offpolicy"]
    loss = text["actor_rollout_ref"]["actor"]["policy_loss"]
    assert offpolicy["sync_interval"] == 1 and offpolicy["ratio_anchor"] == "proximal"  # spot values from the spec
    assert loss["clip_mode"] == "none" and loss["m2po_threshold"] == 0.04
    for knob in config.OffPolicyConfig.KNOBS:
        assert offpolicy[knob.name] == knob.default == getattr(config.OffPolicyConfig(), knob.name)
    assert loss.pop("tau") == "${algorithm.offpolicy.tau}"  # the one interpolated knob
    assert {k.name for k in config.OffPolicyLossConfig.KNOBS} == set(loss) | {"tau"}


def test_sections_are_assembled_from_every_declaring_module():
    names = {k.name for k in config.OffPolicyConfig.KNOBS}
    assert {"sync_interval", "sync_offset", "ratio_anchor", "tau", "beta", "topr_reward"} <= names
    assert {"clip_mode", "m2po_token_pool", "tau"} <= {k.name for k in config.OffPolicyLossConfig.KNOBS}


def test_a_knob_declared_by_two_modules_is_an_error():
    first = Family("family_a", offpolicy_knobs=(Knob("alpha", 1, "a"),))
    second = Family("family_b", offpolicy_knobs=(Knob("alpha", 2, "b"),))
    with pytest.raises(TypeError, match="algorithm.offpolicy.alpha is declared by families family_a and family_b"):
        config.declared_knobs("offpolicy", (first, second))


def test_a_knob_check_names_the_full_key():
    with pytest.raises(ValueError, match=r"^algorithm\.offpolicy\.sync_offset must be an integer >= 0, got -1"):
        config.OffPolicyConfig(sync_offset=-1)
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.actor\.policy_loss\.m2po_token_pool='x' is not valid"):
        config.OffPolicyLossConfig(m2po_token_pool="x")
