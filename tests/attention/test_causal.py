"""Prefix (decoder) projections against a per-row SVD: repeated rows, rank-deficient
prefixes, every route of `causal.py` (group means, blocks, the pivot scan)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.traces import exact_rank
from identifiable.attention.causal import (
    append_row,
    first_occurrence,
    first_rows,
    prefixes,
    project_prefixes,
)
from identifiable.attention.linalg import row_ids, sigma_max
from identifiable.attention.reference import effective_rows_reference

SETTINGS = settings(max_examples=40, deadline=None)


def _causal_attention(g: torch.Generator, b: int, n: int) -> torch.Tensor:
    logits = torch.randn(b, n, n, generator=g, dtype=torch.float64) * 2
    mask = torch.ones(n, n, dtype=torch.bool).triu(1)
    return torch.softmax(logits.masked_fill(mask, float("-inf")), -1)


def _rows(g: torch.Generator, b: int, n: int, m: int, repeats: int, rank: int | None = None):
    """Random rows; `repeats` later rows copy (or double) earlier ones, as repeated tokens
    do; `rank` < m confines all rows to a subspace (a rank-deficient W_O or V)."""
    x = torch.randn(b, n, rank or m, generator=g, dtype=torch.float64)
    if rank is not None:
        x = x @ torch.randn(rank, m, generator=g, dtype=torch.float64)
    for _ in range(repeats):
        src, dst = sorted(torch.randint(0, n, (2,), generator=g).tolist())
        if src != dst:
            x[:, dst] = x[:, src] * float(torch.randint(1, 3, (1,), generator=g))
    return x


def _check_against_svd(x: torch.Tensor, a: torch.Tensor, **kwargs) -> torch.Tensor:
    """Ranks and A_eff of `prefixes`/`project_prefixes` equal a per-row SVD's."""
    n, m = x.shape[1:]
    p = prefixes(x, torch.linalg.matrix_norm(x, ord=2))
    eff = project_prefixes(a, p, **kwargs)
    for b in range(x.shape[0]):
        for i in range(n):
            assert int(p.rank[b, i]) == exact_rank(x[b, : i + 1], m), (b, i)
        ref = effective_rows_reference(a[b], x[b], stochastic=False, causal=True, d_v=m)
        torch.testing.assert_close(eff[b], ref, atol=1e-9, rtol=0)
    assert torch.count_nonzero(eff.triu(1)) == 0  # masked keys stay exactly 0
    full = p.rank == torch.arange(1, n + 1)
    assert torch.equal(eff[full], a[full])  # full-row-rank prefixes: copied, not rounded
    return eff


