"""The reward curve of a run as a PNG (train score per step, greedy validation reward)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

from verl_offpolicy.demo.output_dir import CACHE_NAME
from verl_offpolicy.demo.results import TRAIN_SCORE

# One thread at a time sets, imports and unsets MPLCONFIGDIR: two runs of the tests' shared jobs ending
# together both saw matplotlib unimported, and the second `del` raised KeyError (seen in a full-suite run).
# The lock cannot cover other code that edits os.environ meanwhile (a CI run lost the variable between set
# and unset), so the unset tolerates its absence.
_MATPLOTLIB_IMPORT = threading.Lock()


class PlotUnavailable(RuntimeError):
    """matplotlib cannot be imported (an optional dependency: the ``plot`` extra); the message is the note to print."""


def write_plot(
    result_metrics: list[dict[str, Any]],
    validation: dict[int, float],
    path: str | os.PathLike,
    title: str = "tiny Llama, repeat task",
) -> str:
    """Reward curve (train score per step, greedy validation reward) as a PNG.

    matplotlib's config and font cache go next to the PNG (``.cache/matplotlib``) unless
    ``MPLCONFIGDIR`` is set or matplotlib is already imported (it reads the variable at import).
    Raises :class:`PlotUnavailable` (one line, with the install command) if matplotlib is not installed.
    """
    with _MATPLOTLIB_IMPORT:
        own_config = "matplotlib" not in sys.modules and "MPLCONFIGDIR" not in os.environ
        if own_config:
            os.environ["MPLCONFIGDIR"] = str(Path(path).absolute().parent / CACHE_NAME / "matplotlib")
        try:
            from matplotlib.figure import Figure  # builds the font cache (matplotlib caches the dir it chose)
        except ImportError as exc:
            raise PlotUnavailable(
                f"reward curve skipped: matplotlib is not installed ({exc}); pip install 'verl-offpolicy[plot]' "
                "to get it"
            ) from None
        finally:
            if own_config:
                os.environ.pop("MPLCONFIGDIR", None)

    # A Figure of its own, not pyplot's global state: runs in threads (the tests' shared runs) may plot at once.
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    steps = [m["step"] for m in result_metrics if TRAIN_SCORE in m]
    ax.plot(
        steps, [m[TRAIN_SCORE] for m in result_metrics if TRAIN_SCORE in m], marker="o", label="train reward (sampled)"
    )
    if validation:
        val_steps = sorted(validation)
        ax.plot(val_steps, [validation[s] for s in val_steps], marker="s", label="validation reward (greedy)")
    ax.set_xlabel("training step")
    ax.set_ylabel("mean reward")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"verl-offpolicy CPU demo ({title})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return str(path)
