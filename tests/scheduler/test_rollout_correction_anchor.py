"""verl's rollout correction under the behaviour anchor: verl's own function, on π_behaviour/π_rollout.

``compared_with_anchor`` makes the v1 trainer's ``compute_rollout_correction_and_add_to_batch`` compare the
anchor's log-probs with the rollout's (the engines' mismatch) instead of the proximal ones (which, on a stale
batch, also hold the staleness the loss's ratio already covers). Expected weights and masks by hand from verl's
definitions: sequence IS w_i = exp(Σ_t log π_anchor,t − log π_rollout,t), zeroed outside the IcePop band
[0.5, 2]; geometric rejection (``seq_mean_k1``) keeps a response when mean_t(log π_rollout,t − log π_anchor,t)
lies in [log 0.9, log 1.1].
"""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.v1 import trainer_base

from verl_offpolicy.glue.scheduler.correction import (
    ZeroEffectiveSampleSize,
    compared_policies,
    compared_with_anchor,
    describe,
    verl_correction_named,
)

CONFIG = OmegaConf.create(
    {
        "rollout_is": "sequence",
        "rollout_is_threshold": "0.5_2.0",
        "rollout_rs": "seq_mean_k1",
        "rollout_rs_threshold": "0.9_1.1",
    }
)


def _batch():
    # rows: |y| = 2, 3, 1 (T = 3). The rollout's log-probs r; the anchor's a = r + d with
    #   d = [0.02, 0.04 | 0.5, 0.5, 0.5 | −0.8]; the proximal ones r + 0.3 (versions later: further from r)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.float32)
    rollout = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -1.5, -0.7], [-2.0, 0.0, 0.0]])
    gap = torch.tensor([[0.02, 0.04, 0.0], [0.5, 0.5, 0.5], [-0.8, 0.0, 0.0]])
    proximal = (rollout + 0.3) * mask
    batch = DataProto.from_dict(
        tensors={"old_log_probs": proximal, "rollout_log_probs": rollout, "response_mask": mask}
    )
    return batch, rollout + gap, proximal


