"""Causal sliding windows (`windows.py`) against a per-row SVD over each row's window:
certified blocks, rank-deficient windows that fall back to one basis per window, and a
trace with a sliding-window layer."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.traces import exact_rank, synthetic_trace
from identifiable.attention import effective_attention, null_space
from identifiable.attention.linalg import column_basis, project_rows
from identifiable.attention.windows import WindowSolve, causal_band

SETTINGS = settings(max_examples=25, deadline=None)


def _band(n: int, w: int) -> torch.Tensor:
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return (j <= i) & (i - j < w)


def _attention(g: torch.Generator, mask: torch.Tensor) -> torch.Tensor:
    logits = torch.randn(*mask.shape, generator=g, dtype=torch.float64) * 2
    return torch.softmax(logits.masked_fill(~mask, float("-inf")), -1)


def _brute_force(a: torch.Tensor, x: torch.Tensor, mask: torch.Tensor):
    n, m = x.shape
    eff = torch.zeros(n, n, dtype=torch.float64)
    rank = torch.zeros(n, dtype=torch.long)
    for i in range(n):
        keys = mask[i].nonzero()[:, 0]
        q, r, _ = column_basis(x[keys], width=m)
        rank[i] = r
        row = a[i, keys][None]
        eff[i, keys] = row[0] if int(r) == keys.numel() else project_rows(row, q)[0]
    return eff, rank


def _check(x: torch.Tensor, w: int, g: torch.Generator) -> WindowSolve:
    n, m = x.shape
    mask = _band(n, w)
    a = _attention(g, mask)
    ws = WindowSolve(x, w, torch.linalg.matrix_norm(x, ord=2))
    out = torch.full((n, n), float("nan"), dtype=torch.float64)
    ws.project(a, out, torch.float64)
    ref, ref_rank = _brute_force(a, x, mask)
    assert torch.equal(ws.rank, ref_rank)
    for i in range(n):
        keys = mask[i].nonzero()[:, 0]
        assert int(ws.rank[i]) == exact_rank(x[keys], m)
    torch.testing.assert_close(out, ref, atol=1e-9, rtol=0)
    assert torch.count_nonzero(out[~mask]) == 0
    full = ws.rank == mask.sum(-1)
    assert torch.equal(out[full], a[full])
    return ws


@SETTINGS
@given(
    n=st.integers(2, 60),
    m=st.integers(1, 6),
    w=st.integers(1, 30),
    repeats=st.integers(0, 20),
    seed=st.integers(0, 999),
)
def test_windows_match_per_row_svd(n, m, w, repeats, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, m, generator=g, dtype=torch.float64)
    for _ in range(repeats):  # repeated tokens: identical value rows
        src, dst = torch.randint(0, n, (2,), generator=g).tolist()
        x[dst] = x[src]
    if w < n:
        _check(x, w, g)


def test_blocks_are_certified_and_rank_deficient_windows_fall_back():
    """w = 24 ≫ m = 4: blocks of (24 − 4 + 1) // 2 = 10 rows go through the Woodbury
    solve; rows 60..79 all copy one value row, so windows there have rank < 4 and fall
    back to one basis per window (and must still match the SVD)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(120, 4, generator=g, dtype=torch.float64)
    x[60:85] = x[59]
    ws = _check(x, 24, g)
    certified = sum(int(b.starts.numel()) for b in ws.blocks)
    assert certified >= 5 and ws.fallback.numel() >= 10
    assert int(ws.rank[84]) == 1  # the window 61..84 sees one distinct row


def test_causal_band_recognises_only_sliding_windows():
    assert causal_band(_band(10, 3)) == 3
    assert causal_band(_band(10, 10)) is None  # the causal mask itself
    local = (torch.arange(10)[:, None] - torch.arange(10)[None, :]).abs() <= 2
    assert causal_band(local) is None


@pytest.mark.parametrize("variant", ["paper", "row-stochastic"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_trace_with_a_sliding_window_layer(variant, dtype):
    """Layer 0 slides (w = 20 > d_v = 4, certified blocks), layer 1 is causal: both match
    the brute force over T = V H, and A_eff T = A T."""
    n, w = 60, 20
    tr = synthetic_trace(n=n, d_v=4, d=12, causal=True, seed=3)
    mask = torch.stack([_band(n, w), torch.ones(n, n, dtype=torch.bool).tril()])
    logits = torch.randn(tr.attentions.shape, generator=torch.Generator().manual_seed(2))
    tr.attentions = torch.softmax(logits.masked_fill(~mask[:, None], float("-inf")), -1)
    tr.key_mask = mask
    tr.values[0, :, 30:40] = tr.values[0, :, 29:30]  # repeated tokens inside the windows
    ea = effective_attention(tr, variant, dtype=dtype)
    ns = null_space(tr)
    assert torch.equal(ns.rank, ea.null_space.rank)
    tol = 1e-9 if dtype == torch.float64 else 1e-5
    for layer in range(2):
        for h in range(tr.n_heads):
            t = tr.values[layer, h].double() @ tr.out_proj[layer, h].double()
            a = tr.attentions[layer, h].double()
            if variant == "paper":
                ref, ref_rank = _brute_force(a, t, mask[layer])
                assert torch.equal(ns.rank[layer, h], ref_rank)
                torch.testing.assert_close(ea.effective[layer, h].double(), ref, atol=tol, rtol=0)
            err = (ea.effective[layer, h].double() - a) @ t
            assert float(err.norm()) <= tol * float((a @ t).norm())
            if variant == "row-stochastic":
                sums = ea.effective[layer, h].double().sum(-1)
                torch.testing.assert_close(sums, a.sum(-1), atol=tol, rtol=0)
    assert torch.count_nonzero(ea.effective[0][:, ~mask[0]]) == 0


def test_a_base_that_factors_but_has_a_lower_numerical_rank_is_not_certified():
    """A value column of size 1e-20 (below the rank tolerance): Cholesky of the base Gram
    still runs to completion, but the SVD's rank is 3; the margin keeps such blocks out."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(80, 4, generator=g, dtype=torch.float64)
    x[:, 3] *= 1e-20
    ws = _check(x, 24, g)
    assert not ws.blocks and int(ws.rank[-1]) == 3
