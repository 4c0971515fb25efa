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

The rollout reports a response's versions as segments ``[(version, tokens), ...]``, one per generation call
(a call ends at a turn's end or at a push that interrupted it), in the order the model's tokens were sampled;
:func:`versions_from_segments` lays them onto the masked positions of the response.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def extend_segments(segments: list[list], version, tokens: int) -> None:
    """Append ``tokens`` tokens sampled by ``version`` to ``segments`` (in place), merged into the last segment when
    it has the same version; nothing for no token."""
    if tokens == 0:
        return
    if segments and segments[-1][0] == version:
        segments[-1][1] += tokens
    else:
        segments.append([version, tokens])


def versions_from_segments(segments: list[list[tuple[int, int]]], mask: Tensor, fill: int) -> Tensor:
    """``versions`` [batch, response length]: row i's masked positions, in order, take the versions of its segments
    expanded (version v repeated over its token count), the rest ``fill``. A response truncated to the response
    length keeps the first masked tokens' versions; a row whose segments hold fewer tokens than its mask is an
    error (a token without a version)."""
    keep = mask.bool()
    counts = keep.sum(dim=-1).tolist()
    rows = []
    for i, (row, needed) in enumerate(zip(segments, counts, strict=True)):
        values = torch.tensor([int(v) for v, _ in row], dtype=torch.long)
        repeats = torch.tensor([int(n) for _, n in row], dtype=torch.long)
        expanded = torch.repeat_interleave(values, repeats)
        if expanded.numel() < needed:
            raise ValueError(
                f"response {i} has {needed} response-mask tokens but its version segments {row} cover "
                f"{expanded.numel()}: a token without a recorded version"
            )
        rows.append(expanded[:needed])
    versions = torch.full(mask.shape, fill, dtype=torch.long)
    versions[keep] = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)
    return versions


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
