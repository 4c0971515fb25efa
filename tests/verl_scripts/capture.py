"""Capture the exact ``main_ppo`` argv of every shell script of a verl checkout (its ``examples/`` and
``recipe/``), without running anything: each script runs under bash with stubs first on ``PATH``
(``python3``/``python`` record their argv when it starts ``verl.trainer.main_ppo``; ``ray job submit``
runs its command; ``pip``, ``git``, ``nvidia-smi``, downloads and the like do nothing), in a temporary ``HOME``
(shown as ``/home/user``), with a timeout.

    python tests/verl_scripts/capture.py /path/to/verl-checkout LABEL

writes ``tests/verl_scripts/LABEL/<script path>.argv`` (one argument per line, the arguments after
``-m verl.trainer.main_ppo``) and ``LABEL/MANIFEST.md`` (what ran, what had no ``main_ppo`` line). The
test corpus of :mod:`tests.test_user_scripts` reads these files; the checkouts themselves are not kept.

    python tests/verl_scripts/capture.py --drift LABEL

writes ``LABEL/DRIFT.md``: the captured lines the installed verl cannot compose (keys it removed).
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
ENTRY = "verl.trainer.main_ppo"
SCRIPT_TIMEOUT_S = 30
HOME_SHOWN = "/home/user"  # $HOME is a temporary folder (a few scripts create folders there); argv files show this
RECORDER = f"""#!/usr/bin/env bash
# stub python: record a main_ppo argv, do nothing else
args=("$@")
for i in "${{!args[@]}}"; do
  if [ "${{args[$i]}}" = "{ENTRY}" ]; then
    record='import json, os, sys; open(os.environ["CAPTURE_FILE"], "a").write(json.dumps(sys.argv[1:]) + "\\n")'
    "$REAL_PYTHON" -c "$record" "${{args[@]:$((i+1))}}"
  fi
done
exit 0
"""
RAY = """#!/usr/bin/env bash
# stub ray: `ray job submit ... -- CMD` runs CMD (through the stubs); anything else does nothing
while [ $# -gt 0 ]; do if [ "$1" = "--" ]; then shift; exec "$@"; fi; shift; done
exit 0
"""
NOOP = "#!/usr/bin/env bash\nexit 0\n"
NOOPS = (
    "pip",
    "pip3",
    "git",
    "nvidia-smi",
    "wget",
    "curl",
    "huggingface-cli",
    "hf",
    "docker",
    "sleep",
    "modelscope",
    "npu-smi",
    "rocm-smi",
    "aws",
    "hdfs",
    "hadoop",
    "sudo",
    "apt",
    "apt-get",
    "conda",
    "torchrun",
    "kill",
    "pkill",
)


def stubs(folder: Path) -> None:
    for name, text in (("python3", RECORDER), ("python", RECORDER), ("ray", RAY), *((n, NOOP) for n in NOOPS)):
        path = folder / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)


def capture(script: Path, root: Path, stub_dir: Path, home: Path) -> list[list[str]]:
    """The main_ppo argv lists ``script`` would run (in order)."""
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as out:
        env = {
            "PATH": f"{stub_dir}:/usr/bin:/bin",
            "HOME": str(home),
            "CAPTURE_FILE": out.name,
            "REAL_PYTHON": sys.executable,
            "TERM": "dumb",
        }
        try:
            subprocess.run(
                ["bash", str(script)],
                cwd=root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=SCRIPT_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            pass
        lines = Path(out.name).read_text().replace(str(home), HOME_SHOWN).splitlines()
        return [json.loads(line) for line in lines if line.strip()]


def drift(argv: list[str]) -> str | None:
    """Why the installed verl cannot compose ``argv`` as main_ppo would (a key it no longer has), else None."""
    from verl_offpolicy.glue.compose import compose_main_ppo_argv

    try:
        compose_main_ppo_argv(argv)
    except Exception as exc:  # noqa: BLE001 - the message is the record
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return None


def write_drift(label: str) -> int:
    """``LABEL/DRIFT.md``: every captured line of ``label`` that the installed verl cannot compose, and why."""
    from importlib import metadata

    target = HERE / label
    rows = []
    for path in sorted(target.rglob("*.argv")):
        reason = drift([line for line in path.read_text().splitlines() if line])
        if reason:
            cell = reason.replace("|", "\\|")
            rows.append(f"| `{path.relative_to(target)}` | {cell} |")
    text = "\n".join(
        [
            f"# {label}: lines verl {metadata.version('verl')} cannot compose",
            "",
            f"Written by `python tests/verl_scripts/capture.py --drift {label}`: mostly keys that verl's scripts "
            "of that release set and this verl no longer has (verl moved or removed them), a few placeholders a "
            "script leaves "
            "for the user to fill in. These lines are kept as they were "
            "captured; tests/glue/test_user_scripts.py checks this list against the installed verl.",
            "",
            "| argv file | what composing it raises |",
            "|---|---|",
            *rows,
            "",
        ]
    )
    (target / "DRIFT.md").write_text(text)
    print(f"{target / 'DRIFT.md'}: {len(rows)} of {len(list(target.rglob('*.argv')))} lines drifted")
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--drift":
        return write_drift(argv[1])
    root, label = Path(argv[0]).resolve(), argv[1]
    target = HERE / label
    scripts = sorted(p for folder in ("examples", "recipe") for p in (root / folder).rglob("*.sh"))
    kept, without = [], []
    with tempfile.TemporaryDirectory() as tmp:
        stub_dir, home = Path(tmp, "bin"), Path(tmp, "home")
        stub_dir.mkdir(), home.mkdir()
        stubs(stub_dir)
        for number, script in enumerate(scripts, 1):
            rel = script.relative_to(root)
            calls = capture(script, root, stub_dir, home)
            print(f"[capture {number}/{len(scripts)}] {rel}: {len(calls)} main_ppo line(s)", flush=True)
            if not calls:
                without.append(str(rel))
            for index, call in enumerate(calls):
                suffix = "" if len(calls) == 1 else f".{index}"
                path = target / f"{rel}{suffix}.argv"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("".join(f"{arg}\n" for arg in call))
                kept.append(f"{rel}{suffix}")
    lines = [
        f"# {label}",
        "",
        f"Captured by `python tests/verl_scripts/capture.py <checkout> {label}`.",
        "",
        f"{len(kept)} main_ppo lines from {len(scripts) - len(without)} of {len(scripts)} scripts; "
        f"scripts without a main_ppo line: {len(without)}.",
        "",
    ]
    (target / "MANIFEST.md").write_text("\n".join(lines))
    print(f"{target}: {len(kept)} argv files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
