"""docs/extending.md's "A new family, step by step", followed literally in a copy of the repository.

Each **File** block of that section is applied as the doc says (``new`` writes the file, ``append`` adds to its
end, ``edit`` replaces the ``-`` lines by the ``+`` lines), the section's commands run, then the tests a new
family must pass (the conformance suite on its example, its own test, the presets' and the docs' tests) run in
the copy, and the files changed are counted against the number the doc states.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"
SECTION = "## A new family, step by step"
FILE_BLOCK = re.compile(
    r"\*\*File\*\* `(?P<path>[^`]+)` \((?P<how>new|append|edit)\):\n\n"
    r"(?P<fence> *)```\w*\n(?P<body>.*?)\n(?P=fence)```",
    re.S,
)


def _section() -> str:
    text = DOC.read_text()
    start = text.index(SECTION)
    return text[start : text.index("\n## ", start + len(SECTION))]


def file_blocks(section: str) -> list[tuple[str, str, str]]:
    """(path, how, content) of every **File** block, in order (content dedented as a reader copies it)."""
    return [(m["path"], m["how"], textwrap.dedent(m["body"]) + "\n") for m in FILE_BLOCK.finditer(section)]


def commands(section: str) -> list[list[str]]:
    """The ``python -m ...`` lines of the section's command block, comments dropped."""
    found = []
    for line in re.findall(r"^ *(python -m [^\n#]+)", section, flags=re.M):
        found.append(line.split())
    return found


def apply(root: Path, path: str, how: str, content: str) -> None:
    target = root / path
    if how == "new":
        assert not target.exists(), f"{path} exists already"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    elif how == "append":
        target.write_text(target.read_text().rstrip("\n") + "\n\n\n" + content)
    else:
        lines = content.splitlines()
        old = "\n".join(line[1:] for line in lines if line.startswith("-"))
        new = "\n".join(line[1:] for line in lines if line.startswith("+"))
        text = target.read_text()
        assert text.count(old) == 1, f"{path}: the doc's '-' lines are not in the file once:\n{old}"
        target.write_text(text.replace(old, new))


def test_the_section_is_read_as_written():
    """The blocks and commands read by hand from the section: 8 files, 3 commands."""
    section = _section()
    assert [(p, h) for p, h, _ in file_blocks(section)] == [
        ("verl_offpolicy/core/advantages.py", "append"),
        ("verl_offpolicy/glue/algorithms/sign.py", "new"),
        ("verl_offpolicy/glue/algorithms/__init__.py", "edit"),
        ("README.md", "edit"),
        ("verl_offpolicy/configs/algorithm/sign.yaml", "new"),
        ("tests/algorithms/test_sign.py", "new"),
        ("tests/scenario_presets.py", "edit"),
        ("docs/algo/sign.md", "new"),
    ]
    assert all(content.strip() for _, _, content in file_blocks(section))
    assert [c[:3] for c in commands(section)] == [["python", "-m", "verl_offpolicy.configs"]] * 2 + [
        ["python", "-m", "verl_offpolicy.configs.tables"]
    ]


def _copy_repository(dest: Path) -> None:
    """The repository's files as they stand (``git ls-files``), in a fresh git repository at ``dest``."""
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    for relative in files:
        if (ROOT / relative).is_file():
            (dest / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / relative, dest / relative)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run([*git, *args], cwd=dest, check=True, timeout=120, capture_output=True)


@pytest.mark.slow  # a copy of the repository, four commands and a pytest run in it (a minute or two)
@pytest.mark.timeout(1800)
def test_following_the_steps_literally_adds_a_working_family(tmp_path):
    section = _section()
    dest = tmp_path / "repo"
    _copy_repository(dest)
    for path, how, content in file_blocks(section):
        apply(dest, path, how, content)
    env = {**os.environ, "PYTHONPATH": str(dest)}
    for command in commands(section):
        proc = subprocess.run(
            [sys.executable, *command[1:]], cwd=dest, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, (command, proc.stdout[-2000:], proc.stderr[-3000:])
    tests = [
        "tests/algorithms/test_conformance.py",
        "tests/algorithms/test_sign.py",
        "tests/glue/test_presets.py",
        "tests/test_docs.py",
        "tests/algorithms/test_algorithm_names.py",
        "tests/glue/test_knobs.py",
    ]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *tests,
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "not e2e and not slow and not extended",
            "-k",
            "sign or docs or names or knobs or every_registered",
        ],
        cwd=dest,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert int(re.search(r"(\d+) passed", proc.stdout.strip().splitlines()[-1]).group(1)) >= 20, proc.stdout[-2000:]
    # the conformance suite picked the new estimator's example up (its four estimator checks and more)
    listed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "tests/algorithms/test_conformance.py",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=dest,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    assert len(re.findall(r"\[(?:\w+-)?sign\]", listed)) >= 4, listed[-2000:]
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=dest,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.splitlines()
    changed = sorted(line[3:] for line in changed if "__pycache__" not in line)
    stated = int(re.search(r"counts the files changed: \*\*(\d+)\*\*", section).group(1))
    assert len(changed) == stated, changed
