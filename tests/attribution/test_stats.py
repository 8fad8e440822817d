"""Per-sequence statistics against brute-force loops on random contributions."""

from __future__ import annotations

import torch

from identifiable.attribution.stats import (
    DISTANCE_GROUPS,
    distance_group_sums,
    own_contribution,
    own_is_top,
    relative_position_totals,
    special_share,
    top_contributor,
)


def random_c(n_layers: int = 3, n: int = 15, seed: int = 0) -> torch.Tensor:
    raw = torch.rand(
        n_layers, n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    return raw / raw.sum(-1, keepdim=True)


def test_own_and_top():
    c = torch.tensor([[[0.5, 0.3, 0.2], [0.6, 0.1, 0.3], [0.2, 0.4, 0.4]]], dtype=torch.float64)
    assert own_contribution(c).tolist() == [[0.5, 0.1, 0.4]]
    assert top_contributor(c).tolist() == [[0, 0, 1]]
    assert own_is_top(c).tolist() == [[True, False, True]]  # a tie (row 2) counts as own top


def test_distance_groups_match_loops():
    c = random_c()
    sums, counts = distance_group_sums(c)
    n = c.shape[-1]
    for i in range(n):
        for g, (_, lo, hi) in enumerate(DISTANCE_GROUPS):
            js = [j for j in range(n) if lo <= abs(i - j) <= (hi if hi is not None else n)]
            assert counts[i, g] == len(js)
            torch.testing.assert_close(
                sums[:, i, g], c[:, i, js].sum(-1) if js else torch.zeros(3, dtype=c.dtype)
            )
    # groups plus the own token cover every input exactly once
    torch.testing.assert_close(sums.sum(-1) + own_contribution(c), torch.ones(3, n, dtype=c.dtype))
    assert counts[0].tolist() == [1, 1, 1, 2, 5, 4]


def test_relative_positions_match_loops():
    c = random_c(n=7)
    totals, pairs = relative_position_totals(c, max_offset=10)
    for k, r in enumerate(range(-10, 11)):
        pts = [(i, i + r) for i in range(7) if 0 <= i + r < 7]
        assert pairs[k] == len(pts)
        expect = sum((c[:, i, j] for i, j in pts), torch.zeros(3, dtype=c.dtype))
        torch.testing.assert_close(totals[:, k], expect)
    torch.testing.assert_close(totals.sum(-1), torch.full((3,), 7.0, dtype=c.dtype))


def test_special_share():
    c = random_c(n=5)
    mask = torch.tensor([True, False, False, False, True])
    torch.testing.assert_close(special_share(c, mask), c[..., 0] + c[..., 4])
