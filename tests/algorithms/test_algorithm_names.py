"""Every estimator and loss our code registers in verl has a preset, a docs entry and a name-list entry.

"Registered" is what verl's registries hold after our registration (``ADV_ESTIMATOR_REGISTRY`` and
``POLICY_LOSS_REGISTRY`` entries whose function is defined in verl_offpolicy); a preset "uses" a name if its
file sets ``algorithm.adv_estimator`` or ``actor_rollout_ref.actor.policy_loss.loss_mode`` to it; a docs entry
is the name in backquotes in docs/algorithms.md or a page of docs/algo/.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from verl_offpolicy.glue import registration

ROOT = Path(__file__).resolve().parents[2]
PRESETS = ROOT / "verl_offpolicy" / "configs" / "algorithm"
DOCS = [ROOT / "docs" / "algorithms.md", *sorted((ROOT / "docs" / "algo").glob("*.md"))]
# kind -> (the preset key that selects it, the name list of glue/registration.py)
KINDS = {
    "adv_estimator": (("algorithm", "adv_estimator"), "ADV_ESTIMATORS"),
    "policy_loss": (("actor_rollout_ref", "actor", "policy_loss", "loss_mode"), "POLICY_LOSSES"),
}


def _registered(kind: str) -> list[str]:
    """The names of ``kind`` in verl's registry whose function is ours."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY

    registry = ADV_ESTIMATOR_REGISTRY if kind == "adv_estimator" else POLICY_LOSS_REGISTRY
    return sorted(name for name, fn in registry.items() if getattr(fn, "__module__", "").startswith("verl_offpolicy."))


def _preset_values(keys: tuple[str, ...]) -> set[str]:
    """The values the preset files set at ``keys`` (a nested path)."""
    values = set()
    for path in PRESETS.glob("*.yaml"):
        node = yaml.safe_load(path.read_text()) or {}
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, str):
            values.add(node)
    return values


def gaps(kind: str, name: str) -> list[str]:
    """What ``name`` of ``kind`` lacks: a preset, a docs entry, a name-list entry (empty: nothing)."""
    keys, list_name = KINDS[kind]
    missing = []
    if name not in _preset_values(keys):
        missing.append(f"no preset in {PRESETS.relative_to(ROOT)} sets {'.'.join(keys)}={name}")
    if not any(f"`{name}`" in page.read_text() for page in DOCS):
        missing.append(f"no `{name}` in docs/algorithms.md or docs/algo/*.md")
    if name not in getattr(registration, list_name):
        missing.append(f"not in glue/registration.py's {list_name}")
    return missing


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_registered_name_has_a_preset_a_docs_entry_and_a_name_list_entry(kind):
    registered = _registered(kind)
    assert len(registered) >= 6, registered  # our registration ran (the registry import fires it)
    assert {name: gaps(kind, name) for name in registered} == {name: [] for name in registered}
    # and the name list holds nothing that is not registered
    assert sorted(getattr(registration, KINDS[kind][1])) == registered


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_name_without_preset_docs_or_list_entry_is_reported(kind):
    assert len(gaps(kind, "not_an_algorithm_of_ours")) == 3
