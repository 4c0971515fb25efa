"""OPMD's τ under Adam: does ℓ = −A·log π/(1+τ) train differently for different τ?

The 1/(1+τ) factor scales the whole loss, hence every gradient, by a constant. Adam's update
m̂/(√v̂ + ε) is invariant to a constant gradient scale up to ε, so τ should be inert under Adam
(and only a learning-rate change under SGD). Measured here: one small policy (a 2-layer MLP over a
vocabulary of 16, responses of 8 tokens) trained for 50 steps on the same seeded batches (32
prompts × 4 responses, toy reward, the registered ``opmd`` estimator and loss with a real
:class:`verl.workers.config.ActorConfig`) once per τ, with Adam (PyTorch's default ε = 1e-8, and
ε = 1e-16) and with SGD; reported is the largest absolute difference of any weight from the τ = 0 run
after the 50 steps, next to how far the τ = 0 run moved.

    python benchmarks/opmd_tau_adam.py       # a few seconds on one CPU core

Writes ``benchmarks/results/opmd_tau_adam.md`` (the table and this command).
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import torch
import verl  # noqa: F401  (loads the verl.plugins entry point: registers our names)
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn
from verl.workers.config import ActorConfig

from verl_offpolicy.glue.config import OffPolicyLossConfig

RESULTS = Path(__file__).parent / "results" / "opmd_tau_adam.md"
COMMAND = "python benchmarks/opmd_tau_adam.py"

SEED = 0
STEPS = 50
PROMPTS, RESPONSES, LENGTH, VOCAB, HIDDEN = 32, 4, 8, 16, 32
TAUS = (0.0, 1.0, 4.0)
OPTIMIZERS = {
    "Adam (lr 1e-3, eps 1e-8)": lambda params: torch.optim.Adam(params, lr=1e-3, eps=1e-8),
    "Adam (lr 1e-3, eps 1e-16)": lambda params: torch.optim.Adam(params, lr=1e-3, eps=1e-16),
    "SGD (lr 1e-1)": lambda params: torch.optim.SGD(params, lr=1e-1),
}


def make_policy() -> torch.nn.Module:
    """Logits of token t from (prompt embedding, position embedding); the same initial weights every run."""
    torch.manual_seed(SEED)
    # float64, so that rounding noise in gradients (which Adam would blow up to lr-sized steps on weights whose
    # true gradient is ~0) stays far below ε and the runs differ only through τ
    return torch.nn.ModuleDict(
        {
            "prompt": torch.nn.Embedding(PROMPTS, HIDDEN),
            "position": torch.nn.Embedding(LENGTH, HIDDEN),
            "mlp": torch.nn.Sequential(
                torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, VOCAB)
            ),
        }
    ).double()


def log_probs(policy, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
    """log π(y_t | prompt, t) [B, T]."""
    hidden = policy["prompt"](prompts).unsqueeze(1) + policy["position"](torch.arange(LENGTH)).unsqueeze(0)
    logits = policy["mlp"](hidden)
    return torch.log_softmax(logits, -1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)


def batches() -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """STEPS fixed batches (prompt ids, responses, rewards): reward = fraction of tokens equal to the prompt id
    mod V."""
    generator = torch.Generator().manual_seed(SEED)
    out = []
    for _ in range(STEPS):
        prompts = torch.arange(PROMPTS).repeat_interleave(RESPONSES)
        responses = torch.randint(VOCAB, (PROMPTS * RESPONSES, LENGTH), generator=generator)
        rewards = (responses == (prompts % VOCAB).unsqueeze(-1)).double().mean(-1)
        out.append((prompts, responses, rewards))
    return out


def advantages(prompts: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """The registered ``opmd`` estimator (mean baseline) on the sequence rewards, [B, T]."""
    token_rewards = torch.zeros(len(rewards), LENGTH, dtype=torch.float64)
    token_rewards[:, -1] = rewards
    config = OmegaConf.create({"adv_estimator": "opmd", "offpolicy": {"baseline": "mean"}})
    adv, _ = get_adv_estimator_fn("opmd")(
        token_level_rewards=token_rewards,
        response_mask=torch.ones_like(token_rewards),
        index=prompts.numpy(),
        config=config,
    )
    return adv


def train(tau: float, make_optimizer, data) -> torch.Tensor:
    """50 steps of the registered opmd loss (token-mean); returns the final weights as one vector."""
    policy = make_policy()
    optimizer = make_optimizer(policy.parameters())
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=RESPONSES,
        ppo_micro_batch_size_per_gpu=1,
        policy_loss=OffPolicyLossConfig(loss_mode="opmd", tau=tau),
    )
    loss_fn = get_policy_loss_fn("opmd")
    mask = torch.ones(PROMPTS * RESPONSES, LENGTH, dtype=torch.bool)
    for prompts, responses, adv in data:
        log_prob = log_probs(policy, prompts, responses)
        loss, _ = loss_fn(log_prob.detach(), log_prob, adv, mask, "token-mean", config)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in policy.parameters()])


def main() -> int:
    data = [(prompts, responses, advantages(prompts, rewards)) for prompts, responses, rewards in batches()]
    initial = torch.cat([p.detach().flatten() for p in make_policy().parameters()])
    rows = []
    for name, make_optimizer in OPTIMIZERS.items():
        weights = {tau: train(tau, make_optimizer, data) for tau in TAUS}
        moved = (weights[0.0] - initial).abs().max().item()
        for tau in TAUS[1:]:
            diff = (weights[tau] - weights[0.0]).abs().max().item()
            rows.append((name, tau, diff, moved))
            print(
                f"{name}: tau={tau:g} vs tau=0: max |Δweight| = {diff:.3g} (largest move from init at tau=0: "
                f"{moved:.3g})"
            )
    lines = [
        "# OPMD's τ under Adam",
        "",
        f"Generated by `{COMMAND}` (seed {SEED}, {STEPS} steps, float64, {PROMPTS} prompts × {RESPONSES} "
        f"responses × {LENGTH} "
        f"tokens, vocabulary {VOCAB}, MLP hidden {HIDDEN}; torch {torch.__version__}, Python "
        f"{platform.python_version()}, CPU).",
        "The same policy is trained on the same batches through the registered `opmd` estimator (mean baseline) and "
        "`opmd` loss ℓ = −A·log π/(1+τ) (token-mean) once per τ; the table gives the largest absolute weight "
        "difference "
        "from the τ = 0 run after the last step, next to the largest weight change of the τ = 0 run itself.",
        "",
        "| optimizer | τ | max \\|w_τ − w_0\\| after 50 steps | max \\|w_0 − w_init\\| | ratio |",
        "|---|---|---|---|---|",
        *(f"| {name} | {tau:g} | {diff:.2e} | {moved:.2e} | {diff / moved:.1e} |" for name, tau, diff, moved in rows),
        "",
        "Under Adam the 1/(1+τ) factor is a constant gradient scale that m̂/(√v̂ + ε) cancels except through ε: "
        "with the default ε = 1e-8 only weights whose gradients are comparable to ε move differently (this toy "
        "model's gradients are small, so the effect is larger than for a model whose gradients are ≫ ε), and with "
        "ε = 1e-16 what is left is rounding noise that Adam amplifies on weights whose gradient is ~0. τ is "
        "therefore nearly inert under Adam (differences ≤ 1% of the training move here): changing it is not a way "
        "to tune OPMD. Under SGD the same factor is a learning-rate change "
        "of 1/(1+τ) and the runs differ at the scale of the training itself.",
        "",
    ]
    RESULTS.write_text("\n".join(lines))
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
