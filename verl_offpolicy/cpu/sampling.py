"""Sampling of the ``hf`` rollout: the next-token rule and the per-request seed (torch only).

- :func:`sample_next`: one token per row from ``softmax(logits / T)`` truncated to the top-k/top-p set,
  reporting what vLLM 0.30 reports for ``actor_rollout_ref.rollout.logprobs_mode``: under verl's default
  ``processed_logprobs`` the log-prob of the distribution sampled, renormalised over the kept set (without
  truncation, ``log_softmax(logits / T)``, the trainer's value); ``raw_logprobs`` at temperature 1 before the
  penalty and the truncation; the ``*_logits`` modes the logits themselves (:data:`LOGPROBS_MODES`). ``T == 0``
  is greedy, its processed values at T = 1, as vLLM's. One uniform per row from that row's generator.
- :func:`request_seed`: the seed of one request's generator, from the request's own seed and the
  weights version (or, without one, the run's seed, the replica and the prompt), so a sample does not
  depend on the other requests batched with it, on their arrival order, nor (seeded) on the replica.
- :class:`RequestSeeds`: a server's per-request seeds at the current weights version (counting the
  requests with a prompt since the last weight update).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

# vLLM 0.30's logprobs_mode values (vllm/config/model.py: LogprobsMode); null is vLLM's default, raw_logprobs.
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs", "processed_logits", "raw_logits")
VLLM_DEFAULT_LOGPROBS_MODE = "raw_logprobs"


@dataclass(frozen=True)
class SamplingKey:
    """Sampling parameters shared by one generation batch."""

    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    ignore_eos: bool


def sample_next(
    logits: torch.Tensor,
    key: SamplingKey,
    generators: torch.Generator | Sequence[torch.Generator],
    seen_tokens: Optional[torch.Tensor] = None,
    logprobs_mode: Optional[str] = "processed_logprobs",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the next token of each row of ``logits`` [B, V]; return (tokens [B], log-probs [B]).

    The value reported for the chosen token is vLLM's for ``logprobs_mode`` (None: vLLM's default,
    ``raw_logprobs``): ``processed_logprobs``, the log-prob under the distribution sampled, ``log_softmax`` of
    ``logits / T`` with the tokens outside the top-k/top-p set at −inf, i.e. renormalised over the kept set
    (log p_T(y) − log S, S the kept mass); ``processed_logits``, those logits; ``raw_logprobs`` /
    ``raw_logits``, ``log_softmax(logits)`` / ``logits`` before the repetition penalty, the temperature and the
    truncation. Greedy (``T <= 0``): the processed values are those of the penalised logits at T = 1. Computed in
    float32. Sampling inverts the CDF at one uniform per row drawn from that row's generator (``generators``: one
    per row, or one shared), so a request's tokens do not depend on the other requests batched with it.
    """
    mode = VLLM_DEFAULT_LOGPROBS_MODE if logprobs_mode is None else logprobs_mode
    if mode not in LOGPROBS_MODES:
        raise ValueError(
            f"actor_rollout_ref.rollout.logprobs_mode={logprobs_mode!r}; allowed values: {', '.join(LOGPROBS_MODES)}"
        )
    logits = raw = logits.float()
    if key.repetition_penalty != 1.0 and seen_tokens is not None:
        # Hugging Face/vLLM convention: divide positive, multiply negative logits of seen tokens.
        picked = logits.gather(1, seen_tokens)
        picked = torch.where(picked > 0, picked / key.repetition_penalty, picked * key.repetition_penalty)
        logits = logits.scatter(1, seen_tokens, picked)
    if key.temperature <= 0:
        tokens = logits.argmax(dim=-1)
        return tokens, _reported(mode, raw, logits, tokens)
    scaled = logits / key.temperature
    filtered = scaled
    vocab = scaled.shape[-1]
    if 0 < key.top_k < vocab:
        kth = torch.topk(filtered, key.top_k, dim=-1).values[:, -1:]
        filtered = filtered.masked_fill(filtered < kth, float("-inf"))
    if key.top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(filtered, dim=-1, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Drop a token when the mass before it already reaches top_p (the first token always stays).
        drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= key.top_p
        drop = torch.zeros_like(drop_sorted).scatter(1, sorted_idx, drop_sorted)
        filtered = filtered.masked_fill(drop, float("-inf"))
    probs = torch.softmax(filtered, dim=-1)
    rows = probs.shape[0]
    per_row = [generators] * rows if isinstance(generators, torch.Generator) else list(generators)
    uniform = 1.0 - torch.cat([torch.rand(1, generator=g) for g in per_row])  # in (0, 1]
    cdf = probs.cumsum(dim=-1)
    # First token whose CDF reaches u·total: never a zero-probability token, always < V.
    tokens = (cdf < (uniform * cdf[:, -1]).unsqueeze(1)).sum(dim=-1).clamp(max=probs.shape[-1] - 1)
    return tokens, _reported(mode, raw, filtered, tokens)


def _reported(mode: str, raw: torch.Tensor, processed: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The chosen tokens' values under ``mode``: of the raw logits or of the processed ones (after the penalty,
    the temperature and the truncation), as log-probs or as logits."""
    values = raw if mode.startswith("raw_") else processed
    if mode.endswith("_logprobs"):
        values = torch.log_softmax(values, dim=-1)
    return values.gather(1, tokens[:, None]).squeeze(1)


def request_seed(
    key: SamplingKey,
    config_seed: int,
    replica_rank: int,
    version: Optional[int],
    *,
    seed: Optional[int] = None,
    prompt_ids: Sequence[int] = (),
    occurrence: int = 0,
) -> int:
    """Seed of one request's sampler: blake2b of (seed, version) or (config seed, replica, version,
    occurrence, prompt); 0 when greedy.

    With a per-request ``seed`` (sampling_params["seed"], e.g. from ``seeded_single_turn_agent``) it is
    (seed, version), whichever replica serves the request, as vLLM's per-request seed: a run samples the
    same tokens on one replica or several (the load balancer's choice does not matter). Without one,
    the ``occurrence``-th request with a given prompt since the last weight update gets (config seed,
    replica, version, occurrence, prompt): reproducible whatever the arrival order, as long as a batch
    holds each prompt once (samples of one prompt are exchangeable); the replica keeps two replicas'
    counts from drawing the same samples.
    """
    if key.temperature <= 0:
        return 0  # greedy: no randomness, and validation does not shift the training samples' seeds
    if seed is not None:
        # the middle field once held the replica rank: kept at 0, so a one-replica run samples exactly as it
        # did (the results recorded in benchmarks/results/ stay reproducible)
        text = f"{int(seed)}|0|{version}"
    else:
        prompt = ",".join(map(str, prompt_ids))
        text = f"{int(config_seed)}|{replica_rank}|{version}|{occurrence}|{prompt}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


class RequestSeeds:
    """The seeds of one server's requests: :func:`request_seed` with the occurrence of each
    (sampling key, prompt) since the last weight update (:meth:`reset`).

    Args:
        config_seed: the rollout's ``seed``.
        replica_rank: the server's replica (part of every seed).
    """

    def __init__(self, config_seed: int, replica_rank: int):
        self.config_seed = config_seed
        self.replica_rank = replica_rank
        # (sampling key, prompt) -> requests seen since the last weight update
        self._occurrences: dict[tuple, int] = {}

    def next(
        self, key: SamplingKey, prompt_ids: Sequence[int], version: Optional[int], seed: Optional[int] = None
    ) -> int:
        """The seed of the next request with ``prompt_ids`` at weights ``version``; without a per-request
        ``seed`` and unless greedy, it counts as one more occurrence of its prompt."""
        occurrence = 0
        if seed is None and key.temperature > 0:
            counter_key = (key, tuple(prompt_ids))
            occurrence = self._occurrences.get(counter_key, 0)
            self._occurrences[counter_key] = occurrence + 1
        return request_seed(
            key, self.config_seed, self.replica_rank, version, seed=seed, prompt_ids=prompt_ids, occurrence=occurrence
        )

    def occurrences(self, key: SamplingKey, prompt_ids: Sequence[int]) -> int:
        """How many requests with ``prompt_ids`` and ``key`` were counted since the last :meth:`reset`."""
        return self._occurrences.get((key, tuple(prompt_ids)), 0)

    def reset(self) -> None:
        """New weights: every prompt's count starts again at 0."""
        self._occurrences = {}
