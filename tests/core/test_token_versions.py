"""Per-token provenance (:mod:`verl_offpolicy.core.token_versions`), on a hand-written mixed-version batch.

Batch trained at step t = 7 (the trainer's weights at version 6), scheduled at version 4:

    response 0: versions 4 4 5 | 9 (padding)     mask 1 1 1 0   -> spans 4 and 5
    response 1: versions 5 5 5 5                 mask 1 1 1 1
    response 2: versions 0 0 0 0                 mask 0 0 0 0   -> no token: not counted

Masked versions 4, 4, 5, 5, 5, 5, 5 (7 tokens): min 4, max 5, mean 33/7; staleness 6 − v: 2, 2, 1, 1, 1, 1, 1,
mean 9/7, max 2; one of the two responses with tokens spans versions: 1/2; tokens per version {4: 2, 5: 5}.
"""

from __future__ import annotations

import pytest
import torch

from verl_offpolicy.core.token_versions import (
    extend_segments,
    token_staleness,
    token_version_stats,
    version_contract_violation,
    versions_from_segments,
)

VERSIONS = torch.tensor([[4, 4, 5, 9], [5, 5, 5, 5], [0, 0, 0, 0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])


def test_the_statistics_of_a_mixed_version_batch():
    stats = token_version_stats(VERSIONS, MASK, trained_version=6)
    assert (stats.tokens, stats.version_min, stats.version_max) == (7, 4, 5)
    assert stats.version_mean == pytest.approx(33 / 7)
    assert stats.staleness_mean == pytest.approx(9 / 7) and stats.staleness_max == 2
    assert stats.spanning_fraction == 0.5
    assert stats.tokens_per_version == {4: 2, 5: 5}


def test_padding_and_unmasked_tokens_do_not_count():
    """Response 0's padding holds version 9 (newer than anything): outside the mask it changes nothing."""
    stats = token_version_stats(VERSIONS, MASK, trained_version=6)
    assert stats.version_max == 5
    assert version_contract_violation(VERSIONS, MASK, scheduled_version=4, trained_version=6) is None


def test_a_batch_without_response_tokens_reports_nothing():
    assert token_version_stats(VERSIONS[2:], MASK[2:], trained_version=6) is None


def test_one_version_throughout_is_the_batch_staleness():
    stats = token_version_stats(VERSIONS[1:2], MASK[1:2], trained_version=6)
    assert (stats.staleness_mean, stats.staleness_max, stats.spanning_fraction) == (1.0, 1, 0.0)
    assert token_staleness(torch.tensor([5, 6]), 6).tolist() == [1, 0]


@pytest.mark.parametrize(
    "scheduled,trained,fragment",
    [
        (
            5,
            6,
            "2 response token(s) sampled by a version older than the batch's scheduled version 5: the first is "
            "token 0 of response 0, version 4",
        ),
        (
            4,
            4,
            "5 response token(s) sampled by a version newer than the trainer's weights (version 4): the first "
            "is token 2 of response 0, version 5",
        ),
    ],
)
def test_a_token_outside_the_contract_is_named(scheduled, trained, fragment):
    assert version_contract_violation(VERSIONS, MASK, scheduled, trained) == fragment


def test_segments_are_laid_onto_the_masked_positions_in_order():
    """Row 0: segments (4, 2), (5, 3) over mask 1 1 0 1 1 1 (a tool reply at position 2): versions 4 4 _ 5 5 5, the
    last segment token cut by the response length; row 1: no masked token, all ``fill``."""
    mask = torch.tensor([[1, 1, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0]])
    versions = versions_from_segments([[(4, 2), (5, 3)], [(6, 4)]], mask, fill=-1)
    assert versions.tolist() == [[4, 4, -1, 5, 5, -1], [-1] * 6]


def test_a_masked_token_without_a_segment_is_an_error():
    with pytest.raises(ValueError, match="response 0 has 3 response-mask tokens but its version segments"):
        versions_from_segments([[(4, 2)]], torch.tensor([[1, 1, 1]]), fill=0)


def test_segments_grow_by_merging_a_repeated_version():
    """3 tokens of 0, 2 more of 0, none of 2, 4 of 1, 1 of None (an unversioned token): [[0, 5], [1, 4], [None, 1]]."""
    segments = []
    for version, tokens in ((0, 3), (0, 2), (2, 0), (1, 4), (None, 1)):
        extend_segments(segments, version, tokens)
    assert segments == [[0, 5], [1, 4], [None, 1]]
