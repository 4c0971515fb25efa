"""The partial-rollout audit: what it takes to recompute every trained token's log-prob at its own version.

A hook for tests and debugging, off unless ``VERL_OFFPOLICY_AUDIT_DIR`` is set in the run's environment. Then:

- the CPU weight transport's rank 0 (:mod:`verl_offpolicy.cpu.checkpoint_engine`) saves the weights it sends as
  version v, ``weights_v{v}.pt`` (``{HF name: full tensor}``: the trainer's weights of that version);
- the overlapped trainer with partial rollouts saves each trained batch, ``batch_step{t}.pt``: per row
  ``input_ids`` (the prompt, then the response) and ``responses``; padded on the right, ``response_mask``,
  ``rollout_log_probs``, ``old_log_probs`` and ``token_versions`` (each response token's version, −1 outside the
  mask).

A token of version v then has its rollout log-prob compared with a forward pass of ``weights_v{v}.pt`` over its
sequence (the e2e test in ``tests/scheduler/test_partial_rollout.py``): the trainer's own weights of the version
that sampled it, not only the fresh tokens the trainer compares on every step.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

AUDIT_DIR_ENV = "VERL_OFFPOLICY_AUDIT_DIR"
BATCH_FIELDS = ("input_ids", "responses", "response_mask", "rollout_log_probs")
ROWS = ("input_ids", "responses")  # kept per row (their lengths differ), the rest padded on the right


def audit_dir() -> Path | None:
    """The audit's folder (created), or None when the hook is off."""
    folder = os.environ.get(AUDIT_DIR_ENV)
    if not folder:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    return Path(folder)


def weights_path(folder: Path, version: int) -> Path:
    return Path(folder) / f"weights_v{version}.pt"


def batch_path(folder: Path, step: int) -> Path:
    return Path(folder) / f"batch_step{step}.pt"


def batch_payload(data, padded, versions) -> dict:
    """What :func:`batch_path` holds: the rows of :data:`ROWS` from ``data`` (TransferQueue's jagged fields), the
    rest from ``padded``, and ``versions``."""
    rows = {name: [row.clone() for row in data[name].unbind(0)] for name in ROWS}
    return {**{k: v for k, v in padded.items() if k not in ROWS}, **rows, "token_versions": versions}


def save(path: Path, payload: dict) -> None:
    """Write ``payload`` atomically (a reader never sees half a file)."""
    partial = path.with_suffix(".tmp")
    torch.save(payload, partial)
    partial.replace(path)
