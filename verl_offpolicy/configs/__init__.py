"""verl-offpolicy's Hydra configs (found by ``main_ppo`` through ``hydra_plugins/verl_offpolicy_searchpath``).

- ``offpolicy_trainer.yaml`` / ``offpolicy_megatron_trainer.yaml``: primary configs (``--config-name``).
- ``algorithm/<name>.yaml``: one preset per algorithm, selected with ``algorithm=<name>`` (``+algorithm=``
  on verl's stock configs). Every file of this folder is a preset, and only presets may be selected.
- ``offpolicy_shared/``: the parts the presets include (never selected directly); ``knobs.yaml`` there is
  generated from the families' knobs (``python -m verl_offpolicy.configs --write-knobs``).
- ``cpu/demo.yaml``, ``cpu/megatron.yaml``: the CPU overlays (``+cpu=demo`` for FSDP2, ``+cpu=megatron`` for
  verl's Megatron engine); ``cpu_shared/base.yaml``: their engine-independent part (never selected directly).
- ``cpu_rollout/standalone.yaml``: with it, the CPU rollout on a pool of its own (``+cpu_rollout=standalone``).
- ``cpu_rollout/vllm.yaml``: with it, verl's own vLLM rollout (vLLM's CPU build) instead of ``hf``
  (``+cpu_rollout=vllm``; ``docs/vllm_cpu.md``).

Every preset file opens with a comment header, its documentation, in one form::

    # @package _global_
    # <the setting in one line>
    # <any number of lines: the formula, keys, sources>
    # Reproduces: <the paper setting it reproduces, and its source>
    #   <continuation lines, indented by two or more spaces>

``preset_headers()`` is the one parser of these headers: ``verl-offpolicy list`` prints from it and the
README's preset table is generated from it (``python -m verl_offpolicy.configs --write-readme``).

Only the standard library is imported here: the startup callback reads the preset list even when the
rest of the package cannot import.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

PRESET_PACKAGE = "verl_offpolicy.configs"
PRESET_GROUP = "algorithm"
# verl's primary configs (no `algorithm` group default) and ours (default `algorithm: grpo`).
STOCK_CONFIGS = ("ppo_trainer", "ppo_megatron_trainer")
PRIMARY_CONFIGS = ("offpolicy_trainer", "offpolicy_megatron_trainer")


def preset_selector(preset: str, config_name: str) -> str:
    """The override selecting ``preset``: ``algorithm=<preset>`` on our primary configs (it replaces their
    default), ``+algorithm=<preset>`` on any other (verl's stock configs, a recipe's own: it adds the group)."""
    return f"{PRESET_GROUP}={preset}" if config_name in PRIMARY_CONFIGS else f"+{PRESET_GROUP}={preset}"


def preset_names() -> list[str]:
    """Every algorithm preset: the ``.yaml`` files of ``configs/algorithm/``."""
    folder = resources.files(PRESET_PACKAGE) / PRESET_GROUP
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def preset_text(name: str) -> str:
    """The YAML text of the preset ``name``."""
    return (resources.files(PRESET_PACKAGE) / PRESET_GROUP / f"{name}.yaml").read_text()


# ------------------------------------------------------------------------------------ preset headers

REPRODUCES = "Reproduces:"
# The README block that `python -m verl_offpolicy.configs --write-readme` rewrites.
README_BEGIN = "<!-- presets:begin -->"
README_END = "<!-- presets:end -->"


@dataclass(frozen=True)
class PresetHeader:
    """What a preset's comment header says: its ``setting`` (the first line) and the paper setting it
    ``reproduces`` (the ``# Reproduces:`` paragraph, without the label, joined into one line)."""

    name: str
    setting: str
    reproduces: str


def preset_header(name: str) -> list[str]:
    """The comment lines at the top of a preset file (its documentation), without ``#`` and the
    ``# @package`` line."""
    lines = []
    for line in preset_text(name).splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            lines.append(line[1:].strip())
    return lines


def _reproduces(name: str) -> str:
    """The ``# Reproduces:`` line of preset ``name`` and its continuation lines (``#`` and two or more
    spaces), joined; ``ValueError`` if the header has none."""
    raw = preset_text(name).splitlines()
    start = next((i for i, line in enumerate(raw) if line.startswith(f"# {REPRODUCES}")), None)
    if start is None:
        raise ValueError(f"{name}.yaml: its comment header has no '# {REPRODUCES}' line")
    lines = [raw[start][len(f"# {REPRODUCES}") :].strip()]
    for line in raw[start + 1 :]:
        if not line.startswith("#  "):
            break
        lines.append(line[1:].strip())
    return " ".join(lines)


def parse_preset_header(name: str) -> PresetHeader:
    """The header of preset ``name``; ``ValueError`` naming the file if a field is missing."""
    header = preset_header(name)
    if not header or header[0].startswith(REPRODUCES):
        raise ValueError(f"{name}.yaml: its comment header does not open with a one-line setting")
    return PresetHeader(name, header[0], _reproduces(name))


def preset_headers() -> list[PresetHeader]:
    """The header of every preset, in ``preset_names()`` order."""
    return [parse_preset_header(name) for name in preset_names()]


def _cell(text: str) -> str:
    """``text`` as a markdown table cell (a ``|`` would end the cell)."""
    return text.replace("|", "\\|")


def preset_table() -> str:
    """The README's preset table, generated from the headers, between its begin/end markers."""
    rows = [
        README_BEGIN,
        "<!-- generated from the presets' headers by `python -m verl_offpolicy.configs --write-readme`; "
        "do not edit -->",
        "",
        "| preset | setting | reproduces |",
        "|---|---|---|",
        *(f"| `{h.name}` | {_cell(h.setting)} | {_cell(h.reproduces)} |" for h in preset_headers()),
        "",
        README_END,
    ]
    return "\n".join(rows)


def with_preset_table(readme: str) -> str:
    """``readme`` with the text between its begin/end markers replaced by ``preset_table()``."""
    head, begin, rest = readme.partition(README_BEGIN)
    _, end, tail = rest.partition(README_END)
    if not begin or not end:
        raise ValueError(f"the README has no {README_BEGIN} ... {README_END} block")
    return head + preset_table() + tail


def write_knobs() -> int:
    """Write ``offpolicy_shared/knobs.yaml`` from the families' knobs (imports the package and verl)."""
    from verl_offpolicy.glue.config import KNOBS_YAML, knobs_yaml

    path = Path(__file__).parent / KNOBS_YAML
    path.write_text(knobs_yaml())
    print(f"{path}: written")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m verl_offpolicy.configs --write-readme [README.md]``: regenerate the README's preset
    table; ``--check`` exits 1 when it differs from the generated one. ``--write-knobs``: regenerate
    ``offpolicy_shared/knobs.yaml`` from the families' knobs."""
    parser = argparse.ArgumentParser(prog="python -m verl_offpolicy.configs", description=main.__doc__)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write-readme", metavar="README", nargs="?", const="README.md")
    action.add_argument("--check", metavar="README", nargs="?", const="README.md")
    action.add_argument("--write-knobs", action="store_true")
    args = parser.parse_args(argv)
    if args.write_knobs:
        return write_knobs()
    path = Path(args.write_readme or args.check)
    text = path.read_text()
    new = with_preset_table(text)
    if args.check:
        if new != text:
            print(
                f"{path}: the preset table is stale; run python -m verl_offpolicy.configs --write-readme",
                file=sys.stderr,
            )
            return 1
        return 0
    if new != text:
        path.write_text(new)
    print(f"{path}: preset table of {len(preset_names())} presets")
    return 0
