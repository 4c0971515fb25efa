"""One training step of the real SmolLM2-135M-Instruct through stock ``main_ppo`` on the CPU.

verl's whole pipeline (Ray, TransferQueue, FSDP2 worker, agent loop, reward loop, the ``hf`` rollout
with its weight sync) on the arithmetic task, through ``run_demo(model="smollm2-135m")``. Several
minutes (start-up ~85 s, a step 60-80 s on 2 idle cores, ~12 GB): marked ``real_model``, which the
default test command deselects (pyproject ``addopts``); run it with
``python -m pytest tests -m real_model``.

Checks, each against something computed independently of the run:
- the prompts the rollout saw are the chat template applied by the tokenizer (verl's data path):
  token counts equal ``apply_chat_template``'s, and those ids carry ``<|im_start|>``/``<|im_end|>``;
- every sampled response's reward equals math-verify's score of it (the recipes' reward module);
- the weights changed by one Adam step: with bias correction the first step moves each weight by
  ``lr·|g|/(|g|+eps)``, so the largest change is the learning rate (1e-5), to float32 rounding;
- rollout and trainer probabilities of the sampled tokens agree after the sync (verl's metric).
"""

import json

import pandas as pd
import pytest

from verl_offpolicy.demo.run import run_demo

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.real_model]

LR = 1e-5  # the smollm2-135m demo setting (verl_offpolicy.demo.models)


@pytest.mark.timeout(3600)
def test_one_real_model_step_through_main_ppo(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from verl_offpolicy.demo.smollm2 import prepare_smollm2
    from verl_offpolicy.rewards.math_verify_reward import compute_score

    out = tmp_path / "run"
    result = run_demo(
        model="smollm2-135m",
        preset="grpo",
        steps=1,
        seed=0,
        output_dir=str(out),
        timeout=3000,
        overrides=[
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            f"actor_rollout_ref.actor.optim.lr={LR}",
            "trainer.save_freq=1",
            "actor_rollout_ref.actor.checkpoint.save_contents=[hf_model]",
            f"trainer.rollout_data_dir={out / 'rollouts'}",
        ],
    )
    (m,) = result.metrics

    # The prompts: the tokenizer's chat template, as verl's data path applies it.
    folder = prepare_smollm2()
    tok = AutoTokenizer.from_pretrained(folder)
    rows = pd.read_parquet(out / "data" / "train.parquet")
    templated = {}
    for prompt in rows["prompt"]:
        messages = [dict(msg) for msg in prompt]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
            "input_ids"
        ]
        templated[tok.decode(ids, skip_special_tokens=True)] = ids
    dumped = [json.loads(line) for line in (out / "rollouts" / "1.jsonl").read_text().splitlines()]
    assert len(dumped) == 16  # 4 prompts x 4 samples
    lengths = []
    for d in dumped:
        ids = templated[d["input"]]  # KeyError: the rollout's prompt is not the templated prompt
        # system, example question, example answer, question: 4 closed turns, and the open assistant turn
        assert (
            ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 5
            and ids.count(tok.convert_tokens_to_ids("<|im_end|>")) == 4
        )
        lengths.append(len(ids))
    assert m["prompt_length/max"] == max(lengths) and m["prompt_length/min"] == min(lengths)

    # The rewards: math-verify on the last \boxed{} of each response.
    for d in dumped:
        assert d["score"] == compute_score("verl_offpolicy/arithmetic", d["output"], d["gts"]), d
    assert m["critic/score/mean"] == pytest.approx(sum(d["score"] for d in dumped) / len(dumped))

    # The weights: one Adam step of size lr on the largest-moving weights.
    before = load_file(str(folder / "model.safetensors"))
    after = load_file(str(out / "checkpoints" / "global_step_1" / "actor" / "huggingface" / "model.safetensors"))
    common = sorted(set(before) & set(after))
    assert len(common) >= 270  # 30 layers x 9 tensors + embeddings + final norm
    largest = max(float((after[k].float() - before[k].float()).abs().max()) for k in common)
    assert largest == pytest.approx(LR, rel=0.02), largest

    # Rollout vs trainer after the sync: verl's own debug metric on the sampled tokens.
    assert m["training/rollout_probs_diff_valid"] == 1
    assert m["training/rollout_probs_diff_max"] < 1e-3
