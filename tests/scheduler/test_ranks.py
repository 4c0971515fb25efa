"""Two training ranks: every loss family gives the same update on 1 and on 2 ranks (real FSDP2 on gloo).

One world of 1 and one world of 2 ``TrainingWorker`` processes (``tests.actor_harness.run_ranks``, 3
processes, loopback, one timeout) train the batch of ``tests.scenario_ranks`` with each family's preset.
verl splits the batch across ranks as its dispatch does; rank 0 holds 10 response tokens, rank 1 22, so
a loss normalised per rank instead of over the global batch (``global_batch_info``: global token count,
global sequence count, ``dp_size``) gives another gradient. Compared: the loss verl reports, the
gradient of the optimizer step (full tensors, before clipping), its norm, the updated weights, and
M2PO's token mask (its cut is chosen over all ranks' tokens).

Break-checked (``glue/algorithms/adapters.py::aggregate``): aggregated per rank (``agg_loss(...,
dp_size=1)``, local token and sequence counts), the 4 token-mean families fail (the 3 sequence-mean ones
cannot tell: verl gives every rank the same number of sequences); with the global counts but ``dp_size``
dropped, all 7 fail (loss and gradient halved). With M2PO's cross-rank gather removed
(``glue/algorithms/m2po.py::_gather_values`` returning the local values) its mask test fails.
"""

from __future__ import annotations

import pytest
import torch

from tests.actor_harness import run_ranks
from tests.scenario_ranks import FAMILIES, M2PO_MASKED_GLOBAL, RESPONSES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

FAMILY_NAMES = list(FAMILIES)


@pytest.fixture(scope="module")
def updates(tmp_path_factory):
    """{world size: [per-rank report]} and the folder of the rank-0 tensors, for every family at once."""
    workdir = tmp_path_factory.mktemp("ranks")
    results = run_ranks(
        "tests.scenario_ranks:rank_updates",
        {"workdir": str(workdir), "families": FAMILY_NAMES},
        world_sizes=[1, 2],
        workdir=workdir,
        timeout=840,
    )
    for size, reports in results.items():  # where the time goes (cumulative seconds after each family)
        print(f"world of {size}, rank 0:", {f: round(reports[0][f]["seconds"], 1) for f in FAMILY_NAMES})
    return results, workdir


def tensors(workdir, size: int, family: str) -> dict:
    return torch.load(workdir / f"w{size}" / f"{family}.pt")


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_both_worlds_start_from_the_same_weights(updates):
    _, workdir = updates
    for family in FAMILY_NAMES:
        assert max_diff(tensors(workdir, 1, family)["before"], tensors(workdir, 2, family)["before"]) == 0.0, family


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_one_and_two_ranks_give_the_same_loss_gradient_and_weights(updates, family):
    results, workdir = updates
    one, two = results[1][0][family]["metrics"], results[2][0][family]["metrics"]
    assert results[2][1][family]["metrics"]["loss"] == two["loss"]  # verl averages the ranks' losses: both report it
    for key in ("loss", "actor/pg_loss", "grad_norm"):
        assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), (key, one[key], two[key])
    a, b = tensors(workdir, 1, family), tensors(workdir, 2, family)
    scale = max(float(g.abs().max()) for g in a["grads"].values())
    assert scale > 1e-3  # the batch trains (a zero gradient would agree trivially)
    assert max_diff(a["grads"], b["grads"]) <= 1e-5 * scale, family
    moved = max_diff(a["before"], a["after"])
    assert moved > 1e-3
    assert max_diff(a["after"], b["after"]) <= 1e-5 * moved, family  # SGD: lr·(clipped gradient)


def test_m2po_masks_the_same_tokens_on_one_and_two_ranks(updates):
    """M2PO's cut over the whole mini-batch: the 3 extreme tokens of 32 (tests/scenario_ranks.py: SHIFTS),
    on 1 rank and on 2, where rank 0 alone would also drop the moderate token."""
    results, _ = updates
    one = results[1][0]["m2po"]["m2po_keep"]
    two = results[2][0]["m2po"]["m2po_keep"] + results[2][1]["m2po"]["m2po_keep"]
    assert [len(row) for row in one] == [len(r) for r in RESPONSES]
    masked = {(i, t) for i, row in enumerate(one) for t, kept in enumerate(row) if not kept}
    assert masked == M2PO_MASKED_GLOBAL
    assert two == one
