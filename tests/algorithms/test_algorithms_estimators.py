"""Advantage estimators of docs/algorithms.md, through verl's registry (``get_adv_estimator_fn``).

Expected values are derived by hand from the spec formulas in the comments; nothing is copied from
the implementation.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import verl  # noqa: F401  (loads the verl.plugins entry point: registers our names)
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, kl_penalty
from verl.utils import as_torch_index

from verl_offpolicy.core.advantages import red_drop_advantage
from verl_offpolicy.glue.algorithms.red import _layout
from verl_offpolicy.glue.config import OffPolicyAlgoConfig, OffPolicyConfig

F64 = torch.float64


def run(name, rewards, uids, dtype=F64, **offpolicy):
    """Call the registered estimator on one-token responses (T = 1); returns per-sequence A [B]."""
    token_rewards = torch.as_tensor(rewards, dtype=dtype).unsqueeze(-1)
    config = OmegaConf.create({"adv_estimator": name, "offpolicy": offpolicy})
    advantages, returns = get_adv_estimator_fn(name)(
        token_level_rewards=token_rewards,
        response_mask=torch.ones_like(token_rewards),
        index=np.array(uids, dtype=object),
        config=config,
    )
    assert advantages.shape == token_rewards.shape and torch.equal(advantages, returns)
    return advantages[:, 0]


# ---------------------------------------------------------------- hand-derived values


def test_opmd_mean_baseline():
    # group a: r = [1, 2, 6], r̄ = 3 → A = [−2, −1, 3]; group b is a singleton: A = r = 4
    a = run("opmd", [1, 2, 6, 4], ["a", "a", "a", "b"])
    torch.testing.assert_close(a, torch.tensor([-2.0, -1.0, 3.0, 4.0], dtype=F64))


def test_opmd_logavgexp_baseline():
    # τ = 2, r = [0, 2·ln 3]: r/τ = [0, ln 3], logsumexp = ln 4, minus ln K = ln 2 → b = 2·ln 2
    # A = [−2 ln 2, 2 ln 3 − 2 ln 2]
    a = run("opmd", [0.0, 2 * math.log(3)], ["u", "u"], baseline="logavgexp", tau=2.0)
    expected = torch.tensor([-2 * math.log(2), 2 * math.log(3) - 2 * math.log(2)], dtype=F64)
    torch.testing.assert_close(a, expected)


def test_pmd_partition_values():
    # τ = 1, r = [0, ln 2, ln 3], exp(r) = [1, 2, 3], K − 1 = 2
    # A_0 = 0 − ln((2+3)/2) = −ln 2.5; A_1 = ln 2 − ln((1+3)/2) = 0; A_2 = ln 3 − ln((1+2)/2) = ln 2
    a = run("pmd_partition", [0.0, math.log(2), math.log(3)], ["g"] * 3, tau=1.0)
    torch.testing.assert_close(a, torch.tensor([-math.log(2.5), 0.0, math.log(2)], dtype=F64))


def test_pmd_partition_limits():
    # τ → ∞: RLOO. r = [1, 2, 6]: r̄_{−i} = [4, 3.5, 1.5] → A = [−3, −1.5, 4.5]; also verl's own rloo
    r, uids = [1.0, 2.0, 6.0], ["g"] * 3
    big = run("pmd_partition", r, uids, tau=1e6)
    torch.testing.assert_close(big, torch.tensor([-3.0, -1.5, 4.5], dtype=F64), atol=1e-4, rtol=0)
    rloo, _ = get_adv_estimator_fn("rloo")(
        torch.tensor(r, dtype=F64).unsqueeze(-1), torch.ones(3, 1, dtype=F64), np.array(uids, dtype=object)
    )
    torch.testing.assert_close(big, rloo[:, 0], atol=1e-4, rtol=0)
    # τ → 0: r_i − max_{j≠i} r_j = [1−6, 2−6, 6−2] (+ τ·ln(K−1) ≈ 7e-4)
    small = run("pmd_partition", r, uids, tau=1e-3)
    torch.testing.assert_close(small, torch.tensor([-5.0, -4.0, 4.0], dtype=F64), atol=1e-3, rtol=0)


def test_asymre_values():
    # shift −0.1: baseline r̄ + shift = 3 − 0.1 = 2.9 → A = [−1.9, −0.9, 3.1]; singleton → A = r
    a = run("asymre", [1, 2, 6, 4], ["a", "a", "a", "b"], shift=-0.1)
    torch.testing.assert_close(a, torch.tensor([-1.9, -0.9, 3.1, 4.0], dtype=F64))


def test_red_weight_values_and_clamp():
    # T = 0.5, r = [0, 1]: r̄ = 0.5, d = ±0.5, d/T = ±1 → A = [−0.5/e, 0.5·e]
    a = run("red_weight", [0.0, 1.0], ["g", "g"], temperature=0.5)
    torch.testing.assert_close(a, torch.tensor([-0.5 / math.e, 0.5 * math.e], dtype=F64))
    # T = 1, r = [0, 100]: d = ±50, exponent clamped at 20 → A = [−50·e^−50, 50·e^20]
    a = run("red_weight", [0.0, 100.0], ["g", "g"], temperature=1.0)
    torch.testing.assert_close(a, torch.tensor([-50 * math.exp(-50), 50 * math.exp(20)], dtype=F64))


def test_agro_off_and_on_policy():
    # R = [1, 2, 6]: D = R − R̄_{−i} = [1−4, 2−3.5, 6−1.5] = [−3, −1.5, 4.5]
    off = run("agro", [1, 2, 6], ["g"] * 3, beta=0.5)
    torch.testing.assert_close(off, torch.tensor([-3.0, -1.5, 4.5], dtype=F64))
    # on-policy, β = 0.5: c_i = K/(K−1)·(unbiased variance of the other two returns), K = 3:
    # others of 1: {2, 6}, variance (2² + 2²)/1 = 8 → c = 12; of 2: {1, 6} → 12.5 → 18.75; of 6: {1, 2} → 0.5 → 0.75
    # A = D − (D² − c)/(2·0.5) = [−3 − (9 − 12), −1.5 − (2.25 − 18.75), 4.5 − (20.25 − 0.75)] = [0, 15, −15]
    on = run("agro", [1, 2, 6], ["g"] * 3, beta=0.5, on_policy=True)
    torch.testing.assert_close(on, torch.tensor([0.0, 15.0, -15.0], dtype=F64))
    # K = 2: no variance among the other (single) return, c = 0; R = [1, 3]: D = [−2, 2], β = 0.5
    # A = D − D² = [−6, −2]; a singleton keeps A = R = 4 (group "s")
    on2 = run("agro", [1, 3, 4], ["p", "p", "s"], beta=0.5, on_policy=True)
    torch.testing.assert_close(on2, torch.tensor([-6.0, -2.0, 4.0], dtype=F64))


def test_topr_raw_reward_advantage_of_all_correct_and_all_wrong_groups():
    # TOPR (arXiv 2503.14286): A_i = R_i − c, R_i = 2r_i − 1, c one scalar (no group statistic).
    # All-correct group r = [1, 1, 1] → R = [1, 1, 1], c = 0 → A = [1, 1, 1] (a group mean would give 0);
    # all-wrong group r = [0, 0] → R = [−1, −1] → A = [−1, −1] (group mean: 0); mixed group r = [1, 0] → [1, −1];
    # a singleton r = 1 → 1.
    rewards, uids = [1, 1, 1, 0, 0, 1, 0, 1], ["a", "a", "a", "b", "b", "c", "c", "d"]
    a = run("topr", rewards, uids)
    torch.testing.assert_close(a, torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, 1.0, -1.0, 1.0], dtype=F64))
    # c = 0.5: R − c = [0.5, 0.5, 0.5, −1.5, −1.5, 0.5, −1.5, 0.5]
    a = run("topr", rewards, uids, topr_baseline=0.5)
    torch.testing.assert_close(a, torch.tensor([0.5, 0.5, 0.5, -1.5, -1.5, 0.5, -1.5, 0.5], dtype=F64))
    # raw rewards r = [0.3, 2] with c = −1: A = r − c = [1.3, 3]
    a = run("topr", [0.3, 2.0], ["a", "a"], topr_baseline=-1.0, topr_reward="raw")
    torch.testing.assert_close(a, torch.tensor([1.3, 3.0], dtype=F64))


@pytest.mark.parametrize(
    "rewards, found",
    [
        (
            [1.0, -1.0, -1.0, 1.0],
            r"2 of 4 rewards are outside \{0, 1\} \(range found: \[-1, 1\]\)",
        ),  # verl's ±1 math reward
        ([0.25, 0.0, 1.0, 0.5], r"2 of 4 rewards are outside \{0, 1\} \(range found: \[0, 1\]\)"),
    ],  # partial credit
    ids=["plus-minus-one", "fractions"],
)
def test_topr_signed_reward_refuses_rewards_outside_zero_one(rewards, found):
    # 2r − 1 would map ±1 to {1, −3} and a fraction to a mostly negative R: the signed mapping is for 0/1 only.
    with pytest.raises(ValueError, match=r"algorithm\.offpolicy\.topr_reward=signed: .*" + found + r".*'raw'"):
        run("topr", rewards, ["a", "a", "b", "b"])
    # the same rewards with topr_reward=raw are R = r (c = 0)
    torch.testing.assert_close(
        run("topr", rewards, ["a", "a", "b", "b"], topr_reward="raw"), torch.tensor(rewards, dtype=F64)
    )


PLUS_MINUS_ONE = (
    "def score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
    "    return 1.0 if solution_str == ground_truth else -1.0\n"
)


def _topr_config(tmp_path, reward, *overrides):
    """The topr preset on a one-row repeat task (symbol "a", 4 response tokens): ``reward`` names the reward
    function."""
    from tests.hydra_utils import VALID_SIZES, compose_main_ppo
    from verl_offpolicy.demo.repeat_task import make_row, write_splits

    files = write_splits(tmp_path, [make_row("a", 0, "train", 4)], [make_row("a", 0, "test", 4)])
    if reward == "plus_minus_one":
        (tmp_path / "reward.py").write_text(PLUS_MINUS_ONE)
        function = [
            f"reward.custom_reward_function.path={tmp_path / 'reward.py'}",
            "reward.custom_reward_function.name=score",
        ]
    else:  # the repeat task's fractional compute_score or its 0/1 compute_score_binary
        function = [
            "reward.custom_reward_function.path=pkg://verl_offpolicy.cpu.task",
            f"reward.custom_reward_function.name={reward}",
        ]
    return compose_main_ppo(
        "offpolicy_trainer",
        ["algorithm=topr", *VALID_SIZES, f"data.train_files={files['train_files']}", *function, *overrides],
    )


@pytest.mark.parametrize(
    "reward, found",
    [
        # ±1: the ground truth "a" scores 1 (an all-correct batch passes the per-batch check), "" scores −1
        ("plus_minus_one", "gives -1 for an empty response on the first training row"),
        # the repeat task: "a" repeats the symbol in 1 of the 4 response tokens: 1/4; "" scores 0
        ("compute_score", "gives 0.25 for its ground truth on the first training row"),
    ],
)
def test_topr_signed_reward_is_refused_at_startup_when_the_reward_function_leaves_zero_one(tmp_path, reward, found):
    from verl_offpolicy.glue.validation import validate_offpolicy_config

    with pytest.raises(
        ValueError,
        match=r"algorithm\.offpolicy\.topr_reward=signed maps 0/1 rewards to TOPR's ±1 .* "
        + re.escape(found)
        + r": set algorithm\.offpolicy\.topr_reward=raw",
    ):
        validate_offpolicy_config(_topr_config(tmp_path, reward))
    validate_offpolicy_config(_topr_config(tmp_path, reward, "algorithm.offpolicy.topr_reward=raw"))


def test_topr_signed_reward_takes_a_zero_one_reward_function(tmp_path):
    from verl_offpolicy.cpu.task import compute_score_binary
    from verl_offpolicy.glue.validation import validate_offpolicy_config

    # by hand: the first word "a" is the symbol: 1; an empty response: 0
    assert (compute_score_binary("x", "a", "a"), compute_score_binary("x", "", "a")) == (1.0, 0.0)
    validate_offpolicy_config(_topr_config(tmp_path, "compute_score_binary"))


def test_topr_all_wrong_group_is_pushed_down_with_the_tapered_weight():
    # All-wrong group (r = 0 → A = −1) through the registered topr estimator and loss: sequence 0 has
    # Δ = log π/μ = −0.5 − 0.5 = −1 → w = e^−1; sequence 1 has Δ = +0.2 → w = min(1, e^0.2) = 1.
    # token-sum: ∂ℓ/∂log π_t = −w_i·A_i = w_i, so [[e^−1, e^−1], [1, 1]]; with the group-mean variant A = 0,
    # so the gradient would be 0.
    from tests.loss_helpers import call
    from verl_offpolicy.tabular import actor

    rewards = torch.tensor([[0.0, 0.0], [0.0, 0.0]], dtype=F64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    advantages, _ = get_adv_estimator_fn("topr")(
        token_level_rewards=rewards,
        response_mask=mask.to(F64),
        index=np.array(["g", "g"], dtype=object),
        config=OmegaConf.create({"adv_estimator": "topr", "offpolicy": {}}),
    )
    old = torch.full((2, 2), -1.0, dtype=F64)
    log_prob = old + torch.tensor([[-0.5, -0.5], [0.1, 0.1]], dtype=F64)
    _, grad, _ = call(actor("topr"), old, log_prob, advantages, mask, "token-sum")
    w = math.exp(-1.0)
    torch.testing.assert_close(grad, torch.tensor([[w, w], [1.0, 1.0]], dtype=F64))


def test_agro_reads_kl_in_reward_from_verl_kl_penalty():
    # token rewards as verl builds them (use_kl_in_reward, kl_penalty=kl): r_t − β·(log π − log π_ref)
    beta = 0.1
    score = torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=F64)  # r = [1, 0] on the last token
    log_prob = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]], dtype=F64)
    ref = torch.tensor([[-1.5, -1.0], [-1.0, -0.5]], dtype=F64)
    token_rewards = score - beta * kl_penalty(log_prob, ref, "kl")
    # R_0 = 1 − 0.1·(0.5 − 1.0) = 1.05, R_1 = 0 − 0.1·(0.5 + 0) = −0.05; K = 2: D = ±(R_0 − R_1) = ±1.1
    config = OffPolicyAlgoConfig(
        adv_estimator="agro",
        use_kl_in_reward=True,
        kl_ctrl={"type": "fixed", "kl_coef": beta},
        offpolicy=OffPolicyConfig(beta=beta),
    )
    mask = torch.ones(2, 2, dtype=F64)
    adv, _ = get_adv_estimator_fn("agro")(token_rewards, mask, np.array(["p", "p"]), config=config)
    torch.testing.assert_close(adv, torch.tensor([[1.1, 1.1], [-1.1, -1.1]], dtype=F64))


def test_agro_rejects_config_without_kl_in_reward():
    """The startup rules (the estimator itself checks nothing they check)."""
    from verl_offpolicy.glue.validation import validate_parts

    config = OffPolicyAlgoConfig(adv_estimator="agro", use_kl_in_reward=False)
    with pytest.raises(ValueError, match="use_kl_in_reward=true"):
        validate_parts(algorithm=config)
    config = OffPolicyAlgoConfig(adv_estimator="agro", use_kl_in_reward=True, kl_penalty="low_var_kl")
    with pytest.raises(ValueError, match=r"algorithm.kl_penalty=kl \(got low_var_kl\)"):
        validate_parts(algorithm=config)
    config = OffPolicyAlgoConfig(
        adv_estimator="agro",
        use_kl_in_reward=True,
        kl_ctrl={"type": "fixed", "kl_coef": 0.2},
        offpolicy=OffPolicyConfig(beta=0.1),
    )
    with pytest.raises(
        ValueError, match=r"algorithm.kl_ctrl.kl_coef=0.1 to equal algorithm.offpolicy.beta \(got kl_coef=0.2\)"
    ):
        validate_parts(algorithm=config)


def test_estimator_reads_dataclass_config():
    # OffPolicyAlgoConfig (what verl builds from algorithm._target_) instead of a DictConfig: τ = 2 as above
    config = OffPolicyAlgoConfig(adv_estimator="opmd", offpolicy=OffPolicyConfig(baseline="logavgexp", tau=2.0))
    rewards = torch.tensor([[0.0], [2 * math.log(3)]], dtype=F64)
    adv, _ = get_adv_estimator_fn("opmd")(rewards, torch.ones(2, 1, dtype=F64), np.array(["u", "u"]), config=config)
    expected = torch.tensor([-2 * math.log(2), 2 * math.log(3) - 2 * math.log(2)], dtype=F64)
    torch.testing.assert_close(adv[:, 0], expected)


def test_advantage_is_broadcast_over_tokens_times_mask():
    # r = [1, 3] (token rewards summed over the response), group mean 2 → A = [−1, 1] on valid tokens only
    token_rewards = torch.tensor([[0.0, 1.0, 0.0], [1.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv, ret = get_adv_estimator_fn("opmd")(token_rewards, mask, np.array(["g", "g"]), config=None)
    torch.testing.assert_close(adv, torch.tensor([[-1.0, -1.0, 0.0], [1.0, 1.0, 1.0]]))
    assert torch.equal(adv, ret)


# ---------------------------------------------------------------- red_drop (property 7 and reproducibility)


def test_red_drop_binary_examples():
    # [1,0,0,0,0,0,0,0]: r̄ = 1/8, 1 positive, 7 negatives → drop 6; kept {1, 0}: mean 0.5 → +0.5 / −0.5
    a = run("red_drop", [1, 0, 0, 0, 0, 0, 0, 0], ["g"] * 8, seed=3)
    assert a[0].item() == 0.5
    assert sorted(a[1:].tolist()) == [-0.5, 0, 0, 0, 0, 0, 0]
    # [1,1,1,0]: r̄ = 0.75, 3 positives ≥ 1 negative: nothing dropped, A = r − 0.75
    a = run("red_drop", [1, 1, 1, 0], ["h"] * 4)
    assert a.tolist() == [0.25, 0.25, 0.25, -0.75]


def test_red_drop_ties_are_positive_and_general_rewards():
    # [3, 1, 0, 0, 2]: r̄ = 1.2; positives {3, 2}, negatives {1, 0, 0} → drop one negative.
    # kept means: drop 1 → {3,0,0,2} mean 1.25; drop a 0 → {3,1,0,2} mean 1.5
    a = run("red_drop", [3, 1, 0, 0, 2], ["g"] * 5, seed=11).tolist()
    options = [
        [1.75, 0.0, -1.25, -1.25, 0.75],
        [1.5, -0.5, 0.0, -1.5, 0.5],
        [1.5, -0.5, -1.5, 0.0, 0.5],
    ]
    assert a in options
    # ties: [1, 1, 1, 1] → all positive (r ≥ r̄), A = 0
    assert run("red_drop", [1, 1, 1, 1], ["t"] * 4).tolist() == [0.0] * 4
    # [0, 1, 2]: r̄ = 1 and the tie is positive → 2 positives ≥ 1 negative, nothing dropped: A = r − 1
    assert run("red_drop", [0, 1, 2], ["t"] * 3).tolist() == [-1.0, 0.0, 1.0]


def test_red_drop_reproducible_from_seed_and_uid():
    rewards = [1, 0, 0, 0, 0, 0, 0, 0]
    first = run("red_drop", rewards, ["uid-7"] * 8, seed=5)
    # same group elsewhere in a different batch, surrounded by other groups: same drop
    mixed_rewards = [0, 1] + rewards[:4] + [1] + rewards[4:] + [0]
    mixed_uids = ["x", "x"] + ["uid-7"] * 4 + ["y"] + ["uid-7"] * 4 + ["y"]
    mixed = run("red_drop", mixed_rewards, mixed_uids, seed=5)
    positions = [2, 3, 4, 5, 7, 8, 9, 10]
    assert mixed[positions].tolist() == first.tolist()
    # another seed (or uid) draws another subset for some groups
    uids = [f"g{k}" for k in range(50) for _ in range(8)]
    a = run("red_drop", rewards * 50, uids, seed=5)
    b = run("red_drop", rewards * 50, uids, seed=6)
    assert not torch.equal(a, b)
    assert torch.equal(a, run("red_drop", rewards * 50, uids, seed=5))


def test_red_drop_uniform_over_negatives():
    # 7000 groups [1,0,...,0]: the kept negative is uniform over the 7 positions (≈ 1/7 each)
    n = 7000
    uids = [f"q{k}" for k in range(n) for _ in range(8)]
    a = run("red_drop", [1, 0, 0, 0, 0, 0, 0, 0] * n, uids, dtype=torch.float32).view(n, 8)
    kept = a[:, 1:] != 0
    assert torch.all(kept.sum(1) == 1)  # exactly #neg − #pos = 6 dropped in every group
    freq = kept.float().mean(0)
    assert torch.all((freq - 1 / 7).abs() < 0.02), freq


def test_red_drop_core_orders_itself_like_the_glue():
    # the core computes the occurrence index with torch when the caller does not pass numpy's
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 40, (400,), generator=g)
    scores = torch.randint(0, 3, (400,), generator=g).to(F64)
    uids = np.array([f"p{i}" for i in ids.tolist()], dtype=object)
    glue = run("red_drop", scores.tolist(), uids.tolist(), seed=9)
    group_ids = as_torch_index(uids, device="cpu")
    seeds, occurrence = _layout(9, uids, group_ids)
    assert torch.equal(red_drop_advantage(scores, group_ids, seeds), glue)
    assert torch.equal(red_drop_advantage(scores, group_ids, seeds, occurrence), glue)


# ---------------------------------------------------------------- robustness


def test_large_rewards_small_tau_are_stable():
    r, uids = [0.0, 1e4, 2e4], ["g"] * 3
    # pmd_partition τ = 0.01: b_0 = 0.01·ln((e^{1e6} + e^{2e6})/2) = 2e4 + 0.01·ln((1 + e^{−1e6})/2) = 2e4 − 0.01 ln 2
    # b_1 = 2e4 − 0.01 ln 2 (others {0, 2e4}); b_2 = 1e4 − 0.01 ln 2 (others {0, 1e4})
    a = run("pmd_partition", r, uids, tau=0.01)
    c = 0.01 * math.log(2)
    torch.testing.assert_close(a, torch.tensor([-2e4 + c, -1e4 + c, 1e4 + c], dtype=F64))
    # float32 as in training: finite and the same to float32 precision
    a32 = run("pmd_partition", r, uids, dtype=torch.float32, tau=0.01)
    torch.testing.assert_close(a32, a.float())
    # opmd logavgexp τ = 0.01: b = 2e4 + 0.01·(ln(1 + 2e^{−1e6}) − ln 3) = 2e4 − 0.01 ln 3
    a = run("opmd", r, uids, dtype=torch.float32, baseline="logavgexp", tau=0.01)
    c = 0.01 * math.log(3)
    torch.testing.assert_close(a, torch.tensor([-2e4 + c, -1e4 + c, c]), rtol=1e-6, atol=1e-3)
    # ... and a unique maximum far above the rest (leave-one-out sum of e^{−1e6}-sized terms)
    a = run("pmd_partition", [1e4, 0.0, 0.0], uids, dtype=torch.float32, tau=0.01)
    torch.testing.assert_close(a, torch.tensor([1e4, -1e4, -1e4]), rtol=1e-6, atol=1e-2)


def test_non_finite_reward_names_numpy_string_uids():
    rewards = torch.tensor([[1.0], [float("nan")]])
    with pytest.raises(ValueError, match=r"batch position 1 \(uid 'b'\): nan"):
        get_adv_estimator_fn("opmd")(rewards, torch.ones(2, 1), np.array(["a", "b"]), config=None)  # dtype <U1


def test_missing_index_is_a_clear_error():
    with pytest.raises(ValueError, match="needs the group of each response"):
        get_adv_estimator_fn("opmd")(torch.ones(2, 1), torch.ones(2, 1), config=None)


def test_integer_uids_are_renumbered():
    # raw integer uids far apart still form two groups
    adv, _ = get_adv_estimator_fn("opmd")(
        torch.tensor([[1.0], [3.0], [10.0], [20.0]]), torch.ones(4, 1), np.array([10**9, 10**9, 7, 7]), config=None
    )
    torch.testing.assert_close(adv[:, 0], torch.tensor([-1.0, 1.0, -5.0, 5.0]))


@pytest.mark.slow  # a fresh process imports torch
def test_core_modules_do_not_import_verl():
    code = (
        "import sys; sys.modules['verl'] = None\n"
        "import verl_offpolicy.core.advantages, verl_offpolicy.core.losses\n"
        "assert not any(m == 'verl' or m.startswith('verl.') for m in sys.modules if sys.modules[m] is not None)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=240)
