"""``algorithm.offpolicy.preset``: the name a preset writes of itself, declared as a family's knob.

Hydra deletes its record of the preset's choice from the config verl's TaskRunner gets, so each preset file writes
its own name here; :func:`verl_offpolicy.glue.preset_overrides.check_preset_name` compares the keys that define that
preset's algorithm with the preset's values by it.
"""

from __future__ import annotations

from typing import Any

from verl_offpolicy.glue.family import Family
from verl_offpolicy.glue.knobs import ALGO_PREFIX, Knob


def _preset_name(key: str, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{key} must be a preset's name or null, got {value!r}")


PRESET_KNOB = Knob(
    "preset",
    None,
    "The preset this config comes from, written by the preset's own file (null: none). Startup compares the keys "
    "that define the preset's algorithm with the preset's values; a preset of your own that includes one of ours "
    "sets its own name here, or null.",
    check=_preset_name,
)
PRESET_KEY = f"{ALGO_PREFIX}.{PRESET_KNOB.name}"
FAMILY = Family("preset", offpolicy_knobs=(PRESET_KNOB,))  # assembled into algorithm.offpolicy by glue/config.py
