"""Scenarios of the hf rollout server, run in a fresh ``VERL_PLATFORM=cpu`` process
(``isolated("tests.scenario_rollout:<function>")``); their results are JSON.

- :func:`rollout_server_semantics`: generation of the server against an independent transformers pass.
- :func:`rollout_vs_trainer_after_sync`: a real weight sync, then rollout vs trainer log-probs.
- :func:`rollout_priority_order`: requests of several priorities sent together are generated one
  priority after the other, lowest first, with the samples they get when batched together.
- :func:`rollout_continuous_batching`: with ``engine_kwargs.hf.continuous_batching``, short requests sent while a
  long one generates join it and finish first, every request with the samples it gets alone.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any, Sequence

from tests.actor_harness import ActorHarness
from verl_offpolicy.cpu.platform import CPU_ENV


def in_process_server(model_path: str, tokenizer_path: str, overrides: Sequence[str] = ()):
    from verl.workers.rollout.replica import RolloutMode

    from tests.actor_harness import compose_cpu_config
    from verl_offpolicy.cpu.hf_server import HFRolloutServer

    cfg = compose_cpu_config(model_path, tokenizer_path, overrides)
    server = HFRolloutServer(
        config=cfg.actor_rollout_ref.rollout,
        model_config=cfg.actor_rollout_ref.model,
        rollout_mode=RolloutMode.HYBRID,
        replica_rank=0,
    )
    return server, cfg


def rollout_server_semantics(workdir: str) -> dict[str, Any]:
    """Greedy/sampled generation of the hf server against an independent transformers forward pass."""
    import torch
    from transformers import AutoModelForCausalLM

    from verl_offpolicy.demo.tiny import build_tiny
    from verl_offpolicy.glue.scheduler.partial import SAMPLED_VERSIONS

    paths = build_tiny(Path(workdir) / "tiny")
    server, cfg = in_process_server(paths["model_path"], paths["tokenizer_path"])
    tok = server.model_config.tokenizer
    reference = AutoModelForCausalLM.from_pretrained(paths["model_path"], attn_implementation="sdpa").eval()

    def prompt(text: str) -> list[int]:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    prompts = [prompt("repeat c"), prompt("repeat a b"), prompt("repeat")]

    def teacher_forced(prompt_ids: list[int], response: list[int], temperature: float) -> list[float]:
        ids = torch.tensor([prompt_ids + response])
        with torch.no_grad():
            logits = reference(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
        scale = temperature if temperature > 0 else 1.0
        lp = torch.log_softmax(logits / scale, dim=-1)
        return lp.gather(1, torch.tensor(response)[:, None]).squeeze(1).tolist()

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        greedy = {"temperature": 0, "top_p": 1.0, "top_k": -1, "logprobs": True}
        # Concurrent requests (batched by the server, different prompt lengths = left padding) ...
        batched = await asyncio.gather(
            *[server.generate(p, dict(greedy, max_tokens=6), request_id=f"g{i}") for i, p in enumerate(prompts)]
        )
        # ... equal one-at-a-time requests.
        single = [
            await server.generate(p, dict(greedy, max_tokens=6), request_id=f"s{i}") for i, p in enumerate(prompts)
        ]
        out["batched_equals_single"] = [b.token_ids for b in batched] == [s.token_ids for s in single]
        # Greedy = argmax of the reference model, step by step.
        greedy_ok = True
        for p, o in zip(prompts, single, strict=True):
            ids = list(p)
            for t in o.token_ids:
                with torch.no_grad():
                    nxt = int(reference(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
                greedy_ok &= nxt == t
                ids.append(t)
        out["greedy_is_argmax"] = greedy_ok
        out["max_tokens_respected"] = all(len(o.token_ids) <= 6 for o in single)
        out["stop_reasons"] = sorted({o.stop_reason for o in single})
        out["global_steps"] = single[0].extra_fields.get("global_steps")
        # The server's own record of the weights that sampled each token: (record, tokens) per output.
        out["sampled_at_start"] = (single[0].extra_fields[SAMPLED_VERSIONS], len(single[0].token_ids))
        # Sampled log-probs = log_softmax(logits / T) of the reference, for T = 0.7 and 1.0.
        diffs = {}
        for temperature in (0.7, 1.0):
            params = {"temperature": temperature, "top_p": 1.0, "top_k": -1, "logprobs": True, "max_tokens": 8}
            samples = await asyncio.gather(
                *[server.generate(p, dict(params), request_id=f"t{temperature}-{i}") for i, p in enumerate(prompts * 4)]
            )
            worst = 0.0
            for p, s in zip(prompts * 4, samples, strict=True):
                ref = teacher_forced(p, s.token_ids, temperature)
                worst = max(worst, max(abs(a - b) for a, b in zip(ref, s.log_probs, strict=True)))
            diffs[str(temperature)] = worst
        out["sampled_logprob_max_diff"] = diffs
        # top_k=1 is greedy whatever the temperature; logprobs=False returns None.
        topk1 = await server.generate(prompts[0], {"temperature": 1.5, "top_k": 1, "max_tokens": 6}, request_id="k1")
        out["top_k1_is_greedy"] = topk1.token_ids == single[0].token_ids
        out["no_logprobs_when_not_asked"] = topk1.log_probs is None
        # stop_token_ids (vLLM's meaning): the same seeded sample, cut after the first stop token (included).
        sampled = {"temperature": 1.0, "ignore_eos": True, "max_tokens": 12, "seed": 5}
        whole = await server.generate(prompts[0], dict(sampled), request_id="whole")
        stop = whole.token_ids[3]
        cut = await server.generate(prompts[0], dict(sampled, stop_token_ids=[stop]), request_id="cut")
        out["stops_at_stop_token"] = (cut.token_ids, whole.token_ids[: whole.token_ids.index(stop) + 1])
        # A weight update that misses parameters is refused; a full one tags global_steps.
        state = {k: v.clone() for k, v in reference.state_dict().items()}
        await server.update_weights_chunk(list(state.items()))  # the same weights, complete: version 3
        await server.finish_weight_update(global_steps=3)
        await server.update_weights_chunk(list(state.items())[:3])
        try:
            await server.finish_weight_update(global_steps=7)
            out["partial_update_refused"] = False
        except RuntimeError as exc:
            out["partial_update_refused"] = "did not cover" in str(exc)
        mixed = await server.generate(prompts[0], dict(greedy, max_tokens=6), request_id="mixed")
        out["sampled_partly_loaded"] = (mixed.extra_fields[SAMPLED_VERSIONS], len(mixed.token_ids))
        for name in state:
            state[name] = state[name] * 0.5
        await server.update_weights_chunk(list(state.items()))
        await server.finish_weight_update(global_steps=7)
        after = await server.generate(prompts[0], dict(greedy, max_tokens=6), request_id="after")
        out["global_steps_after_update"] = after.extra_fields.get("global_steps")
        out["sampled_after_update"] = (after.extra_fields[SAMPLED_VERSIONS], len(after.token_ids))
        new_ref = AutoModelForCausalLM.from_pretrained(paths["model_path"], attn_implementation="sdpa").eval()
        new_ref.load_state_dict(state)
        ids = list(prompts[0])
        ok = True
        for t in after.token_ids:
            with torch.no_grad():
                ok &= int(new_ref(input_ids=torch.tensor([ids])).logits[0, -1].argmax()) == t
            ids.append(t)
        out["generation_uses_new_weights"] = ok
        # Abort: a parked request comes back aborted and empty when rejecting.
        await server.abort_all_requests(reject_request=True)
        rejected = await server.generate(prompts[0], dict(greedy), request_id="rej")
        out["rejected_while_paused"] = rejected.stop_reason == "aborted" and rejected.token_ids == []
        out["sampled_rejected"] = rejected.extra_fields[SAMPLED_VERSIONS]
        await server.resume_generation()
        resumed = await server.generate(prompts[0], dict(greedy, max_tokens=6), request_id="res")
        out["serves_after_resume"] = resumed.token_ids == after.token_ids
        # engine_kwargs.hf.token_latency_s: a sleep after every generation step but the last, of what the step's
        # compute left of the latency; the same sample as without it.
        import verl_offpolicy.cpu.hf_server as hf_server

        slow, _ = in_process_server(
            paths["model_path"],
            paths["tokenizer_path"],
            ["actor_rollout_ref.rollout.engine_kwargs.hf.token_latency_s=0.01"],
        )
        sleeps, real_sleep = [], hf_server.time.sleep
        hf_server.time.sleep = lambda seconds: (sleeps.append(seconds), real_sleep(seconds))
        try:
            sampled = {"temperature": 1.0, "ignore_eos": True, "max_tokens": 5, "seed": 5}
            slow_out = await slow.generate(prompts[0], dict(sampled), request_id="slow")
        finally:
            hf_server.time.sleep = real_sleep
        plain, _ = in_process_server(paths["model_path"], paths["tokenizer_path"])  # the same start, no latency
        fast_out = await plain.generate(prompts[0], dict(sampled), request_id="fast")
        out["token_latency"] = {"sleeps": sleeps, "same_sample": slow_out.token_ids == fast_out.token_ids}
        return out

    return asyncio.run(run())


def rollout_vs_trainer_after_sync(workdir: str, temperature: float = 0.7, num_prompts: int = 8) -> dict[str, Any]:
    """Real weight sync (trainer engine -> adapter -> Ray server), then compare log-probs.

    The trainer (FSDP2 TrainingWorker) is updated once so its weights differ from the checkpoint the
    rollout server loaded; the adapter streams ``engine.get_per_tensor_param()`` to the server as
    verl's colocated ``update_weights(mode="naive")`` does; the server samples responses with
    log-probs at ``temperature``; the trainer recomputes log-probs of the same tokens.
    """
    import ray
    import torch
    from verl.workers.rollout.replica import RolloutMode

    from verl_offpolicy.cpu.hf_server import HFRolloutServer, server_actor_name
    from verl_offpolicy.cpu.rollout import HFServerAdapter

    harness = ActorHarness.create(workdir, lr=5e-2, overrides=[f"actor_rollout_ref.rollout.temperature={temperature}"])
    tok = harness.tokenizer
    symbols = list("abcdefgh")[:num_prompts]
    prompts = []
    for s in symbols:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": f"repeat {s}"}], add_generation_prompt=True, tokenize=True
        )
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    # Move the trainer away from the checkpoint: one vanilla update.
    targets = [tok.convert_tokens_to_ids([s] * 3 + ["</s>"]) for s in symbols]
    harness.update(harness.make_batch(prompts, targets, [1.0] * len(prompts)))

    cfg = harness.config
    temp_dir = tempfile.mkdtemp(prefix="vo-ray-", dir="/tmp")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _temp_dir=temp_dir,
        runtime_env={"env_vars": dict(CPU_ENV)},
        log_to_driver=False,
    )
    try:
        server = (
            ray.remote(HFRolloutServer)
            .options(name=server_actor_name(0), num_cpus=0)
            .remote(
                config=cfg.actor_rollout_ref.rollout,
                model_config=cfg.actor_rollout_ref.model,
                rollout_mode=RolloutMode.HYBRID,
                replica_rank=0,
            )
        )
        ray.get(server.ready.remote(), timeout=120)
        params = {"temperature": temperature, "top_p": 1.0, "top_k": -1, "logprobs": True, "max_tokens": 8}

        def sample(tag: str):
            refs = [server.generate.remote(p, dict(params), request_id=f"{tag}{i}") for i, p in enumerate(prompts * 2)]
            return ray.get(refs, timeout=120)

        def max_diff(outputs) -> float:
            batch = harness.make_batch(prompts * 2, [o.token_ids for o in outputs], [0.0] * len(outputs))
            trainer_lp = harness.log_probs(batch)
            worst = 0.0
            for i, o in enumerate(outputs):
                rollout_lp = torch.tensor(o.log_probs)
                worst = max(worst, float((trainer_lp[i, : len(o.log_probs)] - rollout_lp).abs().max()))
            return worst

        before = max_diff(sample("before"))
        adapter = HFServerAdapter(
            config=cfg.actor_rollout_ref.rollout, model_config=cfg.actor_rollout_ref.model, device_mesh=None
        )
        per_tensor, _ = harness.worker.engine.get_per_tensor_param()
        asyncio.run(adapter.update_weights(per_tensor, global_steps=1))
        outputs = sample("after")
        after = max_diff(outputs)
        return {
            "max_abs_logprob_diff_before_sync": before,
            "max_abs_logprob_diff_after_sync": after,
            "global_steps": outputs[0].extra_fields.get("global_steps"),
            "tokens_compared": sum(len(o.token_ids) for o in outputs),
            "temperature": temperature,
        }
    finally:
        ray.shutdown()
        import shutil

        shutil.rmtree(temp_dir, ignore_errors=True)


def rollout_priority_order(workdir: str, groups: int = 3, per_group: int = 8) -> dict[str, Any]:
    """``groups`` priorities of ``per_group`` sampled requests each, sent interleaved and at once (what the
    overlapped scheduler's streamed batches look like at the server): the order in which they complete,
    the server's generation batches, and the tokens, against the same requests without priorities."""
    from verl_offpolicy.demo.tiny import build_tiny

    paths = build_tiny(Path(workdir) / "tiny")
    server, _ = in_process_server(paths["model_path"], paths["tokenizer_path"])
    tok = server.model_config.tokenizer
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "repeat a b"}], add_generation_prompt=True, tokenize=True
    )
    prompt = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    # interleaved: priority groups, groups - 1, ..., 1, then again (the last group is sent first)
    requests = [(groups - (i % groups), i) for i in range(groups * per_group)]

    async def send(with_priority: bool) -> tuple[list[int], dict[int, list[int]], int]:
        done: list[int] = []
        before = server.stats["batches"]

        async def one(priority: int, seed: int):
            params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 8, "seed": seed}
            if with_priority:
                params["priority"] = priority
            out = await server.generate(prompt, params, request_id=f"r{seed}")
            done.append(priority)
            return seed, out.token_ids

        outs = await asyncio.gather(*[one(p, seed) for p, seed in requests])
        return done, dict(outs), server.stats["batches"] - before

    async def run() -> dict[str, Any]:
        order, tokens, batches = await send(with_priority=True)
        _, unprioritised, unprioritised_batches = await send(with_priority=False)
        return {
            "completion_order": order,
            "batches": batches,
            "same_samples": tokens == unprioritised,
            "unprioritised_batches": unprioritised_batches,
        }

    return asyncio.run(run())


