"""The user docs cannot drift from the repository: the README stays short and keeps CI's two commands,
its preset table is the one generated from the presets' headers and shows every preset file (as
``verl-offpolicy list`` does), and every relative link of the docs reaches an existing file and heading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from verl_offpolicy.cli import main as cli_main
from verl_offpolicy.configs import (
    README_BEGIN,
    README_END,
    parse_preset_header,
    with_preset_table,
)
from verl_offpolicy.configs import (
    main as configs_main,
)

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PRESET_DIR = ROOT / "verl_offpolicy" / "configs" / "algorithm"
README_MAX_LINES = 250


def preset_files() -> list[str]:
    """Every preset, read from the folder itself (not through the package's own listing)."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def readme_table_presets(text: str) -> list[str]:
    """The preset names of the README's generated table: the first cell of each row."""
    block = text.split(README_BEGIN, 1)[1].split(README_END, 1)[0]
    return [m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", block, flags=re.MULTILINE)]


# ------------------------------------------------------------------------------------------ README


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail to docs/"
    )


def test_readme_first_code_block_is_the_setup_and_the_test_command():
    """.ci/run executes the first code block's two lines literally: line 1 sets up and runs the demo, line
    2 runs the tests, and nothing else may stand there."""
    block = README.read_text().split("```\n", 2)[1].splitlines()
    assert len(block) == 2, block
    setup, tests = block
    assert setup.startswith("python3 -m venv .venv && ") and setup.endswith(" && .venv/bin/verl-offpolicy demo")
    assert tests == ".venv/bin/python -m pytest tests -q"


def test_readme_preset_table_is_the_generated_one():
    text = README.read_text()
    assert with_preset_table(text) == text, (
        "README.md's preset table is stale: python -m verl_offpolicy.configs --write-readme"
    )
    assert configs_main(["--check", str(README)]) == 0


def test_readme_preset_table_shows_every_preset_file():
    assert readme_table_presets(README.read_text()) == preset_files()


def test_verl_offpolicy_list_shows_every_preset_file(capsys):
    assert cli_main(["list"]) == 0
    names = [line for line in capsys.readouterr().out.splitlines() if line and not line.startswith(" ")]
    assert names == preset_files()


def test_write_readme_restores_a_removed_row(tmp_path):
    """The command that rewrites the block puts back a row deleted by hand; --check reports the
    difference first."""
    text = README.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `grpo` |"))
    broken = tmp_path / "README.md"
    broken.write_text(text.replace(row + "\n", ""))
    assert "grpo" not in readme_table_presets(broken.read_text())
    assert configs_main(["--check", str(broken)]) == 1
    assert configs_main(["--write-readme", str(broken)]) == 0
    assert broken.read_text() == text


def test_readme_layout_names_every_package_module():
    """Every module and folder of verl_offpolicy/ (discovered, not listed here) is named in the README's Layout."""
    text = README.read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    words = set(re.findall(r"[a-z_][a-z0-9_]*", block))
    package = ROOT / "verl_offpolicy"
    names = {p.stem for p in package.rglob("*.py") if p.stem not in ("__init__", "__main__")}
    names |= {p.name for p in package.rglob("*") if p.is_dir() and p.name != "__pycache__"}
    assert len(names) >= 80 and sorted(names - words) == []


# --------------------------------------------------------------------------------- the generated indexes


def _copy_docs(tmp_path: Path) -> Path:
    """The files the index tables live in and read, under ``tmp_path`` (a repository of their own)."""
    import shutil

    from verl_offpolicy.configs.tables import ALGO_PAGES, BLOCKS

    for relative in [*BLOCKS, *(str(p.relative_to(ROOT)) for p in (ROOT / ALGO_PAGES).glob("*.md"))]:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / relative, tmp_path / relative)
    for folder in (ROOT / "examples").glob("*_trainer"):  # the examples table lists the folders that exist
        (tmp_path / "examples" / folder.name).mkdir()
    return tmp_path


def test_every_index_table_is_the_generated_one():
    from verl_offpolicy.configs.tables import main as tables_main

    assert tables_main(["--check", "--root", str(ROOT)]) == 0


