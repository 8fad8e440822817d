"""Per-row key sets (sliding windows, local attention, padding) against a brute-force per-row SVD."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from helpers.traces import exact_rank, synthetic_trace
from identifiable.attention import effective_attention, null_space
from identifiable.attention.keysets import keyset_groups, keyset_ranks, project_rows_keysets
from identifiable.attention.linalg import column_basis, project_rows, row_ids

SETTINGS = settings(max_examples=30, deadline=None)


def _brute_force(a: torch.Tensor, x: torch.Tensor, mask: torch.Tensor, stochastic: bool):
    """One SVD per row and head over exactly the keys that row sees."""
    n_h, n, _ = x.shape
    eff = torch.zeros(n_h, n, n, dtype=torch.float64)
    rank = torch.zeros(n_h, n, dtype=torch.long)
    for h in range(n_h):
        for i in range(n):
            keys = mask[i].nonzero()[:, 0]
            if keys.numel() == 0:
                continue
            xs = x[h, keys]
            if stochastic:  # the definition itself: one SVD of [X[S], s·1], ‖s·1‖ = σ_max(X[S])
                ones = torch.ones(len(keys), 1, dtype=xs.dtype) / len(keys) ** 0.5
                xs = torch.cat([xs, ones * torch.linalg.matrix_norm(xs, ord=2)], -1)
            q, r, _ = column_basis(xs, width=xs.shape[1])
            rank[h, i] = r
            row = a[h, i, keys].double()[None]
            eff[h, i, keys] = row[0] if int(r) == keys.numel() else project_rows(row, q)[0]
    return eff, rank


def _masked_softmax(g: torch.Generator, n_h: int, mask: torch.Tensor) -> torch.Tensor:
    logits = torch.randn(n_h, *mask.shape, generator=g, dtype=torch.float64) * 2
    out = torch.softmax(logits.masked_fill(~mask, float("-inf")), -1)
    return torch.nan_to_num(out)  # rows with no keys: all zero


def _rows(g: torch.Generator, n_h: int, n: int, m: int, repeats: int) -> torch.Tensor:
    x = torch.randn(n_h, n, m, generator=g, dtype=torch.float64)
    for _ in range(repeats):  # repeated tokens give identical value rows
        src, dst = torch.randint(0, n, (2,), generator=g).tolist()
        x[:, dst] = x[:, src]
    return x


def _window(n: int, w: int, causal: bool) -> torch.Tensor:
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return ((j <= i) & (i - j < w)) if causal else ((i - j).abs() <= w)


@SETTINGS
@given(
    n=st.integers(1, 14),
    m=st.integers(1, 6),
    repeats=st.integers(0, 5),
    kind=st.sampled_from(["random", "causal-window", "bidirectional-window", "padding"]),
    w=st.integers(1, 6),
    stochastic=st.booleans(),
    seed=st.integers(0, 999),
)
# a window of 5 keys with two equal rows, rank 4: the ones vector lies in col(X[S]), but its
# residual against a computed basis (1.24x add_ones' tolerance, batched SVD) added a direction
@example(n=13, m=5, repeats=4, kind="random", w=1, stochastic=True, seed=72)
def test_keysets_match_per_row_svd(n, m, repeats, kind, w, stochastic, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        mask = torch.rand(n, n, generator=g) < 0.5
        mask[torch.arange(n), torch.randint(0, n, (n,), generator=g)] = True  # ≥ 1 key per row
    elif kind == "padding":
        real = int(torch.randint(1, n + 1, (1,), generator=g))
        mask = torch.zeros(n, n, dtype=torch.bool)
        mask[:, :real] = True
    else:
        mask = _window(n, w, causal=kind == "causal-window")
    x = _rows(g, 2, n, m, repeats)
    a = _masked_softmax(g, 2, mask)
    groups = keyset_groups(x, mask, row_ids(x))  # x plays V here
    eff = project_rows_keysets(a, groups, stochastic=stochastic)
    ref, ref_rank = _brute_force(a, x, mask, stochastic)
    torch.testing.assert_close(eff, ref, atol=1e-9, rtol=0)
    rank, dim, dim_s = keyset_ranks(groups, 2, n)
    assert torch.equal(rank if not stochastic else mask.sum(-1) - dim_s, ref_rank)
    assert torch.equal(dim, mask.sum(-1) - rank)
    for i in range(n):  # ranks against an SVD with the rank tolerance (docs/definitions.md)
        keys = mask[i].nonzero()[:, 0]
        if keys.numel():
            assert int(rank[0, i]) == exact_rank(x[0, keys], m)
    assert torch.count_nonzero(eff[:, ~mask]) == 0  # masked entries stay exactly 0
    full = (rank if not stochastic else mask.sum(-1) - dim_s) == mask.sum(-1)
    assert torch.equal(eff[full], a[full])  # full-rank key sets: copied, not rounded


def test_projection_is_not_the_identity_on_small_windows():
    """A window wider than the head width has a null space: A_eff differs from A there."""
    g = torch.Generator().manual_seed(3)
    n, m, w = 12, 2, 5
    mask = _window(n, w, causal=True)
    x = _rows(g, 1, n, m, 0)
    a = _masked_softmax(g, 1, mask)
    groups = keyset_groups(x, mask, row_ids(x))  # x plays V here
    eff = project_rows_keysets(a, groups, stochastic=False)
    _, dim, _ = keyset_ranks(groups, 1, n)
    assert dim[0].tolist() == [0, 0] + [k - 2 for k in range(3, w + 1)] + [w - 2] * (n - w)
    assert (eff - a).abs()[0, dim[0] > 0].max() > 1e-3
    # A_eff · T = A · T over each row's own keys
    torch.testing.assert_close(eff[0] @ x[0], a[0] @ x[0], atol=1e-12, rtol=0)


@pytest.mark.parametrize("variant", ["paper", "row-stochastic"])
def test_trace_with_windowed_key_mask(variant):
    """A trace whose key_mask is a sliding window takes the key-set route."""
    tr = synthetic_trace(n=14, d_v=3, causal=True, seed=5)
    n = tr.n_tokens
    mask = torch.stack([_window(n, 4, causal=True), torch.ones(n, n, dtype=torch.bool).tril()])
    logits = torch.randn(tr.attentions.shape, generator=torch.Generator().manual_seed(1))
    tr.attentions = torch.softmax(logits.masked_fill(~mask[:, None], float("-inf")), -1)
    tr.key_mask = mask
    ea = effective_attention(tr, variant, dtype=torch.float64)
    ns = null_space(tr)
    stochastic = variant == "row-stochastic"
    for layer in range(tr.n_layers):
        t = torch.einsum("hnv,hvd->hnd", tr.values[layer].double(), tr.out_proj[layer].double())
        ref, ref_rank = _brute_force(tr.attentions[layer], t, mask[layer], stochastic)
        torch.testing.assert_close(ea.effective[layer], ref, atol=1e-9, rtol=0)
        seen = mask[layer].sum(-1)
        got_rank = ns.rank[layer] if not stochastic else seen - ns.dim_stochastic[layer]
        assert torch.equal(got_rank, ref_rank)
        torch.testing.assert_close(ea.effective[layer] @ t, tr.attentions[layer].double() @ t)
    assert torch.count_nonzero(ea.effective[:, :, ~mask[0]][0]) == 0
    # the window layer has a null space only because rows see 4 keys > d_v = 3
    assert int(ns.dim[0].max()) == 1 and int(ns.dim[1].max()) == n - 3
