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

:func:`check_token_versions` lays the segments onto the response mask
(:func:`~verl_offpolicy.core.token_versions.versions_from_segments`) and stops the run when a token's version is
one the rollout never held, older than its batch's scheduled version or newer than the trainer's weights.
"""

from __future__ import annotations

import contextvars
from typing import Any

from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient

from verl_offpolicy.core.token_versions import (
    TokenVersionStats,
    token_version_stats,
    version_contract_violation,
    versions_from_segments,
)
from verl_offpolicy.glue.scheduler.rollout import ObservedVersionError

# The trajectory's version segments in verl's extra_fields: [[version, tokens], ...] over the model's tokens.
TOKEN_VERSIONS = "offpolicy_token_versions"

# The current trajectory's segments (one asyncio task per trajectory) and the current call's attempts.
_trajectory: contextvars.ContextVar[list | None] = contextvars.ContextVar("offpolicy_trajectory", default=None)
_attempts: contextvars.ContextVar[list | None] = contextvars.ContextVar("offpolicy_attempts", default=None)


class _AttemptLog(LLMServerClient):
    """One server call (an attempt of verl's resume loop): appends (version, tokens) to the call's attempts."""

    async def generate(self, request_id, **kwargs):
        output = await super().generate(request_id, **kwargs)
        attempts = _attempts.get()
        if attempts is not None:
            attempts.append([output.extra_fields.get("global_steps"), len(output.token_ids)])
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
        segments = _trajectory.get()
        if segments is None:  # the trajectory's first call: its list, kept by the agent loop's extra_fields
            segments = []
            _trajectory.set(segments)
        for version, tokens in attempts:
            if tokens == 0:
                continue
            if segments and segments[-1][0] == version:
                segments[-1][1] += tokens
            else:
                segments.append([version, tokens])
        output.extra_fields[TOKEN_VERSIONS] = segments
        return output


def check_token_versions(
    step: int,
    scheduled: int,
    held: set[int],
    extra_fields: list[Any],
    response_mask,
) -> TokenVersionStats | None:
    """The per-token versions of step ``step``'s trajectories (their ``extra_fields`` and padded ``response_mask``),
    checked: every masked token was sampled by a version the rollout held (``held``, the versions pushed so far),
    no older than ``scheduled`` and no newer than the trainer's weights (version ``step - 1``). Returns their
    statistics; raises :class:`~.rollout.ObservedVersionError` otherwise."""
    segments = []
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
        segments.append([(int(v), int(n)) for v, n in row])
    try:
        versions = versions_from_segments(segments, response_mask, fill=scheduled)
    except ValueError as exc:
        raise ObservedVersionError(f"offpolicy scheduler: step {step}: {exc}") from exc
    violation = version_contract_violation(versions, response_mask, scheduled, step - 1)
    if violation is not None:
        raise ObservedVersionError(
            f"offpolicy scheduler: step {step} trains a batch scheduled at version {scheduled} with weights of "
            f"version {step - 1}: {violation}; stopping instead of training on it"
        )
    return token_version_stats(versions, response_mask, step - 1)