def test_the_family_table_reads_the_pages_as_written():
    """docs/algo/red.md opens with '> Presets: `red_drop`, `red_weight`. Source: the REC paper.' (read by hand)."""
    from verl_offpolicy.configs.tables import family_pages

    red = next(p for p in family_pages(ROOT) if p.stem == "red")
    assert (red.short, red.presets, red.source) == ("RED", ("red_drop", "red_weight"), "the REC paper")
    rows = (ROOT / "docs" / "README.md").read_text()
    assert "| [algo/red.md](algo/red.md) | `red_drop`, `red_weight` | the REC paper |" in rows
    assert (
        "| `red_trainer/` | RED | `red_drop`, `red_weight` | [docs/algo/red.md](../docs/algo/red.md) |"
        in (ROOT / "examples" / "README.md").read_text()
    )


def test_a_table_edited_by_hand_is_stale_and_written_back(tmp_path):
    from verl_offpolicy.configs.tables import main as tables_main

    root = _copy_docs(tmp_path)
    page = root / "docs" / "README.md"
    original = page.read_text()
    page.write_text(original.replace("| [algo/red.md](algo/red.md)", "| [algo/red.md](algo/RED.md)"))
    assert tables_main(["--check", "--root", str(root)]) == 1
    assert tables_main(["--write", "--root", str(root)]) == 0
    assert page.read_text() == original


def test_a_preset_on_no_page_or_on_two_is_named(tmp_path, capsys):
    from verl_offpolicy.configs.tables import main as tables_main

    root = _copy_docs(tmp_path)
    red = root / "docs" / "algo" / "red.md"
    red.write_text(red.read_text().replace("> Presets: `red_drop`, `red_weight`.", "> Preset: `red_drop`."))
    asymre = root / "docs" / "algo" / "asymre.md"
    asymre.write_text(asymre.read_text().replace("> Preset: `asymre`.", "> Presets: `asymre`, `red_drop`."))
    assert tables_main(["--check", "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert "preset red_weight is on no family page" in err and "preset red_drop is on several pages: asymre, red" in err


def test_preset_header_fields_are_read_as_written():
    """Two headers read by hand: a one-line and a two-line ``# Reproduces:`` paragraph."""
    header = parse_preset_header("grpo_proximal")
    assert (
        header.setting
        == "GRPO with verl's default proximal anchor: under staleness, unclipped std-normalised REINFORCE."
    )
    assert header.reproduces == "verl's built-in GRPO with verl's proximal ratio anchor (not a paper setting)."
    assert parse_preset_header("rec_oneside_nois").reproduces == (
        "the REC paper's REC-OneSide-NoIS on GSM8K (K = 8, batch 96, lr 1e-6; off-policy runs: "
        "sync_interval = 20 or sync_offset = 10)."
    )


# ------------------------------------------------------------------------------------------- links

DOC_FILES = sorted(
    {
        README,
        ROOT / "examples" / "README.md",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "benchmarks" / "results").glob("*.md"),
    }
)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", text)


def heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors of ``path``'s headings: lower case, punctuation dropped (letters, digits, ``_``,
    ``-`` and spaces kept), spaces to ``-``, a repeated anchor suffixed ``-1``, ``-2``, ..."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.MULTILINE | re.DOTALL)
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, flags=re.MULTILINE):
        heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in anchors:
            n += 1
            candidate = f"{slug}-{n}"
        anchors.add(candidate)
    return anchors


def broken_links(path: Path) -> list[str]:
    """Every relative link of ``path`` whose file does not exist or whose ``#anchor`` is no heading there."""
    broken = []
    for target in LINK.findall(_prose(path.read_text())):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved):
            broken.append(f"{target}: no heading with anchor #{anchor} in {resolved.name}")
    return broken


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


def test_the_link_check_sees_links_anchors_and_breaks(tmp_path):
    """The scan finds the README's links, GitHub's anchors of headings with code and punctuation, and
    each kind of break."""
    assert len(LINK.findall(_prose(README.read_text()))) >= 10
    anchors = heading_anchors(ROOT / "docs" / "scheduler.md")
    assert {"what-it-logs", "overlapped-mode-actor_rollout_refhybrid_enginefalse"} <= anchors
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n## A `code` heading, twice\n\n## A `code` heading, twice\n\n"
        "[ok](#a-code-heading-twice-1) [ok](page.md#title) [web](https://example.org/x)\n"
        "[missing](nowhere.md) [bad anchor](#no-such-heading) `[in code](nowhere.md)`\n"
    )
    assert broken_links(page) == [
        "nowhere.md: no such file",
        "#no-such-heading: no heading with anchor #no-such-heading in page.md",
    ]
