"""Nearest-neighbour look-up, tie handling and the Wilson interval, against brute force."""

from __future__ import annotations

import math

import pytest
import torch

from identifiable.tokens.lookup import (
    SequenceLayout,
    identical_classes,
    nearest_in_sequence,
    nearest_in_set,
    score_lookup,
    sequence_class_sizes,
    wilson_interval,
)


def _brute_nearest(pred, cand, metric):
    if metric == "l2":
        dist = torch.cdist(pred.double(), cand.double())
    else:
        dist = 1 - torch.nn.functional.cosine_similarity(
            pred.double()[:, None], cand.double()[None], dim=-1
        )
    return dist.argmin(-1)


@pytest.mark.parametrize("metric", ["l2", "cos"])
def test_nearest_in_set_matches_brute_force(metric):
    g = torch.Generator().manual_seed(1)
    pred, cand = torch.randn(70, 6, generator=g), torch.randn(50, 6, generator=g)
    assert torch.equal(nearest_in_set(pred, cand, metric), _brute_nearest(pred, cand, metric))


@pytest.mark.parametrize("metric", ["l2", "cos"])
def test_nearest_in_sequence_only_looks_inside_the_sequence(metric):
    g = torch.Generator().manual_seed(2)
    seq = torch.tensor([3, 3, 3, 0, 0, 7, 7, 7, 7, 1])[torch.randperm(10, generator=g)]
    pred, cand = torch.randn(10, 4, generator=g), torch.randn(10, 4, generator=g)
    got = nearest_in_sequence(pred, cand, SequenceLayout.from_seq_ids(seq), metric)
    for i in range(10):
        rows = torch.nonzero(seq == seq[i]).flatten()
        want = rows[_brute_nearest(pred[i : i + 1], cand[rows], metric)]
        assert int(got[i]) == int(want)
        assert seq[got[i]] == seq[i]


def test_sequence_layout_pads_with_minus_one():
    layout = SequenceLayout.from_seq_ids(torch.tensor([0, 0, 1, 1, 1, 2]))
    assert layout.lengths.tolist() == [2, 3, 1]
    assert layout.index.tolist() == [[0, 1, -1], [2, 3, 4], [5, -1, -1]]


def test_ties_count_as_success_but_not_strict_success():
    # Sequence of 4 tokens whose rows 0 and 2 are the same vector (a repeated token
    # in a model without positions); row 1 and 3 are unique.
    e0 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [-1.0, -1.0]])
    classes = identical_classes(e0)
    assert classes[0] == classes[2] and len(set(classes.tolist())) == 3
    layout = SequenceLayout.from_seq_ids(torch.zeros(4, dtype=torch.long))
    sizes = sequence_class_sizes(classes, layout)
    assert sizes.tolist() == [2, 1, 2, 1]
    # Perfect predictions: row 2's nearest may be row 0 (equal distance) — a tie.
    nearest = nearest_in_sequence(e0, e0, layout, "l2")
    out = score_lookup(nearest, torch.arange(4), classes, torch.full((4,), 4), sizes)
    assert out.success.all()
    assert out.tied.tolist() == [True, False, True, False]
    assert out.strict.tolist() == [False, True, False, True]
    assert torch.allclose(out.chance, torch.tensor([0.5, 0.25, 0.5, 0.25], dtype=torch.float64))


def test_wrong_nearest_is_failure():
    e0 = torch.eye(3)
    classes = identical_classes(e0)
    out = score_lookup(
        torch.tensor([1, 1, 2]),
        torch.arange(3),
        classes,
        torch.full((3,), 3),
        torch.ones(3, dtype=torch.long),
    )
    assert out.success.tolist() == [False, True, True]


def test_wilson_interval_known_values():
    low, high = wilson_interval(50, 100)
    assert math.isclose(low, 0.4038, abs_tol=1e-4) and math.isclose(high, 0.5962, abs_tol=1e-4)
    low, high = wilson_interval(100, 100)
    assert high == 1.0 and math.isclose(low, 0.9630, abs_tol=1e-4)
    low, high = wilson_interval(0, 20)
    assert low == 0.0 and 0.15 < high < 0.17
    assert all(math.isnan(v) for v in wilson_interval(0, 0))
