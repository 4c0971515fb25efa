"""verl-offpolicy's Hydra configs (found by ``main_ppo`` through ``hydra_plugins/verl_offpolicy_searchpath``).

- ``offpolicy_trainer.yaml`` / ``offpolicy_megatron_trainer.yaml``: primary configs (``--config-name``).
- ``algorithm/<name>.yaml``: one preset per algorithm, selected with ``algorithm=<name>`` (``+algorithm=``
  on verl's stock configs). Every file of this folder is a preset, and only presets may be selected.
- ``offpolicy_shared/``: the parts the presets include (never selected directly).
- ``cpu/demo.yaml``, ``cpu/megatron.yaml``: the CPU overlays (``+cpu=demo`` for FSDP2, ``+cpu=megatron`` for
  verl's Megatron engine); ``cpu_shared/base.yaml``: their engine-independent part (never selected directly).
- ``cpu_rollout/standalone.yaml``: with it, the CPU rollout on a pool of its own (``+cpu_rollout=standalone``).
- ``cpu_rollout/vllm.yaml``: with it, verl's own vLLM rollout (vLLM's CPU build) instead of ``hf``
  (``+cpu_rollout=vllm``; ``docs/vllm_cpu.md``).

Only the standard library is imported here: the startup callback reads the preset list even when the
rest of the package cannot import.
"""

from __future__ import annotations

from importlib import resources

PRESET_PACKAGE = "verl_offpolicy.configs"
PRESET_GROUP = "algorithm"
# verl's primary configs (no `algorithm` group default) and ours (default `algorithm: grpo`).
STOCK_CONFIGS = ("ppo_trainer", "ppo_megatron_trainer")
PRIMARY_CONFIGS = ("offpolicy_trainer", "offpolicy_megatron_trainer")


def preset_selector(preset: str, config_name: str) -> str:
    """The override selecting ``preset``: ``+algorithm=<preset>`` on verl's stock configs (it adds the
    group), ``algorithm=<preset>`` on ours (it replaces the default)."""
    return f"+{PRESET_GROUP}={preset}" if config_name in STOCK_CONFIGS else f"{PRESET_GROUP}={preset}"


def preset_names() -> list[str]:
    """Every algorithm preset: the ``.yaml`` files of ``configs/algorithm/``."""
    folder = resources.files(PRESET_PACKAGE) / PRESET_GROUP
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def preset_text(name: str) -> str:
    """The YAML text of the preset ``name``."""
    return (resources.files(PRESET_PACKAGE) / PRESET_GROUP / f"{name}.yaml").read_text()