@SETTINGS
@given(
    n=st.integers(1, 24),
    m=st.integers(1, 8),
    repeats=st.integers(0, 10),
    low_rank=st.booleans(),
    block=st.sampled_from([1, 3, None]),
    seed=st.integers(0, 999),
)
def test_prefix_projection_matches_per_row_svd(n, m, repeats, low_rank, block, seed):
    g = torch.Generator().manual_seed(seed)
    x = _rows(g, 2, n, m, repeats, rank=max(1, m // 2) if low_rank else None)
    _check_against_svd(x, _causal_attention(g, 2, n), block=block)


def test_repeated_tokens_take_group_means_up_to_the_first_dependent_row():
    """A first layer's values: one row per token id, so repeats are exact copies. Until a
    distinct row is dependent (here: the 5th distinct one, m = 4) each weight is the mean
    weight of its token's occurrences, and the Gram blocks take over after that."""
    g = torch.Generator().manual_seed(3)
    ids = [0, 1, 0, 2, 1, 1, 3, 0, 4, 2, 5, 0, 1, 4]
    table = torch.randn(6, 4, generator=g, dtype=torch.float64)
    x = table[ids][None]
    a = _causal_attention(g, 1, len(ids))
    p = prefixes(x, torch.linalg.matrix_norm(x, ord=2))
    assert int(p.mean_end[0]) == ids.index(4)  # the 5th distinct row is dependent
    assert p.group[0].tolist() == [ids.index(t) for t in ids]
    eff = _check_against_svd(x, a)
    i = 7  # keys 0..7: token 0 at 0, 2, 7 shares its weight
    want = a[0, i, [0, 2, 7]].mean()
    torch.testing.assert_close(eff[0, i, [0, 2, 7]], want.expand(3))
    # The Gram route alone gives the same rows (group means are a shortcut, not an answer).
    gram_only = project_prefixes(a, replace(p, mean_end=torch.zeros(1, dtype=torch.long)))
    torch.testing.assert_close(gram_only, eff, atol=1e-12, rtol=0)


def test_a_dependent_distinct_row_before_saturation_goes_through_the_scan():
    """Row 5 = row 1 + row 3 (not a copy): rank stays 4 there while later rows still add
    pivots; the blocks then start at those pivots."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 30, 8, generator=g, dtype=torch.float64)
    x[0, 5] = x[0, 1] + x[0, 3]
    x[0, 9] = x[0, 2]  # and an exact repeat
    a = _causal_attention(g, 1, 30)
    p = prefixes(x, torch.linalg.matrix_norm(x, ord=2))
    assert p.rank[0, :10].tolist() == [1, 2, 3, 4, 5, 5, 6, 7, 8, 8]
    assert int(p.mean_end[0]) == 5 and float(p.dependent_max[0]) < float(p.tol[0])
    for block in (2, 5, None):
        _check_against_svd(x, a, block=block)


def test_zero_rows_give_zero_projection():
    x = torch.zeros(1, 5, 3, dtype=torch.float64)
    x[0, 3] = torch.tensor([1.0, 2.0, 3.0])
    a = _causal_attention(torch.Generator().manual_seed(0), 1, 5)
    p = prefixes(x, torch.linalg.matrix_norm(x, ord=2))
    assert p.rank[0].tolist() == [0, 0, 0, 1, 1]
    eff = project_prefixes(a, p)
    assert torch.count_nonzero(eff[0, :3]) == 0  # col(0) = {0}
    # Row 3 sees only key 3 with a nonzero value: projection keeps a_33 alone.
    torch.testing.assert_close(
        eff[0, 3], torch.cat([torch.zeros(3), a[0, 3, 3:4], torch.zeros(1)]).double()
    )
    assert torch.count_nonzero(project_prefixes(a, prefixes(x * 0, torch.zeros(1)))) == 0


def test_ill_conditioned_prefixes_stay_accurate():
    """Rows close to a 3-dimensional subspace (κ(X_i) ≈ 1e6) still match the per-row SVD."""
    g = torch.Generator().manual_seed(1)
    n, m = 40, 6
    low = torch.randn(1, n, 3, generator=g, dtype=torch.float64)
    x = low @ torch.randn(3, m, generator=g, dtype=torch.float64)
    x = x + 1e-6 * torch.randn(1, n, m, generator=g, dtype=torch.float64)
    a = _causal_attention(g, 1, n)
    p = prefixes(x, torch.linalg.matrix_norm(x, ord=2))
    assert p.rank[0, -1] == m  # still full rank at this noise level
    ref = effective_rows_reference(a[0], x[0], stochastic=False, causal=True, d_v=m)
    torch.testing.assert_close(project_prefixes(a, p)[0], ref, atol=1e-8, rtol=0)


def test_heads_sharing_one_matrix_share_its_solves():
    """`owner`: two heads (different A) on one X give what each gives alone."""
    g = torch.Generator().manual_seed(2)
    x = _rows(g, 1, 50, 6, repeats=12)
    a = _causal_attention(g, 2, 50)
    p = prefixes(x, torch.linalg.matrix_norm(x, ord=2))
    both = project_prefixes(a, p, owner=torch.zeros(2, dtype=torch.long))
    for h in range(2):
        torch.testing.assert_close(both[h], project_prefixes(a[h : h + 1], p)[0], atol=0, rtol=0)


@pytest.mark.parametrize("repeats", [0, 30])
def test_float32_products_keep_the_invariant(repeats):
    """dtype=float32 (A C and Y Cᵀ in float32, solves in float64): within 1e-5 of float64,
    A_eff C = A C to 1e-5 per row, and exact copies of A where the prefix has full rank."""
    g = torch.Generator().manual_seed(4)
    x = _rows(g, 2, 120, 16, repeats)
    a = _causal_attention(g, 2, 120)
    p = prefixes(x, torch.linalg.matrix_norm(x, ord=2))
    e64 = project_prefixes(a, p)
    e32 = project_prefixes(a.float(), p, dtype=torch.float32)
    assert e32.dtype == torch.float32
    assert float((e32.double() - e64).abs().max()) <= 1e-5
    err = (e32.double() - a) @ x
    assert (err.norm(dim=-1) <= 1e-5 * (a @ x).norm(dim=-1)).all()
    full = p.rank == torch.arange(1, 121)
    assert torch.equal(e32[full], a.float()[full])


def test_latent_heads_share_equal_rows_and_batched_solves():
    """Latent attention: every head's values are one shared latent times its own W_V, so
    repeated tokens repeat in every head. Equal rows found once (`row_ids`), the heads'
    batched QR and block solves give each head what it gets alone, and the per-row SVD."""
    g = torch.Generator().manual_seed(6)
    ids = torch.randint(0, 9, (40,), generator=g)
    latent = torch.randn(9, 12, generator=g, dtype=torch.float64)[ids]
    x = latent @ torch.randn(5, 12, 4, generator=g, dtype=torch.float64)  # [5, 40, 4]
    a = _causal_attention(g, 5, 40)
    group = first_rows(row_ids(x))
    assert torch.equal(group, torch.stack([first_occurrence(x[h]) for h in range(5)]))
    smax = torch.linalg.matrix_norm(x, ord=2)
    p = prefixes(x, smax, group, sigma_max(x))
    eff = project_prefixes(a, p, block=3)
    for h in range(5):
        alone = prefixes(x[h : h + 1], smax[h : h + 1])
        assert torch.equal(p.rank[h], alone.rank[0]) and torch.equal(p.group[h], alone.group[0])
        torch.testing.assert_close(eff[h], project_prefixes(a[h : h + 1], alone, block=3)[0])
        ref = effective_rows_reference(a[h], x[h], stochastic=False, causal=True, d_v=4)
        torch.testing.assert_close(eff[h], ref, atol=1e-9, rtol=0)


@pytest.mark.parametrize(("k", "n"), [(6, 20), (9, 9), (12, 7), (40, 90)])
def test_append_row_gives_the_r_of_a_new_qr(k, n):
    """R of [Xᵀ; wᵀ] from X's R: the same Gram RᵀR and |diagonal| as LAPACK's QR of the
    whole, upper trapezoidal with exact zeros (also when X is rank-deficient)."""
    g = torch.Generator().manual_seed(k + n)
    x = torch.randn(3, n, k, generator=g, dtype=torch.float64)
    x[1, :, -1] = x[1, :, 0]  # a rank-deficient Xᵀ
    w = torch.randn(3, n, generator=g, dtype=torch.float64)
    ra = append_row(torch.linalg.qr(x.mT, mode="r")[1], w)
    ref = torch.linalg.qr(torch.cat([x.mT, w[:, None]], 1), mode="r")[1]
    assert ra.shape == ref.shape
    assert torch.count_nonzero(ra.tril(-1)) == 0
    torch.testing.assert_close(ra.mT @ ra, ref.mT @ ref, atol=1e-12, rtol=0)
    diag = torch.diagonal(ra, dim1=-2, dim2=-1).abs()
    torch.testing.assert_close(
        diag, torch.diagonal(ref, dim1=-2, dim2=-1).abs(), atol=1e-12, rtol=0
    )


def test_sigma_max_from_the_gram_equals_the_svd():
    g = torch.Generator().manual_seed(8)
    x = (
        torch.randn(4, 30, 7, generator=g, dtype=torch.float64)
        * torch.tensor([1e-3, 1, 5, 1e4])[:, None, None]
    )
    for y in (x, x.mT):
        want = torch.linalg.svdvals(y)[:, 0]
        torch.testing.assert_close(sigma_max(y), want, rtol=1e-13, atol=0)
    assert sigma_max(x[:, :, :0]).tolist() == [0.0] * 4
