"""The ``hf`` rollout's generation server: transformers generation on the CPU, one Ray actor per replica.

:class:`HFRolloutServer` has the contract of vLLM's server in verl (``verl.workers.rollout.vllm_rollout
.vllm_async_server``): token-in/token-out ``generate`` returning a ``TokenOutput`` (log-probs, stop
reason and the weights' ``global_steps``), the life-cycle methods verl calls (``wake_up``, ``sleep``,
``abort_all_requests``, ``resume_generation``, ...) and the weight-loading calls of the adapter
(``update_weights_chunk``, ``finish_weight_update``). Concurrent requests with identical sampling
parameters are batched (left padding, KV cache). Sampling and seeding: :mod:`.sampling`.

- A request's ``sampling_params["priority"]`` (an integer, default 0; lower runs first, vLLM's
  ``scheduling_policy=priority`` convention) orders generation: each generation batch takes only the
  pending requests of the lowest priority, so with the overlapped scheduler's priority = the step a batch
  is trained at, B_t is generated (and usable) before B_t+1 starts. verl forwards its own ``priority``
  argument to vLLM only; the CPU agent loop (:mod:`.agent_loop`) passes it here in ``sampling_params``.

- ``engine_kwargs.hf.continuous_batching`` (default false): vLLM's continuous batching instead. A request that
  arrives while a batch generates joins it at the next step (the running requests are preempted and prefilled
  again with their tokens so far, vLLM's recompute preemption; each keeps its own sampler, so its samples do not
  change), and a batch takes up to ``max_num_seqs`` pending requests of one sampling key, lowest priority first:
  the priority orders admission only, as in vLLM. A request is returned as soon as it ends, not with its batch's
  longest, and a short request no longer waits for the longest one of an earlier batch (the long-tailed workload,
  where partial rollouts resume a trajectory beside the next version's batches). The CPU path's ordered agent loops
  do not order then (:func:`verl_offpolicy.cpu.agent_loop.hold_turn`).

- ``max_tokens`` (or ``max_new_tokens``) caps the response; otherwise the default is vLLM's
  ``min(response_length, prompt_length + response_length - len(prompt))``. EOS stops a response
  (and is included in it) unless ``ignore_eos``; so does a token of ``stop_token_ids`` (vLLM's meaning: verl's
  tool agent loop stops a turn at its tool parser's call token), whatever ``ignore_eos``.

- Its own record of which weights sampled each token: as each token is sampled, the server notes the version of
  the weights in the model (``global_steps`` of the last complete update; ``None`` while an update is only partly
  loaded), and returns the record, run-length encoded, in ``extra_fields[SAMPLED_VERSIONS]``. The client's
  per-token versions (partial rollouts, :mod:`verl_offpolicy.glue.scheduler.partial`) are checked against it.

- ``engine_kwargs.hf.token_latency_s`` (default 0): each generation step of a batch takes at least that long (the
  server sleeps, holding no core, for what the step's compute did not use): the per-token time of a model larger
  than the CPU path's, so that a long response costs its length on the CPU too (the long-tailed workload,
  ``demo --model tiny-long``). An abort still lands between two steps.

The server talks over Ray only and listens on no port. The replica that launches it and the adapter
that feeds it weights are in :mod:`.rollout`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.replica import RolloutMode, TokenOutput

from verl_offpolicy.core.token_versions import extend_segments
from verl_offpolicy.cpu.hf_options import HFRolloutError, continuous_batching, hf_engine_kwargs, token_latency
from verl_offpolicy.cpu.platform import require_cpu_platform
from verl_offpolicy.cpu.sampling import RequestSeeds, SamplingKey, sample_next
from verl_offpolicy.glue.registration import HF_ROLLOUT
from verl_offpolicy.glue.scheduler.partial import SAMPLED_VERSIONS

logger = logging.getLogger("verl_offpolicy.cpu.hf_server")
logger.setLevel(os.getenv("VERL_OFFPOLICY_LOGGING_LEVEL", "INFO"))

# Seconds the server waits for concurrent requests to arrive before starting a batch.
DEFAULT_BATCH_WINDOW_S = 0.005


def server_actor_name(replica_rank: int, node_rank: int = 0, suffix: str = "") -> str:
    return f"{HF_ROLLOUT}_server_{replica_rank}_{node_rank}{suffix}"


def check_rollout_parallelism(config) -> None:
    """The hf backend runs one process per replica: tp = dp = pp = 1."""
    bad = {
        key: getattr(config, key)
        for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size")
        if getattr(config, key) != 1
    }
    if bad:
        settings = ", ".join(f"actor_rollout_ref.rollout.{key}={value}" for key, value in bad.items())
        raise HFRolloutError(
            f"rollout name={HF_ROLLOUT} runs one CPU process per replica and needs tensor/data/pipeline "
            f"parallel size 1, got {settings}; set actor_rollout_ref.rollout.tensor_model_parallel_size=1"
        )
    disaggregation = getattr(config, "disaggregation", None)
    if disaggregation is not None and getattr(disaggregation, "enabled", False):
        raise HFRolloutError(
            f"rollout name={HF_ROLLOUT} does not support prefill/decode disaggregation; "
            "set actor_rollout_ref.rollout.disaggregation.enabled=false"
        )


@dataclass
class _Request:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    key: SamplingKey
    want_log_probs: bool
    future: asyncio.Future
    sample_seed: int = 0
    priority: int = 0  # lower runs first (vLLM's scheduling_policy=priority convention)
    stop_ids: frozenset[int] = frozenset()  # sampling_params["stop_token_ids"]: stop after one (included)
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    sampled_versions: list[list] = field(default_factory=list)  # [[version, tokens], ...] as sampled
    stop_reason: str = "completed"
    arrived_s: float = field(default_factory=time.perf_counter)
    generator: Optional[torch.Generator] = None  # its sampler, kept across preemptions (continuous batching)
    preempted: bool = False  # stopped to let pending requests join; generates again with its tokens so far

    def append(self, token: int, log_prob: float, version: int | None) -> None:
        """One sampled token, with the version of the weights that sampled it."""
        self.token_ids.append(token)
        self.log_probs.append(log_prob)
        extend_segments(self.sampled_versions, version, 1)

    def context(self) -> list[int]:
        """The tokens a generation batch prefills: the prompt and the tokens sampled so far."""
        return self.prompt_ids + self.token_ids

    def sampler(self) -> torch.Generator:
        if self.generator is None:
            self.generator = torch.Generator().manual_seed(self.sample_seed)
        return self.generator


def _lowest_priority(pending: list[_Request]) -> tuple[list[_Request], list[_Request]]:
    """(the pending requests of the lowest priority value, in arrival order; the others, in arrival order)."""
    first = min(request.priority for request in pending)
    return [r for r in pending if r.priority == first], [r for r in pending if r.priority != first]


def _admit(pending: list[_Request], max_num_seqs: int) -> tuple[list[_Request], list[_Request]]:
    """Continuous batching: (one batch, the rest in arrival order). The batch holds up to ``max_num_seqs`` pending
    requests of the sampling key of the lowest-priority request, lowest priority first, then in arrival order."""
    key = min(pending, key=lambda r: r.priority).key
    same = sorted((r for r in pending if r.key == key), key=lambda r: r.priority)[:max_num_seqs]
    chosen = {id(r) for r in same}
    return same, [r for r in pending if id(r) not in chosen]


class HFRolloutServer:
    """Token-in/token-out generation server (one Ray actor per replica) with transformers on the CPU.

    Args:
        config: RolloutConfig (dataclass or DictConfig).
        model_config: the ``actor_rollout_ref.model`` DictConfig (converted to ``HFModelConfig``).
        rollout_mode: RolloutMode of the replica.
        replica_rank: replica index (seeds the sampler together with ``config.seed``).
        node_rank: node index inside the replica (always 0: one process per replica).
    """

    def __init__(self, config, model_config, rollout_mode: RolloutMode, replica_rank: int, node_rank: int = 0):
        require_cpu_platform(f"rollout name={HF_ROLLOUT}")
        self.config: RolloutConfig = omega_conf_to_dataclass(config)
        check_rollout_parallelism(self.config)
        self.model_config: HFModelConfig = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.rollout_mode = rollout_mode
        self.replica_rank = replica_rank
        self.node_rank = node_rank
        engine_kwargs = hf_engine_kwargs(self.config)
        self.batch_window_s = float(engine_kwargs.get("batch_window_s", DEFAULT_BATCH_WINDOW_S))
        self.token_latency_s = token_latency(engine_kwargs)
        self.continuous_batching = continuous_batching(engine_kwargs)
        self.max_num_seqs = max(1, int(self.config.max_num_seqs or 1))
        num_threads = int(engine_kwargs.get("num_threads", 0) or 0) or (os.cpu_count() or 1)
        torch.set_num_threads(num_threads)

        self.model = self._build_model()
        self._params_by_name = dict(self.model.state_dict(keep_vars=True))
        self._unique_params = {id(p): name for name, p in self.model.named_parameters()}
        self._received: set[int] = set()
        self._unknown: list[str] = []

        hf_config = self.model_config.hf_config
        self.pad_token_id = self._first_id(hf_config.pad_token_id, self.model_config.tokenizer, "pad_token_id")
        if self.pad_token_id is None:
            self.pad_token_id = 0
        eos = set()
        for source in (
            getattr(self.model_config.generation_config, "eos_token_id", None),
            hf_config.eos_token_id,
            getattr(self.model_config.tokenizer, "eos_token_id", None),
        ):
            if source is None:
                continue
            eos.update(source if isinstance(source, list | tuple) else [source])
        self.eos_token_ids = eos
        self.max_model_len = self.config.max_model_len or (self.config.prompt_length + self.config.response_length)
        max_positions = getattr(hf_config, "max_position_embeddings", None)
        if max_positions:
            self.max_model_len = min(self.max_model_len, max_positions)

        self.global_steps = None
        self._loading = False  # an update's first chunk is in the model, its finish_weight_update not yet done
        # Each request's own sampler seed: the config seed, the replica, the weights version and the
        # prompt's occurrence since the last weight update (or the request's own seed).
        self.request_seeds = RequestSeeds(self.config.seed, replica_rank)
        self._pending: list[_Request] = []
        self._wake: Optional[asyncio.Event] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._batch_task: Optional[asyncio.Task] = None
        self._engine_lock: Optional[asyncio.Lock] = None
        self._resume_event: Optional[asyncio.Event] = None
        self._paused = False
        self._rejecting = False
        self._abort_running = False
        self._running: list[_Request] = []
        self._sleeping = False
        self._warned_sleeping = False
        # busy_s: seconds spent generating (the trainer's rollout busy fraction in overlapped mode)
        self.stats = {"requests": 0, "batches": 0, "tokens": 0, "weight_updates": 0, "busy_s": 0.0, "preemptions": 0}
        logger.info(
            "hf rollout server %d ready: model %s (%s), %d threads, max_model_len %d, %s",
            replica_rank,
            self.model_config.local_path,
            self.model.dtype,
            num_threads,
            self.max_model_len,
            f"continuous batching (max_num_seqs {self.max_num_seqs})" if self.continuous_batching else "by priority",
        )

    @staticmethod
    def _first_id(value, tokenizer, attr):
        if value is not None:
            return value
        return getattr(tokenizer, attr, None) if tokenizer is not None else None

    def _build_model(self):
        from transformers import AutoModelForCausalLM
        from verl.utils.torch_dtypes import PrecisionType

        dtype = PrecisionType.to_dtype(self.config.dtype)
        hf_config = self.model_config.hf_config
        kwargs = {"attn_implementation": "sdpa", "torch_dtype": dtype}
        if self.config.load_format == "dummy":
            # Like vLLM's dummy load: the trainer's first weight sync sets the real weights.
            model = AutoModelForCausalLM.from_config(hf_config, **kwargs)
        else:
            model = AutoModelForCausalLM.from_pretrained(self.model_config.local_path, config=hf_config, **kwargs)
        model.to(dtype)
        model.eval()
        model.requires_grad_(False)
        return model

    def _ensure_loop_state(self) -> None:
        if self._wake is None:
            self._loop = asyncio.get_running_loop()
            self._wake = asyncio.Event()
            self._engine_lock = asyncio.Lock()
            self._resume_event = asyncio.Event()
            self._resume_event.set()
        if self._batch_task is None or self._batch_task.done():
            self._batch_task = asyncio.get_running_loop().create_task(self._batch_loop())

    async def ready(self) -> dict[str, Any]:
        """Called by the replica after launch; returns a summary."""
        self._ensure_loop_state()
        return {"replica_rank": self.replica_rank, "pid": os.getpid(), "dtype": str(self.model.dtype)}

    # ------------------------------------------------------------------ generation

    def _max_tokens(self, prompt_len: int, sampling_params: dict[str, Any]) -> int:
        max_possible = self.max_model_len - prompt_len
        if max_possible < 1:
            raise ValueError(
                f"Prompt length ({prompt_len}) leaves no room to generate within the model's maximum context "
                f"length ({self.max_model_len}); raise actor_rollout_ref.rollout.max_model_len or shorten prompts"
            )
        if "max_tokens" in sampling_params:
            max_tokens = sampling_params["max_tokens"]
        elif "max_new_tokens" in sampling_params:
            max_tokens = sampling_params["max_new_tokens"]
        else:
            max_tokens = min(
                self.config.response_length,
                self.config.prompt_length + self.config.response_length - prompt_len,
            )
        return max(1, min(int(max_tokens), max_possible))

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Optional[list[Any]] = None,
        video_data: Optional[list[Any]] = None,
        **kwargs: Any,
    ) -> TokenOutput:
        if image_data is not None or video_data is not None or kwargs.get("audio_data") is not None:
            raise HFRolloutError(f"rollout name={HF_ROLLOUT} is text-only; multimodal inputs are not supported")
        self._ensure_loop_state()
        prompt_ids = [int(t) for t in prompt_ids]
        if self._sleeping and not self._warned_sleeping:
            self._warned_sleeping = True
            logger.warning("hf rollout server %d got a request while asleep (weights may be stale)", self.replica_rank)
        if self._paused and self._rejecting:
            return TokenOutput(
                token_ids=[],
                log_probs=None,
                stop_reason="aborted",
                extra_fields={**self._extra(), SAMPLED_VERSIONS: []},
            )
        params = dict(sampling_params)
        temperature = float(params.get("temperature", self.config.temperature))
        top_k = params.get("top_k", self.config.top_k)
        key = SamplingKey(
            temperature=temperature,
            top_p=float(params.get("top_p", self.config.top_p)),
            top_k=int(top_k) if top_k is not None else -1,
            repetition_penalty=float(params.get("repetition_penalty", 1.0) or 1.0),
            ignore_eos=bool(params.get("ignore_eos", self.config.ignore_eos)),
        )
        request = _Request(
            request_id=request_id,
            prompt_ids=prompt_ids,
            max_tokens=self._max_tokens(len(prompt_ids), params),
            key=key,
            want_log_probs=bool(params.get("logprobs", False)),
            future=asyncio.get_running_loop().create_future(),
            sample_seed=self.request_seeds.next(key, prompt_ids, self.global_steps, params.get("seed")),
            priority=int(params.get("priority", 0) or 0),
            stop_ids=frozenset(int(t) for t in params.get("stop_token_ids") or ()),
        )
        self.stats["requests"] += 1
        self._pending.append(request)
        self._wake.set()
        return await request.future

    def _extra(self) -> dict[str, Any]:
        return {"global_steps": self.global_steps}

    def _finish(self, request: _Request) -> None:
        if request.future.done():
            return
        request.future.set_result(
            TokenOutput(
                token_ids=request.token_ids,
                log_probs=request.log_probs if request.want_log_probs else None,
                stop_reason=request.stop_reason,
                extra_fields={**self._extra(), SAMPLED_VERSIONS: request.sampled_versions},
            )
        )

    async def _batch_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self.batch_window_s > 0:
                await asyncio.sleep(self.batch_window_s)
            while self._pending:
                await self._resume_event.wait()
                if not self._pending:  # rejected while paused
                    break
                if self.continuous_batching:
                    requests, self._pending = _admit(self._pending, self.max_num_seqs)
                else:
                    requests, self._pending = _lowest_priority(self._pending)
                groups: dict[SamplingKey, list[_Request]] = {}
                for request in requests:
                    groups.setdefault(request.key, []).append(request)
                for group in groups.values():
                    await self._resume_event.wait()  # an abort between two groups holds the next one too
                    async with self._engine_lock:
                        self._running = group
                        try:
                            started = time.perf_counter()
                            try:
                                await asyncio.to_thread(self._generate_batch, group)
                            finally:
                                self.stats["busy_s"] += time.perf_counter() - started
                        except Exception as exc:
                            logger.exception("hf rollout server %d: generation failed", self.replica_rank)
                            for request in group:
                                if not request.future.done():
                                    request.future.set_exception(exc)
                        finally:
                            self._running = []
                    preempted = [request for request in group if request.preempted]
                    for request in group:
                        if request.preempted:
                            request.preempted = False
                        else:
                            self._finish(request)
                    self._pending[:0] = preempted  # before the requests that joined: they arrived earlier

    def _join_wanted(self, key: SamplingKey, running: int) -> bool:
        """Continuous batching: a pending request of ``key`` has waited a batch window and the batch has room."""
        if not self.continuous_batching or running >= self.max_num_seqs:
            return False
        now = time.perf_counter()
        return any(r.key == key and now - r.arrived_s >= self.batch_window_s for r in list(self._pending))

    @torch.no_grad()
    def _generate_batch(self, requests: list[_Request]) -> None:
        """Generate for requests sharing one SamplingKey (runs in a worker thread)."""
        from transformers import DynamicCache

        key = requests[0].key
        self.stats["batches"] += 1
        generators = [request.sampler() for request in requests]
        contexts = [request.context() for request in requests]
        batch = len(requests)
        width = max(len(context) for context in contexts)
        input_ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((batch, width), dtype=torch.long)
        for i, context in enumerate(contexts):
            n = len(context)
            input_ids[i, width - n :] = torch.tensor(context, dtype=torch.long)
            attention_mask[i, width - n :] = 1
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        seen = input_ids.clone() if key.repetition_penalty != 1.0 else None
        cache = DynamicCache()
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        logits = out.logits[:, -1, :]
        position = position_ids[:, -1:]
        active = [True] * batch
        max_steps = max(r.max_tokens - len(r.token_ids) for r in requests)
        step_started = time.perf_counter()
        for _ in range(max_steps):
            tokens, log_probs = sample_next(logits, key, generators, seen, self.config.logprobs_mode)
            token_list, log_prob_list = tokens.tolist(), log_probs.tolist()
            self.stats["tokens"] += sum(active)
            version = None if self._loading else self.global_steps  # the weights that sampled this token
            for i, request in enumerate(requests):
                if not active[i]:
                    continue
                request.append(token_list[i], log_prob_list[i], version)
                token = token_list[i]
                if (
                    (not key.ignore_eos and token in self.eos_token_ids)
                    or token in request.stop_ids
                    or len(request.token_ids) >= request.max_tokens
                ):
                    active[i] = False
                    if self.continuous_batching:  # returned at once, not when the batch's longest ends
                        self._loop.call_soon_threadsafe(self._finish, request)
            if not any(active):
                break
            if self._abort_running:
                for i, request in enumerate(requests):
                    if active[i]:
                        request.stop_reason = "aborted"
                break
            if self._join_wanted(key, sum(active)):  # continuous batching: the running requests go back pending
                for i, request in enumerate(requests):
                    request.preempted = active[i]
                self.stats["preemptions"] += 1
                break
            if self.token_latency_s > 0:  # a larger model's step time (module docstring)
                time.sleep(max(0.0, self.token_latency_s - (time.perf_counter() - step_started)))
                step_started = time.perf_counter()
            if seen is not None:
                seen = torch.cat([seen, tokens[:, None]], dim=1)
            attention_mask = torch.cat([attention_mask, torch.ones((batch, 1), dtype=torch.long)], dim=1)
            position = position + 1
            out = self.model(
                input_ids=tokens[:, None],
                attention_mask=attention_mask,
                position_ids=position,
                past_key_values=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1, :]

    # ------------------------------------------------------------------ weights

    async def update_weights_chunk(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        """Copy one bucket of (HF name, full tensor) into the model. Returns the number of tensors."""
        self._ensure_loop_state()
        async with self._engine_lock:
            self._loading = True
            for name, tensor in named_tensors:
                target = self._params_by_name.get(name)
                if target is None:
                    self._unknown.append(name)
                    continue
                if tuple(target.shape) != tuple(tensor.shape):
                    raise HFRolloutError(
                        f"weight {name}: trainer sent shape {tuple(tensor.shape)}, rollout model has "
                        f"{tuple(target.shape)}; the rollout and actor models differ"
                    )
                with torch.no_grad():
                    target.data.copy_(tensor.to(dtype=target.dtype))
                self._received.add(id(target))
        return len(named_tensors)

    async def finish_weight_update(self, global_steps: Optional[int] = None) -> dict[str, Any]:
        """Check that every parameter was received, then tag the weights with ``global_steps``."""
        self._ensure_loop_state()
        async with self._engine_lock:
            missing = [name for pid, name in self._unique_params.items() if pid not in self._received]
            unknown, self._unknown = self._unknown, []
            self._received = set()
            if unknown:
                raise HFRolloutError(
                    f"weight update sent names the rollout model does not have: {unknown[:5]}"
                    f"{' ...' if len(unknown) > 5 else ''}; the rollout and actor models differ"
                )
            if missing:
                raise HFRolloutError(
                    f"weight update did not cover {len(missing)} parameters, e.g. {missing[:5]}; "
                    "the rollout would mix old and new weights"
                )
            self.global_steps = global_steps
            self._loading = False
            self.request_seeds.reset()
            self.stats["weight_updates"] += 1
        return {"global_steps": global_steps}

    async def set_global_steps(self, global_steps: int):
        self.global_steps = global_steps

    async def get_state_dict(self) -> dict[str, torch.Tensor]:
        """A copy of the current weights (tests and debugging)."""
        return {name: p.detach().clone() for name, p in self.model.state_dict().items()}

    async def get_stats(self) -> dict[str, Any]:
        return {**self.stats, "global_steps": self.global_steps, "sleeping": self._sleeping}

    # ------------------------------------------------------------------ life cycle

    async def wake_up(self, tags: Optional[list[str]] = None):
        self._sleeping = False

    async def sleep(self):
        """Weights stay in memory on the CPU; sleeping only waits for in-flight generation."""
        self._ensure_loop_state()
        async with self._engine_lock:
            self._sleeping = True

    async def clear_kv_cache(self):
        return None  # the KV cache lives only for the duration of a batch

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None

    async def wait_for_requests_to_drain(self):
        self._ensure_loop_state()
        while self._pending and not self._paused:
            await asyncio.sleep(0.01)
        async with self._engine_lock:
            return None

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        """Stop in-flight generation (partial responses end with stop_reason="aborted") and hold new ones.

        Requests that arrive before :meth:`resume_generation` wait, or come back aborted and empty
        when ``reject_request`` is set (as vLLM's server does).
        """
        self._ensure_loop_state()
        self._paused = True
        self._rejecting = reject_request
        self._resume_event.clear()
        request_ids = [r.request_id for r in self._running] + [r.request_id for r in self._pending]
        self._abort_running = True
        try:
            async with self._engine_lock:
                pass
        finally:
            self._abort_running = False
        # a preempted request (continuous batching) holds tokens of these weights: it ends aborted as a running one
        started = [r for r in self._pending if r.token_ids]
        self._pending = [r for r in self._pending if not r.token_ids]
        for request in started:
            request.stop_reason = "aborted"
            self._finish(request)
        if reject_request:
            pending, self._pending = self._pending, []
            for request in pending:
                request.stop_reason = "aborted"
                self._finish(request)
        return {"aborted_count": len(request_ids), "request_ids": request_ids}

    async def resume_generation(self):
        self._ensure_loop_state()
        self._paused = False
        self._rejecting = False
        self._resume_event.set()
        self._wake.set()

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict[str, Any]:
        for request in list(self._pending):
            if request.request_id == request_id:
                self._pending.remove(request)
                request.stop_reason = "aborted"
                self._finish(request)
                return {"aborted": True, "request_id": request_id}
        return {"aborted": False, "request_id": request_id, "error": f"Request {request_id} not pending"}

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None
