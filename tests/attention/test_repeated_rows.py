"""Repeated value rows: where the distinct rows of T are independent, the ones vector lies in
col(T) exactly, so the row-stochastic constraint Σã = 1 adds nothing (`linalg.ones_inside`).

Repeated tokens give such heads wherever V carries no position (a first layer with relative
or rotary positions). Deciding it from the ones vector's residual against a computed basis
once added a spurious constraint: certified intervals came out narrower than the exact
polytope's (by up to 0.22 on the trace below) and dim LN([T, 1]) one too small. The
references here are independent: HiGHS on the explicit polytope, and one SVD of [T, s·1].
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linprog

from helpers.traces import synthetic_trace
from identifiable.attention import attention_intervals, interval_map, null_space
from identifiable.attention.linalg import column_basis, ones_inside, row_ids

N = 12


def _repeated(seed: int, causal: bool = False):
    """A one-head trace whose n = 12 value rows repeat u < 9 distinct rows, scaled over
    three decades (condition numbers of 10²–10³, where the residual test went wrong)."""
    g = torch.Generator().manual_seed(seed)
    tr = synthetic_trace(
        n=N, d_v=16, d=32, heads=1, layers=1, causal=causal, seed=seed, dtype=torch.float64
    )
    u = int(torch.randint(4, 9, (1,), generator=g))
    idx = torch.cat([torch.arange(u), torch.randint(0, u, (N - u,), generator=g)])
    scale = torch.logspace(0, -3, N, dtype=torch.float64)
    tr.values = (tr.values[:, :, :u] * scale[:u][None, None, :, None])[:, :, idx].contiguous()
    return tr


def _highs(tr, row: int) -> tuple[np.ndarray, np.ndarray]:
    """min and max of ã_j over {ã ≥ 0 on the row's keys, Σã = 1, ã·T = a·T}, per key."""
    keys = tr.keys_seen(0)[row].nonzero().flatten()
    t = (tr.values[0, 0, keys] @ tr.out_proj[0, 0]).numpy()
    a_eq = np.vstack([t.T, np.ones((1, len(keys)))])
    b_eq = a_eq @ tr.attentions[0, 0, row, keys].numpy()
    lo, hi = np.zeros(tr.n_keys), np.zeros(tr.n_keys)
    for k, j in enumerate(keys.tolist()):
        c = np.zeros(len(keys))
        c[k] = 1.0
        lo[j] = linprog(c, A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs").fun
        hi[j] = -linprog(-c, A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs").fun
    return lo, hi


def _dim_stochastic(tr, row: int) -> int:
    """dim LN([T, s·1]) over the row's keys from one SVD with the rank tolerance."""
    keys = tr.keys_seen(0)[row].nonzero().flatten()
    t = tr.values[0, 0, keys] @ tr.out_proj[0, 0]
    ones = torch.full((len(keys), 1), len(keys) ** -0.5, dtype=t.dtype)
    ta = torch.cat([t, ones * torch.linalg.matrix_norm(t, ord=2)], -1)
    return len(keys) - int(column_basis(ta, width=ta.shape[1])[1])


@pytest.mark.parametrize("seed", [50, 7])
def test_intervals_of_repeated_rows_equal_highs(seed):
    """Seed 50: the trace whose intervals were too narrow (its rows 0-2 by 0.06-0.22)."""
    tr = _repeated(seed)
    whole = interval_map(tr, layers=[0], heads=[0])
    for row in range(3):
        lo, hi = _highs(tr, row)
        iv = attention_intervals(tr, 0, 0, row)
        np.testing.assert_allclose(iv.lower.numpy(), lo, atol=1e-7)
        np.testing.assert_allclose(iv.upper.numpy(), hi, atol=1e-7)
        assert iv.null_dim == _dim_stochastic(tr, row)
        np.testing.assert_allclose(whole.lower[0, 0, row].numpy(), lo, atol=1e-7)
        np.testing.assert_allclose(whole.upper[0, 0, row].numpy(), hi, atol=1e-7)


def test_causal_map_of_repeated_rows_equals_highs():
    """The nested-row route (one constraint matrix for the growing prefixes)."""
    tr = _repeated(50, causal=True)
    whole = interval_map(tr, layers=[0], heads=[0])
    for row in range(N):
        lo, hi = _highs(tr, row)
        np.testing.assert_allclose(whole.lower[0, 0, row].numpy(), lo, atol=1e-7)
        np.testing.assert_allclose(whole.upper[0, 0, row].numpy(), hi, atol=1e-7)


@pytest.mark.parametrize("causal", [False, True])
def test_null_space_of_repeated_rows_matches_one_svd(causal):
    for seed in range(40):
        tr = _repeated(seed, causal)
        ns = null_space(tr)
        for row in range(N):
            assert int(ns.dim_stochastic[0, 0, row]) == _dim_stochastic(tr, row), (seed, row)


def test_ones_inside_needs_independent_distinct_rows():
    """Fabricated: rows (a, b, a) of rank 2 hold the ones vector; rank 1 (b a multiple of
    a) does not, nor do three distinct rows of rank 2 (the tolerance decides there)."""
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]], [[1.0, 2.0], [3.0, 4.0], [5.0, 7.0]]])
    ids = row_ids(x)
    assert ids[0, 0] == ids[0, 2] != ids[0, 1]
    assert ones_inside(torch.tensor([2, 2]), ids).tolist() == [True, False]
    assert ones_inside(torch.tensor([1, 3]), ids).tolist() == [False, True]


