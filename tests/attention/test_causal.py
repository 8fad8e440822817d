"""Prefix (decoder) projections against a per-row SVD, including repeated rows."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention.attn_helpers import exact_rank
from identifiable.attention.causal import (
    _gram_schmidt_rows,
    prefix_coordinates,
    project_rows_causal,
)
from identifiable.attention.linalg import rank_tolerance
from identifiable.attention.reference import effective_rows_reference

SETTINGS = settings(max_examples=30, deadline=None)


def _causal_attention(g: torch.Generator, b: int, n: int) -> torch.Tensor:
    logits = torch.randn(b, n, n, generator=g, dtype=torch.float64) * 2
    mask = torch.ones(n, n, dtype=torch.bool).triu(1)
    return torch.softmax(logits.masked_fill(mask, float("-inf")), -1)


def _rows(g: torch.Generator, b: int, n: int, m: int, repeats: int) -> torch.Tensor:
    """Random rows; `repeats` later rows copy (or scale) earlier ones, as repeated tokens do."""
    x = torch.randn(b, n, m, generator=g, dtype=torch.float64)
    for _ in range(repeats):
        src, dst = sorted(torch.randint(0, n, (2,), generator=g).tolist())
        if src != dst:
            x[:, dst] = x[:, src] * float(torch.randint(1, 3, (1,), generator=g))
    return x


@SETTINGS
@given(
    n=st.integers(1, 16),
    m=st.integers(1, 8),
    repeats=st.integers(0, 6),
    chunk=st.sampled_from([1, 3, None]),
    seed=st.integers(0, 999),
)
def test_prefix_projection_matches_per_row_svd(n, m, repeats, chunk, seed):
    g = torch.Generator().manual_seed(seed)
    x = _rows(g, 2, n, m, repeats)
    a = _causal_attention(g, 2, n)
    coords, prank = prefix_coordinates(x, torch.linalg.matrix_norm(x, ord=2))
    eff = project_rows_causal(a, coords, prank, chunk=chunk)
    for b in range(2):
        for i in range(n):
            assert int(prank[b, i]) == exact_rank(x[b, : i + 1], m), (b, i)
        ref = effective_rows_reference(a[b], x[b], stochastic=False, causal=True, d_v=m)
        torch.testing.assert_close(eff[b], ref, atol=1e-9, rtol=0)
    assert torch.count_nonzero(eff.triu(1)) == 0  # masked keys stay exactly 0
    full = prank == torch.arange(1, n + 1)
    assert torch.equal(eff[full], a[full])  # full-row-rank prefixes: copied, not rounded


@SETTINGS
@given(n=st.integers(2, 20), m=st.integers(1, 6), seed=st.integers(0, 999))
def test_fast_path_equals_gram_schmidt_path(n, m, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, n, m, generator=g, dtype=torch.float64)
    a = _causal_attention(g, 3, n)
    scale = torch.linalg.matrix_norm(x, ord=2)
    c_fast, r_fast = prefix_coordinates(x, scale)
    c_gs, r_gs = _gram_schmidt_rows(x, rank_tolerance(scale, n, m), min(n, m))
    assert torch.equal(r_fast, r_gs)
    torch.testing.assert_close(
        project_rows_causal(a, c_fast, r_fast),
        project_rows_causal(a, c_gs, r_gs),
        # two float64 routes on nearly rank-deficient random prefixes: hypothesis found 3.3e-10
        atol=1e-8,
        rtol=0,
    )


def test_zero_rows_give_zero_projection():
    x = torch.zeros(1, 5, 3, dtype=torch.float64)
    x[0, 3] = torch.tensor([1.0, 2.0, 3.0])
    a = _causal_attention(torch.Generator().manual_seed(0), 1, 5)
    coords, prank = prefix_coordinates(x, torch.linalg.matrix_norm(x, ord=2))
    assert prank[0].tolist() == [0, 0, 0, 1, 1]
    eff = project_rows_causal(a, coords, prank)
    assert torch.count_nonzero(eff[0, :3]) == 0  # col(0) = {0}
    # Row 3 sees only key 3 with a nonzero value: projection keeps a_33 alone.
    torch.testing.assert_close(
        eff[0, 3], torch.cat([torch.zeros(3), a[0, 3, 3:4], torch.zeros(1)]).double()
    )


def test_ill_conditioned_prefixes_stay_accurate():
    """Rows close to a 3-dimensional subspace (κ(X_i) ≈ 1e6) still match the per-row SVD."""
    g = torch.Generator().manual_seed(1)
    n, m = 40, 6
    low = torch.randn(1, n, 3, generator=g, dtype=torch.float64)
    x = low @ torch.randn(3, m, generator=g, dtype=torch.float64)
    x = x + 1e-6 * torch.randn(1, n, m, generator=g, dtype=torch.float64)
    a = _causal_attention(g, 1, n)
    coords, prank = prefix_coordinates(x, torch.linalg.matrix_norm(x, ord=2))
    assert prank[0, -1] == m  # still full rank at this noise level
    ref = effective_rows_reference(a[0], x[0], stochastic=False, causal=True, d_v=m)
    torch.testing.assert_close(project_rows_causal(a, coords, prank)[0], ref, atol=1e-8, rtol=0)
