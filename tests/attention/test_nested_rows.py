"""Causal rows in one constraint matrix (`attention/nested.py`): the interval map runs
them in row order, key order walks down them (catch-up, then dual pivots), and every
bound of either equals a plain per-key LP."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import identifiable.attention.mapwork as mapwork
from helpers.traces import engine, plain_bounds, synthetic_trace
from identifiable.attention import interval_map
from identifiable.attention.certificates import movable_keys
from identifiable.attention.linalg import add_ones, column_basis, head_factors
from identifiable.attention.nested import nested_rows


def _spy(monkeypatch) -> list:
    """Record the row sets `interval_map` hands to the engine."""
    seen: list = []
    solve = mapwork._solve_head

    def spy(args):
        seen.extend(args[0])
        return solve(args)

    monkeypatch.setattr(mapwork, "_solve_head", spy)
    return seen


@pytest.mark.parametrize("repeat", [False, True])
def test_nested_rows_equal_plain_lps_on_every_row(monkeypatch, repeat):
    """A causal head of 30 rows, d_v = 4 (m = 5): rows with a full-rank prefix run as one
    nested set; each of their bounds equals scipy's per-key LP on the row's own keys.
    With `repeat`, keys 10–19 repeat keys 0–9 (identical value rows, as repeated tokens
    give), so prefixes stay rank-deficient longer and keys have twins."""
    trace = synthetic_trace(n=30, d_v=4, d=10, causal=True, seed=11, dtype=torch.float64)
    if repeat:
        trace.values[:, :, 10:20] = trace.values[:, :, 0:10]
    seen = _spy(monkeypatch)
    orders: list = []
    solve = mapwork.bound_keys

    def record(problem, options):
        orders.append((problem.raw.shape[0], options.order))
        return solve(problem, options)

    monkeypatch.setattr(mapwork, "bound_keys", record)
    m = interval_map(trace, layers=[1], heads=[2])
    nested = [rs for rs in seen if rs.movable is not None]
    assert len(nested) == 1 and nested[0].rows.size >= 20  # the long rows went together
    assert (nested[0].rows.size, "row") in orders  # the nested set ran in row order
    assert m.fallbacks == 0 and int(m.lp_solved.sum()) > 0  # none needed HiGHS
    vf = (trace.values[1, 2].double() @ head_factors(trace.out_proj[1, 2].double())[0]).numpy()
    rs = nested[0]
    # Key order on the same set: chains walk down the rows (catch-up, then dual pivots).
    by_key = engine(rs.aq, rs.raw, rs.keys, rs.movable, order="key", block=7)
    assert by_key.fallbacks.sum() == 0
    for r in range(30):
        a = trace.attentions[1, 2, r, : r + 1].double().numpy()
        lo, hi = plain_bounds(a, vf[: r + 1])
        np.testing.assert_allclose(m.lower[0, 0, r, : r + 1].numpy(), lo, atol=1e-8, rtol=0)
        np.testing.assert_allclose(m.upper[0, 0, r, : r + 1].numpy(), hi, atol=1e-8, rtol=0)
        if r in rs.rows:
            i = int(np.flatnonzero(rs.rows == r)[0])
            np.testing.assert_allclose(by_key.lower[i, : r + 1], lo, atol=1e-8, rtol=0)
            np.testing.assert_allclose(by_key.upper[i, : r + 1], hi, atol=1e-8, rtol=0)
    assert torch.count_nonzero(m.upper[0, 0].triu(1)) == 0


def test_movable_keys_and_null_dims_equal_each_rows_own_basis():
    """The leverage 1 − a_kᵀ G_i⁻¹ a_k in the shared coordinates is the movable measure of
    row i's own orthonormal basis; null dims are |S_i| − m; short prefixes are left out."""
    g = torch.Generator().manual_seed(3)
    n, d_v = 24, 5
    vf = torch.randn(n, d_v, generator=g, dtype=torch.float64)
    vf[12] = vf[3]  # a twin key: movable from row 12 on
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    got = nested_rows(vf, mask)
    assert got is not None
    # m = rank([V F, 1]) = 6: rows 0..4 have fewer keys than m and keep their own bases
    assert got.rest.tolist() == list(range(d_v)) and got.shared[0] == d_v
    for i, r in enumerate(got.shared.tolist()):
        q, rank, _ = column_basis(vf[: r + 1])
        qa, rank_a = add_ones(q, rank)
        basis = qa[:, torch.linalg.vector_norm(qa, dim=0) > 0].numpy()
        own = movable_keys(basis) if basis.shape[1] < r + 1 else np.zeros(r + 1, dtype=bool)
        assert got.movable[i, : r + 1].tolist() == own.tolist()
        assert not got.movable[i, r + 1 :].any()
        assert int(got.null_dim[i]) == r + 1 - int(rank_a)


def test_equal_or_crossing_key_sets_are_not_nested():
    vf = torch.randn(8, 2, dtype=torch.float64)
    assert nested_rows(vf, torch.ones(8, 8, dtype=torch.bool)) is None  # bidirectional
    window = torch.ones(8, 8, dtype=torch.bool).tril() & torch.ones(8, 8, dtype=torch.bool).triu(-2)
    assert nested_rows(vf, window) is None  # sliding windows cross


def test_key_order_refuses_shrinking_key_sets():
    """Walking from a row to one that sees fewer keys would strand basic keys."""
    g = torch.Generator().manual_seed(0)
    v = torch.randn(10, 2, generator=g, dtype=torch.float64)
    q, r, _ = column_basis(v)
    qa, _ = add_ones(q, r)
    basis = qa[:, torch.linalg.vector_norm(qa, dim=0) > 0].numpy()
    allowed = np.ones((2, 10), dtype=bool)
    allowed[1, 9] = False
    a = np.where(allowed, 1.0, 0.0)
    a /= a.sum(1, keepdims=True)
    movable = np.repeat(movable_keys(basis)[None], 2, 0) & allowed
    with pytest.raises(ValueError, match="grow"):
        engine(basis.T[None], a, allowed, movable, order="key")