def test_row_ids_group_rows_as_torch_unique_does():
    """The keyed ids against `torch.unique` over whole rows, on float rows copied to random
    places (equal rows must share an id, different rows must not)."""
    g = torch.Generator().manual_seed(2)
    for h, n, m in [(32, 1024, 128), (3, 1000, 7), (1, 10, 3)]:
        v = torch.randn(h, n, m, dtype=torch.float64, generator=g)
        src, dst = torch.randint(0, n, (2, n // 3), generator=g)
        v[:, dst] = v[:, src]
        ids = row_ids(v.transpose(-1, -2).contiguous().transpose(-1, -2))  # a strided view
        ref = torch.unique(v.reshape(-1, m), dim=0, return_inverse=True)[1].reshape(h, n)
        assert torch.equal(
            ids[..., :, None] == ids[..., None, :], ref[..., :, None] == ref[..., None, :]
        )
        assert int(ids.max()) + 1 == int(ref.max()) + 1


@pytest.mark.parametrize("causal", [False, True])
def test_a_nearly_fixed_key_is_solved_not_settled(causal):
    """Key 3 of this row moves by 1.3e-5 over P although ‖(I − QQᵀ)e_3‖² < 1e-9, the
    cut-off below which keys were once settled at a_j without an LP (certificates.
    movable_keys); attention_intervals and interval_map (per-row bases, and the nested
    rows of a causal head) now solve it, and agree with HiGHS."""
    g = torch.Generator().manual_seed(158)  # test_certificates._problem(5, 2, 158, True)
    v = torch.randn(5, 2, generator=g, dtype=torch.float64)
    v[1] = v[0]
    a = torch.softmax(torch.randn(5, generator=g, dtype=torch.float64) * 2, 0)
    tr = synthetic_trace(n=5, d_v=2, d=2, heads=1, layers=1, causal=causal, dtype=torch.float64)
    tr.values[0, 0] = v
    tr.out_proj[0, 0] = torch.eye(2, dtype=torch.float64)
    tr.attentions[0, 0, 4] = a  # the last row sees every key either way
    lo, hi = _highs(tr, 4)
    assert hi[3] - lo[3] > 1e-5
    iv = attention_intervals(tr, 0, 0, 4)
    whole = interval_map(tr, layers=[0], heads=[0])
    for got_lo, got_hi in ((iv.lower, iv.upper), (whole.lower[0, 0, 4], whole.upper[0, 0, 4])):
        np.testing.assert_allclose(got_lo.numpy(), lo, atol=1e-9)
        np.testing.assert_allclose(got_hi.numpy(), hi, atol=1e-9)