def rollout_batching_cost(
    workdir: str, batches: int = 4, per_batch: int = 128, repeats: int = 3, num_threads: int = 1
) -> dict[str, Any]:
    """What streaming costs the hf rollout: the same ``batches x per_batch`` sampled requests (8-token
    responses, the demo's prompt sizes, ``num_threads`` as the overlapped mode's rollout) generated as one
    server batch (no priorities: a version's batches in one call) and as ``batches`` server batches (priority
    = batch: streamed). Seconds per round, the fastest of ``repeats`` rounds of each, alternated."""
    import time

    from verl_offpolicy.demo.tiny import build_tiny

    paths = build_tiny(Path(workdir) / "tiny")
    server, _ = in_process_server(
        paths["model_path"],
        paths["tokenizer_path"],
        [f"actor_rollout_ref.rollout.engine_kwargs.hf.num_threads={num_threads}"],
    )
    tok = server.model_config.tokenizer
    words = ["a", "b", "c", "d", "a b", "c d", "a b c", "b c d"]
    prompts = []
    for text in words:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": f"repeat {text}"}], add_generation_prompt=True, tokenize=True
        )
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))

    async def round_(streamed: bool) -> float:
        start = time.perf_counter()
        calls = []
        for i in range(batches * per_batch):
            params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 8, "ignore_eos": True, "seed": i}
            if streamed:
                params["priority"] = 1 + i // per_batch
            calls.append(server.generate(prompts[i % len(prompts)], params, request_id=f"r{i}"))
        await asyncio.gather(*calls)
        return time.perf_counter() - start

    async def run() -> dict[str, Any]:
        times: dict[str, list[float]] = {"one_batch": [], "streamed": []}
        await round_(False)  # warm-up
        for _ in range(repeats):
            times["one_batch"].append(await round_(False))
            times["streamed"].append(await round_(True))
        return {
            "batches": batches,
            "per_batch": per_batch,
            "num_threads": num_threads,
            "server_batches": server.stats["batches"],
            "one_batch_s": min(times["one_batch"]),
            "streamed_s": min(times["streamed"]),
            "all": times,
        }

    return asyncio.run(run())


