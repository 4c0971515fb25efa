"""The same weights and batch through a loss under verl's FSDP2 engine, its Megatron engine and a
plain-PyTorch reference (the engines in fresh CPU processes, one per engine:
``isolated("tests.scenario_megatron:<function>")``), and the Megatron engine's CUDA shims.

- :func:`reference_loss_and_grads` / :func:`engine_loss_and_grads`: the loss and gradient of the
  equivalence batch, in fp32 with transformers and through an engine's ``train_mini_batch``.
- :func:`megatron_update_without_shim` / :func:`megatron_shim_isolation`: what each shim is for, and
  that the shims touch only CPU processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

# Per response token: old_log_prob = reference log-prob − shift, i.e. ρ_t = e^shift. Inside the REC
# one-side band (|shift| ≤ 0.05) or clearly out of it (0.5-0.6), never near its edges 0.8/1.2, so
# that bfloat16 noise of the Megatron engine cannot move a token across the clip boundary.
EQUIVALENCE_SHIFTS = (0.05, -0.5, 0.6, 0.02, -0.03, 0.5)


def bf16_exact_tiny(workdir: str) -> dict[str, str]:
    """The tiny model with weights rounded to bfloat16 values (stored in fp32): verl's Megatron engine
    holds bf16 parameters, so both engines and the reference then start from identical weights."""
    import torch
    from transformers import LlamaForCausalLM

    from verl_offpolicy.demo.tiny import TinyModelSpec, build_tiny

    paths = build_tiny(Path(workdir) / "tiny_bf16", TinyModelSpec(seed=0))
    marker = Path(workdir) / "tiny_bf16" / "rounded"
    if not marker.exists():
        model = LlamaForCausalLM.from_pretrained(paths["model_path"], torch_dtype=torch.float32)
        with torch.no_grad():
            for param in model.parameters():
                param.copy_(param.to(torch.bfloat16).float())
        model.save_pretrained(paths["model_path"])
        marker.write_text("1")
    return paths


def equivalence_batch(tokenizer) -> dict[str, Any]:
    """Four responses of different lengths (so micro-batches of 2 hold 5 and 6 tokens) and advantages ±."""
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "repeat c"}], add_generation_prompt=True, tokenize=True
    )
    if hasattr(prompt, "keys"):
        prompt = prompt["input_ids"]
    words = [["c", "c", "</s>"], ["d", "</s>"], ["c", "</s>"], ["d", "d", "e", "</s>"]]
    return {
        "prompts": [list(prompt)] * 4,
        "responses": [tokenizer.convert_tokens_to_ids(w) for w in words],
        "advantages": [1.0, -1.0, 0.5, -0.5],
    }


def reference_loss_and_grads(model_path: str, tokenizer_path: str, case: dict[str, Any]) -> dict[str, Any]:
    """The loss of the whole batch as one micro-batch and its gradient, in fp32 with transformers' Llama.

    Log-probs from ``LlamaForCausalLM`` (left-padded prompt, right-padded response, as verl's trainer
    lays them out); the loss is the registered verl loss of ``case`` called once on the whole batch
    with ``global_batch_info`` of the whole batch (one rank, all tokens, all sequences): what the
    engines' micro-batch sums must add up to. Also returns the old log-probs the engines get.
    """
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from tests.actor_harness import padded_batch

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    model = LlamaForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
    spec = equivalence_batch(tokenizer)
    batch = padded_batch(tokenizer.pad_token_id, spec["prompts"], spec["responses"], spec["advantages"])
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).logits
    r_len = batch["responses"].shape[1]
    log_probs = torch.log_softmax(logits[:, -r_len - 1 : -1].float(), dim=-1)
    log_prob = log_probs.gather(-1, batch["responses"][..., None]).squeeze(-1)
    mask = batch["response_mask"].bool()
    old = _old_log_probs(log_prob.detach(), mask)

    loss = whole_batch_loss(
        model_path, tokenizer_path, case, log_prob=log_prob, old_log_prob=old, advantages=batch["advantages"], mask=mask
    )
    model.zero_grad()
    loss.backward()
    return {
        "loss": float(loss.detach()),
        "old_log_probs": old.tolist(),
        "advantages": batch["advantages"].tolist(),
        "response_mask": batch["response_mask"].tolist(),
        "grads": {name: p.grad.flatten().tolist() for name, p in model.named_parameters()},
    }


def whole_batch_loss(model_path, tokenizer_path, case, *, log_prob, old_log_prob, advantages, mask):
    """``case``'s registered verl loss on the whole batch as one micro-batch of one rank (the value an
    engine's micro-batch sums must reproduce): ``global_batch_info`` = (1 rank, all tokens, all sequences)."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.utils.config import omega_conf_to_dataclass

    cfg = compose_preset_actor(model_path, tokenizer_path, case, engine="fsdp")
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    actor.global_batch_info.update(
        {
            "dp_size": 1,
            "batch_num_tokens": int(mask.sum()),
            "global_batch_size": mask.shape[0],
            "loss_scale_factor": None,
        }
    )
    loss, _ = get_policy_loss_fn(actor.policy_loss.loss_mode)(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=mask.bool(),
        loss_agg_mode=actor.loss_agg_mode,
        config=actor,
        rollout_is_weights=None,
    )
    return loss