def test_the_trainer_call_compares_the_anchor_with_the_rollout():
    batch, anchor, proximal = _batch()
    with compared_with_anchor(anchor):
        # the name the v1 trainer's _compute_advantage calls
        out, metrics = trainer_base.compute_rollout_correction_and_add_to_batch(batch, CONFIG)
    # w = e^{0.06} = 1.0618 on row 0 (in [0.5, 2]); e^{1.5} = 4.48 and e^{−0.8} = 0.449 are outside: 0
    w0 = math.exp(0.06)
    expected_w = torch.tensor([[w0, w0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(out.batch["rollout_is_weights"], expected_w)
    # geometric rejection: mean(−d) = −0.03 (kept), −0.5 and +0.8 (outside [−0.1054, 0.0953]: rejected)
    torch.testing.assert_close(
        out.batch["response_mask"], torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    )
    # verl's statistics describe the same pair: kl = masked mean of log π_rollout − log π_anchor = −0.76/6
    assert metrics["rollout_corr/kl"] == pytest.approx(-0.76 / 6, abs=1e-6)
    # the advantage and the loss see the proximal log-probs again, and verl's function is back
    assert out.batch["old_log_probs"] is proximal
    assert trainer_base.compute_rollout_correction_and_add_to_batch is compute_rollout_correction_and_add_to_batch


def test_without_the_anchor_verl_compares_the_proximal_policy():
    # the negative control: verl's own call on the same batch weighs π_proximal/π_rollout, e^{0.3} per token:
    # w = e^{0.6} = 1.822, e^{0.9} = 2.46 (outside [0.5, 2]: 0), e^{0.3} = 1.350; mean(−0.3) < log 0.9 rejects all
    batch, _, _ = _batch()
    out, metrics = trainer_base.compute_rollout_correction_and_add_to_batch(batch, CONFIG)
    w0, w2 = math.exp(0.6), math.exp(0.3)
    torch.testing.assert_close(
        out.batch["rollout_is_weights"], torch.tensor([[w0, w0, 0.0], [0.0, 0.0, 0.0], [w2, 0.0, 0.0]])
    )
    assert float(out.batch["response_mask"].sum()) == 0.0
    assert metrics["rollout_corr/kl"] == pytest.approx(-0.3, abs=1e-6)


def test_verls_function_is_restored_when_the_correction_fails():
    batch, anchor, proximal = _batch()
    with pytest.raises(ValueError, match="rollout_rs_threshold"):
        with compared_with_anchor(anchor):
            trainer_base.compute_rollout_correction_and_add_to_batch(
                batch, OmegaConf.create({"rollout_rs": "seq_mean_k1"})
            )
    assert batch.batch["old_log_probs"] is proximal
    assert trainer_base.compute_rollout_correction_and_add_to_batch is compute_rollout_correction_and_add_to_batch


def test_which_pair_each_anchor_compares():
    assert compared_policies("behaviour", stale=True) == "π_behaviour/π_rollout"
    assert compared_policies("behaviour", stale=False) == "π_proximal/π_rollout"  # a fresh batch: behaviour = proximal
    assert compared_policies("proximal", stale=True) == "π_proximal/π_rollout"
    assert compared_policies("rollout", stale=True) == "π_proximal/π_rollout"
    assert describe("behaviour", True) == "π_behaviour/π_rollout on stale steps, π_proximal/π_rollout on fresh ones"
    assert describe("behaviour", False) == "π_proximal/π_rollout"


@pytest.mark.parametrize(
    "anchor, expected",
    [
        ("behaviour", " rollout_correction=π_behaviour/π_rollout on stale steps, π_proximal/π_rollout on fresh ones"),
        ("proximal", " rollout_correction=π_proximal/π_rollout"),
    ],
)
def test_check_names_the_pair_the_correction_compares(anchor, expected):
    # what `verl-offpolicy check` appends to its "ok:" line, on a composed command line at (4, 1)
    from tests.hydra_utils import VALID_SIZES
    from verl_offpolicy.cli import _correction_note
    from verl_offpolicy.glue.compose import compose_main_ppo

    rc = "algorithm.rollout_correction"
    overrides = [
        "algorithm=rec_oneside_nois",
        f"algorithm.offpolicy.ratio_anchor={anchor}",
        "algorithm.offpolicy.sync_interval=4",
        "algorithm.offpolicy.sync_offset=1",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        f"{rc}.rollout_is=sequence",
        f"{rc}.rollout_is_threshold=0.5_2.0",
        *VALID_SIZES,
    ]
    cfg = compose_main_ppo("offpolicy_trainer", overrides)
    assert _correction_note(cfg) == expected
    cfg = compose_main_ppo("offpolicy_trainer", [o for o in overrides if not o.startswith(rc)])
    assert _correction_note(cfg) == ""  # no correction configured: nothing to name


def _all_outside_band():
    # every ratio is 1 (proximal = rollout = anchor), outside the IcePop band [1.5, 3]: every weight zeroed
    log_probs = torch.full((2, 2), -1.0)
    batch = DataProto.from_dict(
        tensors={
            "old_log_probs": log_probs.clone(),
            "rollout_log_probs": log_probs.clone(),
            "response_mask": torch.ones(2, 2),
        }
    )
    return batch, log_probs.clone(), OmegaConf.create({"rollout_is": "token", "rollout_is_threshold": "1.5_3.0"})


def test_a_band_that_zeroes_every_weight_stops_with_one_line_naming_it():
    batch, _, config = _all_outside_band()
    with pytest.raises(ZeroDivisionError):  # verl's own call: its effective sample size divides by zero
        trainer_base.compute_rollout_correction_and_add_to_batch(batch, config)
    batch, anchor, config = _all_outside_band()
    for named in (verl_correction_named(), compared_with_anchor(anchor)):
        with pytest.raises(ZeroEffectiveSampleSize) as caught:
            with named:
                trainer_base.compute_rollout_correction_and_add_to_batch(batch, config)
        message = str(caught.value)
        assert "\n" not in message and caught.value.__suppress_context__
        assert "algorithm.rollout_correction.rollout_is_threshold=1.5_3.0 zeroed every IS weight" in message
        assert trainer_base.compute_rollout_correction_and_add_to_batch is compute_rollout_correction_and_add_to_batch
