"""Per-token provenance (pure torch): the version of the weights that sampled each response token.

When a weight push may interrupt generation and the request resumes under the new weights (partial rollouts,
the scheduler spec), one response holds tokens of several versions. With ``versions[i, j]`` the version that
sampled token j of response i, ``mask`` its response mask, the batch trained at step t (the trainer's weights
at version t − 1) and scheduled at version v(t):

- token staleness σ_ij = (t − 1) − versions[i, j], the batch staleness of :mod:`.schedule` per token;
- the contract: v(t) ≤ versions[i, j] ≤ t − 1 for every response token (no token older than its batch's
  version, none newer than the weights that train it), so the schedule's staleness bound holds per token;
- a response spans versions when its tokens' versions are not all equal.

Tokens outside the mask (padding, a tool's reply) carry no version that matters and are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def token_staleness(versions: Tensor, trained_version: int) -> Tensor:
    """σ = (t − 1) − versions, per token (``trained_version`` = t − 1, the weights the step starts from)."""
    return trained_version - versions


@dataclass(frozen=True)
class TokenVersionStats:
    """What a batch's response tokens were sampled by (masked tokens only)."""

    tokens: int
    version_min: int
    version_max: int
    version_mean: float
    staleness_mean: float
    staleness_max: int
    spanning_fraction: float  # of the responses with a token, those whose tokens come from more than one version
    tokens_per_version: dict[int, int]


def token_version_stats(versions: Tensor, mask: Tensor, trained_version: int) -> TokenVersionStats | None:
    """The statistics of ``versions`` [batch, response length] over ``mask``; None when no token is in the mask
    (nothing to report, rather than NaN)."""
    keep = mask.bool()
    picked = versions[keep].long()
    if picked.numel() == 0:
        return None
    big = torch.iinfo(torch.long).max
    row_max = torch.where(keep, versions.long(), -big).amax(dim=-1)
    row_min = torch.where(keep, versions.long(), big).amin(dim=-1)
    has_tokens = keep.any(dim=-1)
    spanning = (row_max > row_min) & has_tokens
    values, counts = torch.unique(picked, return_counts=True)
    staleness = token_staleness(picked, trained_version)
    return TokenVersionStats(
        tokens=int(picked.numel()),
        version_min=int(picked.min()),
        version_max=int(picked.max()),
        version_mean=float(picked.double().mean()),
        staleness_mean=float(staleness.double().mean()),
        staleness_max=int(staleness.max()),
        spanning_fraction=float(spanning.sum()) / float(has_tokens.sum()),
        tokens_per_version={int(v): int(c) for v, c in zip(values.tolist(), counts.tolist(), strict=True)},
    )


def version_contract_violation(
    versions: Tensor, mask: Tensor, scheduled_version: int, trained_version: int
) -> str | None:
    """Why the batch breaks the contract v(t) ≤ versions ≤ t − 1 on a masked token (the first response and token
    position that does, and how many do), or None."""
    keep = mask.bool()
    for bad, what in (
        (keep & (versions < scheduled_version), f"older than the batch's scheduled version {scheduled_version}"),
        (keep & (versions > trained_version), f"newer than the trainer's weights (version {trained_version})"),
    ):
        if bad.any():
            row, col = (int(i) for i in bad.nonzero()[0])
            return (
                f"{int(bad.sum())} response token(s) sampled by a version {what}: the first is token {col} of "
                f"response {row}, version {int(versions[row, col])}"
            )
    return None
