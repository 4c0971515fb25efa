"""Shared by the benchmark scripts: rewriting their generated blocks of ``results/RESULTS.md``, writing their
result tables, and polling something while a run goes on (:class:`Poller`)."""

from __future__ import annotations

import threading
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


RESULTS = Path(__file__).resolve().parent / "results"


def command_line(script: str, argv) -> str:
    """The command that produced a result, as written in its report (``argv`` None: this process's)."""
    import sys

    return f"python benchmarks/{script} " + " ".join(sys.argv[1:] if argv is None else argv)


def measured_commit() -> str:
    """The commit the measurement ran at (``git rev-parse --short HEAD``), ``+ uncommitted changes`` when the
    work tree differs from it outside ``benchmarks/results/`` (which the measurement itself rewrites), or
    ``unknown`` outside a checkout."""
    import subprocess

    root = RESULTS.parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=30
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if head.returncode:
        return "unknown"
    return head.stdout.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")


def write_table(
    filename: str, title: str, command: str, setting: str, header: list[str], rows: list[list[str]], after: str = ""
) -> str:
    """Write ``results/<filename>``: a title, the command and the commit it ran at, the setting, one Markdown
    table (first column left-aligned, the others right-aligned) and optional text ``after``; print it and return it."""
    lines = [f"## {title}", "", f"Command: `{command.strip()}` at commit {measured_commit()}  ", setting, ""]
    lines += ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    text = "\n".join(lines) + "\n" + (f"\n{after.strip()}\n" if after else "")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / filename).write_text(text)
    print(text)
    return text


def git_commit() -> str:
    """The repository's short commit (recorded with a result), or ``unknown``."""
    import subprocess

    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=True,
            timeout=60,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class Poller:
    """``with poller:`` a daemon thread calls :meth:`poll` every ``interval_s`` seconds until the block ends."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)

    def poll(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