def _old_log_probs(log_prob, mask):
    import torch

    shifts = torch.tensor(EQUIVALENCE_SHIFTS, dtype=log_prob.dtype)
    flat = torch.arange(mask.numel()).reshape(mask.shape) % len(EQUIVALENCE_SHIFTS)
    return (log_prob - shifts[flat]) * mask


def compose_preset_actor(model_path: str, tokenizer_path: str, case: dict[str, Any], engine: str):
    """The config of ``case["preset"]`` (``+algorithm=``) on ``engine``'s stock config with our CPU overlay."""
    from tests.actor_harness import compose_cpu_config

    return compose_cpu_config(
        model_path, tokenizer_path, [f"+algorithm={case['preset']}", *case.get("overrides", [])], engine=engine
    )


def engine_loss_and_grads(
    workdir: str,
    engine: str,
    model_path: str,
    tokenizer_path: str,
    cases: list[dict[str, Any]],
    old_log_probs: dict[str, list],
) -> dict[str, Any]:
    """Per case: one real ``train_mini_batch`` of the equivalence batch on ``engine`` (two micro-batches
    of two), returning verl's ``actor/pg_loss`` metric and the HF-named gradient of that step."""
    import torch

    from tests.actor_harness import ActorHarness

    report = {}
    for case in cases:
        cfg = compose_preset_actor(model_path, tokenizer_path, case, engine)
        actor = cfg.actor_rollout_ref.actor
        harness = ActorHarness.create(
            Path(workdir) / f"{engine}_{case['name']}",
            loss_mode=actor.policy_loss.loss_mode,
            lr=1e-9,  # the step is not what is compared; the gradient before it is
            model_path=model_path,
            tokenizer_path=tokenizer_path,
            engine=engine,
            overrides=[
                f"+algorithm={case['preset']}",
                "actor_rollout_ref.actor.optim.clip_grad=1e9",
                *case.get("overrides", []),
            ],
        )
        harness.record_grads()
        spec = equivalence_batch(harness.tokenizer)
        batch = harness.make_batch(
            spec["prompts"],
            spec["responses"],
            spec["advantages"],
            old_log_probs=torch.tensor(old_log_probs[case["name"]]),
        )
        log_prob = harness.log_probs(batch)
        metrics = harness.update(batch, micro_batch_size=2)
        report[case["name"]] = {
            "loss": float(metrics["actor/pg_loss"]),
            "log_probs": log_prob.tolist(),
            "grads": {name: g.flatten().tolist() for name, g in harness.grads().items()},
        }
    return report


def megatron_update_without_shim(workdir: str, omit: Optional[str] = None) -> dict[str, Any]:
    """Build verl's Megatron engine (tiny model, ``+cpu=megatron``) with every CUDA shim except ``omit``
    and run one forward and one update; return ``{"ok": True}`` or the error and the site-packages
    file (relative) of the frame that raised it."""
    import traceback

    import verl_offpolicy.cpu.megatron as shims
    from tests.actor_harness import ActorHarness

    if omit is not None:
        del shims.SHIMS[omit]  # this fresh process only
    try:
        harness = ActorHarness.create(Path(workdir) / "megatron", loss_mode="vanilla", lr=1e-3, engine="megatron")
        tok = harness.tokenizer
        spec = equivalence_batch(tok)
        batch = harness.make_batch(spec["prompts"], spec["responses"], spec["advantages"])
        harness.update(batch, micro_batch_size=2)
    except Exception as exc:  # noqa: BLE001 - the failure is the result
        frames = traceback.extract_tb(exc.__traceback__)
        # the last frame of megatron-core, mbridge or verl (torch's own frames only re-raise)
        site = [f.filename.split("site-packages/")[1] for f in frames if "site-packages/" in f.filename]
        site = [name for name in site if not name.startswith("torch/")]
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "raised_in": site[-1] if site else None}
    return {"ok": True}


def megatron_shim_isolation() -> dict[str, Any]:
    """What our registration does to a process that imports verl's engines (every worker does, FSDP
    runs included) before any Megatron engine is built; run with and without ``VERL_PLATFORM=cpu``."""
    import sys

    import torch
    import verl.workers.engine  # noqa: F401 - imports verl's Megatron engine module, as every worker does
    from verl.workers.engine.megatron.transformer_impl import MegatronEngine

    from verl_offpolicy.glue.patching import is_patched

    facts = {
        "megatron_engine_imported": "verl.workers.engine.megatron.transformer_impl" in sys.modules,
        "shim_module_imported": "verl_offpolicy.cpu.megatron" in sys.modules,
        "engine_init_wrapped": is_patched(MegatronEngine.__init__),
        "tensor_cuda_remapped": is_patched(torch.Tensor.cuda),
    }
    return facts