def rollout_continuous_batching(workdir: str, continuous: bool = True) -> dict[str, Any]:
    """A long request (priority 1, 40 tokens, 10 ms per generation step), then, once it has sampled 5 tokens, four
    short ones (priority 2, 4 tokens): the order in which they complete, the server's preemptions, and every
    request's tokens and log-probs against the same request sent alone. Then the abort of a preempted request."""
    import time

    from verl_offpolicy.cpu.hf_server import _Request
    from verl_offpolicy.demo.tiny import build_tiny

    paths = build_tiny(Path(workdir) / "tiny")
    server, _ = in_process_server(
        paths["model_path"],
        paths["tokenizer_path"],
        [
            f"actor_rollout_ref.rollout.engine_kwargs.hf.continuous_batching={str(continuous).lower()}",
            "actor_rollout_ref.rollout.engine_kwargs.hf.token_latency_s=0.01",
            "actor_rollout_ref.rollout.max_model_len=64",
        ],
    )
    tok = server.model_config.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": "repeat a"}], add_generation_prompt=True, tokenize=True)
    prompt = list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def params(seed: int, priority: int, max_tokens: int) -> dict[str, Any]:
        return {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": max_tokens, "ignore_eos": True,
                "seed": seed, "priority": priority, "logprobs": True}  # fmt: skip

    async def alone(seed: int, priority: int, max_tokens: int):
        out = await server.generate(prompt, params(seed, priority, max_tokens), request_id=f"alone{seed}")
        return out.token_ids, out.log_probs

    async def run() -> dict[str, Any]:
        reference = {0: await alone(0, 1, 40), **{seed: await alone(seed, 2, 4) for seed in range(1, 5)}}
        preemptions = server.stats["preemptions"]
        done: list[int] = []

        async def one(seed: int, priority: int, max_tokens: int):
            out = await server.generate(prompt, params(seed, priority, max_tokens), request_id=f"r{seed}")
            done.append(seed)
            return seed, (out.token_ids, out.log_probs)

        long = asyncio.ensure_future(one(0, 1, 40))
        while not (server._running and len(server._running[0].token_ids) >= 5):
            await asyncio.sleep(0.002)
        key = server._running[0].key
        shorts = [asyncio.ensure_future(one(seed, 2, 4)) for seed in range(1, 5)]
        outs = dict(await asyncio.gather(long, *shorts))
        gap = max(
            abs(a - b)
            for seed, (tokens, log_probs) in outs.items()
            for a, b in zip(log_probs, reference[seed][1], strict=True)
        )
        # a preempted request waiting for its next batch holds tokens of the weights loaded now: an abort ends it
        loop = asyncio.get_running_loop()
        waiting = _Request("preempted", prompt, 8, key, True, loop.create_future(), token_ids=[5, 6],
                           log_probs=[-1.0, -2.0])  # fmt: skip
        fresh = _Request("fresh", prompt, 8, key, True, loop.create_future())
        server._pending.extend([waiting, fresh])
        await server.abort_all_requests()
        aborted = waiting.future.result() if waiting.future.done() else None
        still_pending = [r.request_id for r in server._pending]
        server._pending.clear()
        await server.resume_generation()
        return {
            "completion_order": done,
            "preemptions": server.stats["preemptions"] - preemptions,
            "same_tokens": {str(seed): outs[seed][0] == reference[seed][0] for seed in outs},
            "lengths": {str(seed): len(outs[seed][0]) for seed in outs},
            "log_prob_gap": gap,
            "aborted_preempted": None if aborted is None else [aborted.stop_reason, aborted.token_ids],
            "still_pending": still_pending,
        }

    started = time.perf_counter()
    report = asyncio.run(run())
    report["seconds"] = time.perf_counter() - started
    return report
