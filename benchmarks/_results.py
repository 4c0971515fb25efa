"""Shared by the benchmark scripts: rewriting their generated blocks of ``results/RESULTS.md``."""

from __future__ import annotations

from pathlib import Path


def replace_block(path: Path, begin: str, end: str, body: str) -> bool:
    """Replace the text between the ``begin``/``end`` markers of ``path``; False if absent."""
    if not path.exists():
        return False
    text = path.read_text()
    if begin not in text or end not in text:
        return False
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{body}\n{end}{tail}")
    return True
