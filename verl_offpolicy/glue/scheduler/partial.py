"""Partial rollouts (``algorithm.offpolicy.partial_rollout=true``, the overlapped mode): what the rollout client
records, and the per-token check of what it recorded.

A weight push does not wait for in-flight generation: verl's ``CheckpointEngineManager.update_weights`` aborts the
in-flight requests, loads the new weights and resumes generation, and verl's ``FullyAsyncLLMServerClient`` resends
each aborted request with the tokens generated so far, so the agent loop never sees the interruption.
:class:`VersionedClient` is that client, recording what each generation call returned: the weights version the
server reports (``extra_fields["global_steps"]``) and the number of tokens, one segment per call, in sampling order.
A trajectory's segments (every call of every turn) are one list, ``extra_fields[TOKEN_VERSIONS]``, stored by verl's
agent loop with the trajectory in TransferQueue. The list lives in the trajectory's asyncio task (verl runs each
trajectory in a task of its own), so the turns of one trajectory append to it and no two trajectories share one.
A server that keeps its own record of the weights each token was sampled by (the ``hf`` server,
``extra_fields[SAMPLED_VERSIONS]`` per call) has it collected the same way, in ``extra_fields[SAMPLED_VERSIONS]``.

:func:`check_token_versions` lays the segments onto the response mask
(:func:`~verl_offpolicy.core.token_versions.versions_from_segments`) and stops the run when a token's version is
one the rollout never held, older than its batch's scheduled version or newer than the trainer's weights, or,
where the server keeps its own record, another version than the server's record of the weights that sampled it.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any

import torch
from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient

from verl_offpolicy.core.token_versions import (
    TokenVersionStats,
    extend_segments,
    token_version_stats,
    version_contract_violation,
    versions_from_segments,
)
from verl_offpolicy.glue.scheduler.rollout import ObservedVersionError

# The trajectory's version segments in verl's extra_fields: [[version, tokens], ...] over the model's tokens.
TOKEN_VERSIONS = "offpolicy_token_versions"
# The server's own record, in the same form: per call from the server (the version of the weights in the model as
# each token was sampled, None while an update was partly loaded), per trajectory from the client.
SAMPLED_VERSIONS = "offpolicy_sampled_versions"
# In a trajectory's SAMPLED_VERSIONS: the tokens of a call the server kept no record of (verl's vLLM server keeps none).
UNRECORDED = "unrecorded"
# How the comparison lays the server's record onto the response (versions are >= 0).
_PARTLY_LOADED, _NO_RECORD = -1, -2

# The current trajectory's record (one asyncio task per trajectory: TOKEN_VERSIONS and SAMPLED_VERSIONS) and the
# current call's attempts.
_trajectory: contextvars.ContextVar[dict | None] = contextvars.ContextVar("offpolicy_trajectory", default=None)
_attempts: contextvars.ContextVar[list | None] = contextvars.ContextVar("offpolicy_attempts", default=None)


class _AttemptLog(LLMServerClient):
    """One server call (an attempt of verl's resume loop): appends (version, tokens, the server's own record) to the
    call's attempts."""

    async def generate(self, request_id, **kwargs):
        output = await super().generate(request_id, **kwargs)
        attempts = _attempts.get()
        if attempts is not None:
            fields = output.extra_fields
            attempts.append((fields.get("global_steps"), len(output.token_ids), fields.get(SAMPLED_VERSIONS)))
        return output


class VersionedClient(FullyAsyncLLMServerClient, _AttemptLog):
    """verl's resuming client (``FullyAsyncLLMServerClient``) whose every call records its version segments.

    The method resolution order puts :class:`_AttemptLog` between verl's resume loop and the base client, so each
    attempt the loop makes (the first, and one per interruption) is logged with the version that sampled it.
    """

    async def generate(self, request_id, **kwargs):
        token = _attempts.set([])
        try:
            output = await super().generate(request_id, **kwargs)
            attempts = _attempts.get()
        finally:
            _attempts.reset(token)
        record = _trajectory.get()
        if record is None:  # the trajectory's first call: its lists, kept by the agent loop's extra_fields
            record = {TOKEN_VERSIONS: [], SAMPLED_VERSIONS: []}
            _trajectory.set(record)
        for version, tokens, sampled in attempts:
            extend_segments(record[TOKEN_VERSIONS], version, tokens)
            if sampled is None:  # the server kept no record of this call: its tokens have none
                extend_segments(record[SAMPLED_VERSIONS], UNRECORDED, tokens)
            for sampled_version, sampled_tokens in sampled or ():
                extend_segments(record[SAMPLED_VERSIONS], sampled_version, sampled_tokens)
        output.extra_fields.update(record)
        return output


