"""The ``hf`` rollout's options (``actor_rollout_ref.rollout.engine_kwargs.hf``), read and checked.

Imports nothing heavy: the CPU path's agent loops read these options in every process that registers them, GPU
processes included, which must not import the server (:mod:`.hf_server`).
"""

from __future__ import annotations

import math
from typing import Any

from verl_offpolicy.glue.registration import HF_ROLLOUT

TOKEN_LATENCY_KEY = "token_latency_s"  # actor_rollout_ref.rollout.engine_kwargs.hf.<this>
CONTINUOUS_BATCHING_KEY = "continuous_batching"  # actor_rollout_ref.rollout.engine_kwargs.hf.<this>


class HFRolloutError(RuntimeError):
    """A misuse of the hf rollout backend; the message says what to change."""


def hf_engine_kwargs(rollout_config) -> dict[str, Any]:
    """The rollout config's ``engine_kwargs.hf`` (a dataclass or DictConfig rollout config) as a dict, {} when unset."""
    return dict((rollout_config.engine_kwargs or {}).get(HF_ROLLOUT, None) or {})


def token_latency(engine_kwargs: dict[str, Any]) -> float:
    """``engine_kwargs.hf.token_latency_s`` (seconds >= 0, default 0), or an ``HFRolloutError`` naming the key."""
    value = engine_kwargs.get(TOKEN_LATENCY_KEY, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0 <= value < math.inf):
        raise HFRolloutError(
            f"actor_rollout_ref.rollout.engine_kwargs.{HF_ROLLOUT}.{TOKEN_LATENCY_KEY}={value!r}: must be a number "
            "of seconds >= 0 (each generation step takes at least that long; 0: no latency)"
        )
    return float(value)


def continuous_batching(engine_kwargs: dict[str, Any]) -> bool:
    """``engine_kwargs.hf.continuous_batching`` (a boolean, default false), or an ``HFRolloutError`` naming the key."""
    value = engine_kwargs.get(CONTINUOUS_BATCHING_KEY, False)
    if not isinstance(value, bool):
        raise HFRolloutError(
            f"actor_rollout_ref.rollout.engine_kwargs.{HF_ROLLOUT}.{CONTINUOUS_BATCHING_KEY}={value!r}: must be true "
            "(a request joins the running batch, vLLM's continuous batching) or false (one priority's batch at a time)"
        )
    return value