def check_token_versions(
    step: int,
    scheduled: int,
    held: set[int],
    extra_fields: list[Any],
    response_mask,
) -> tuple[TokenVersionStats | None, float | None, torch.Tensor]:
    """The per-token versions of step ``step``'s trajectories (their ``extra_fields`` and padded ``response_mask``),
    checked: every masked token was sampled by a version the rollout held (``held``, the versions pushed so far),
    no older than ``scheduled`` and no newer than the trainer's weights (version ``step - 1``), and is the version
    the server's own record names (:func:`check_server_record`). Returns their statistics, the fraction of tokens
    the server's record covers and the versions as laid out (:func:`token_versions`); raises
    :class:`~.rollout.ObservedVersionError` otherwise."""
    for i, fields in enumerate(extra_fields):
        row = fields.get(TOKEN_VERSIONS) if isinstance(fields, dict) else None
        if row is None:
            raise ObservedVersionError(
                f"offpolicy scheduler: trajectory {i} of step {step} carries no per-token versions "
                f"(extra_fields[{TOKEN_VERSIONS!r}]) with algorithm.offpolicy.partial_rollout=true: its agent loop "
                "dropped the extra_fields of the rollout client's output (verl's single-turn and tool agent loops "
                "keep them)"
            )
        unknown = sorted({v for v, _ in row if v not in held}, key=str)
        if unknown:
            raise ObservedVersionError(
                f"offpolicy scheduler: trajectory {i} of step {step} has tokens tagged with versions {unknown} "
                f"that the rollout never held (versions pushed so far: {sorted(held)}): weights and their version "
                "tags are out of step; stopping instead of training on it"
            )
    try:
        versions = token_versions(extra_fields, response_mask)
    except ValueError as exc:
        raise ObservedVersionError(f"offpolicy scheduler: step {step}: {exc}") from exc
    violation = version_contract_violation(versions, response_mask, scheduled, step - 1)
    if violation is not None:
        raise ObservedVersionError(
            f"offpolicy scheduler: step {step} trains a batch scheduled at version {scheduled} with weights of "
            f"version {step - 1}: {violation}; stopping instead of training on it"
        )
    recorded = check_server_record(step, extra_fields, response_mask, versions)
    return token_version_stats(versions, response_mask, step - 1), recorded, versions


def token_versions(extra_fields: list[Any], response_mask) -> torch.Tensor:
    """The client's record of each token's version laid onto ``response_mask`` (−1 outside it); ``ValueError`` for
    a row whose segments cover fewer tokens than its mask."""
    segments = [[(int(v), int(n)) for v, n in fields[TOKEN_VERSIONS]] for fields in extra_fields]
    return versions_from_segments(segments, response_mask, fill=-1)


@dataclass(frozen=True)
class CheckedVersions:
    """A step's per-token versions as its check laid them out (:func:`token_versions`, −1 outside the response
    mask), one row per TransferQueue key: the step's later reads of the same trajectories take them from here."""

    step: int
    keys: list[str]
    versions: torch.Tensor  # [len(keys), T]

    def rows(self, keys: list[str], width: int | None = None) -> torch.Tensor | None:
        """The rows of ``keys``, in that order, ``width`` columns wide (−1 past a row's layout; default: as laid
        out); None when one of the keys was not checked."""
        index = {key: i for i, key in enumerate(self.keys)}
        if any(key not in index for key in keys):
            return None
        rows = self.versions[[index[key] for key in keys]]
        if width is None or width == rows.shape[-1]:
            return rows
        out = torch.full((rows.shape[0], width), -1, dtype=rows.dtype)
        kept = min(width, rows.shape[-1])
        out[:, :kept] = rows[:, :kept]
        return out


def check_server_record(step: int, extra_fields: list[Any], response_mask, versions) -> float | None:
    """Compare ``versions`` (the client's record, laid onto ``response_mask``) with the server's own record of the
    weights that sampled each token, in the trajectories that have one (``extra_fields[SAMPLED_VERSIONS]``). Returns
    the fraction of masked tokens compared (None when no server kept a record); raises
    :class:`~.rollout.ObservedVersionError` at the first token whose versions differ."""
    rows = [fields.get(SAMPLED_VERSIONS) if isinstance(fields, dict) else None for fields in extra_fields]
    compared = [row is not None and any(v != UNRECORDED for v, _ in row) for row in rows]
    if not any(compared):
        return None
    codes = {None: _PARTLY_LOADED, UNRECORDED: _NO_RECORD}
    segments = [[(codes.get(v, v), int(n)) for v, n in row] if use else [] for row, use in zip(rows, compared)]
    mask = response_mask.bool() & torch.tensor(compared)[:, None]
    try:
        sampled = versions_from_segments(segments, mask, fill=0)
    except ValueError as exc:
        raise ObservedVersionError(f"offpolicy scheduler: step {step}, the server's record: {exc}") from exc
    differ = mask & (sampled != versions)
    if differ.any():
        row, col = (int(i) for i in differ.nonzero()[0])
        server = {_PARTLY_LOADED: "weights only partly loaded", _NO_RECORD: "no record"}.get(
            int(sampled[row, col]), f"version {int(sampled[row, col])}"
        )
        raise ObservedVersionError(
            f"offpolicy scheduler: step {step}: {int(differ.sum())} response token(s) whose recorded version is not "
            f"the server's record of the weights that sampled them: the first is token {col} of response {row}, "
            f"recorded as version {int(versions[row, col])}, sampled with {server}; stopping instead of training on it"
        )
    return float(mask.sum()) / max(1.0, float(response_mask.bool().sum()))
