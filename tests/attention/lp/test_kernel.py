"""White-box tests of the compiled pivot (`attention/lp/kernel.py`) on one chain: the
updated inverse, reduced costs and steepest-edge weights against fresh ones, iterative
refinement, and the pool rule of row order. (Every bound the engine reports is also
checked by the verifier: tests/attention/test_engine_verify.py.)"""

from __future__ import annotations

import numpy as np

from helpers.traces import shared_rows
from identifiable.attention.lp import crossover, kernel, state


def _chain(aq: np.ndarray, a: np.ndarray, basis: np.ndarray, steep: bool):
    """One chain of the compiled engine on row 0, refactored at `basis` (`state.Chain`), and
    its problem (A, Aᵀ, b)."""
    m, n = aq.shape[1:]
    slots = state.new_slots(1, m, n)
    ch = state.chain(slots, 0)
    ch.basis[:] = basis
    ch.pos[basis] = np.arange(m)
    ch.blocked[:] = False
    ch.blocked[basis] = True
    ch.state["row"] = ch.state["brow"] = 0
    a_t = np.ascontiguousarray(aq[0].T)
    b = (aq[0] @ a[0])[None]
    assert kernel.refactor(aq[0], a_t, b, ch, np.zeros((m, m)), steep)
    return ch, (aq[0], a_t, b)


def test_compiled_pivots_keep_the_inverse_reduced_costs_and_weights():
    """60 pivots of the compiled kernel (first half, the products with A, second half)
    on random entering keys: B⁻¹ stays the inverse of the basis matrix; d equals a fresh
    tableau row; γ_k = 1 + ‖B⁻¹A_k‖² for every non-basic key (Goldfarb–Reid updates with γ_q
    taken from the column at hand; read from the stored weights instead, the relative
    error reached 3e-8 after 50 pivots). A pivot on a stale inverse is caught."""
    rng = np.random.default_rng(0)
    m, n = 20, 60
    aq = np.linalg.qr(rng.normal(size=(n, m)))[0].T[None].copy()
    a = rng.random((1, n))
    ch, (a0, a_t, _) = _chain(aq, a / a.sum(), np.arange(m), steep=True)
    basis, pos, binv, d, w = ch.basis, ch.pos, ch.binv, ch.d, ch.gamma
    key = int(basis[3])
    d[:] = -(binv[3] @ a0)
    d[basis] = 0.0
    for _ in range(60):
        if pos[key] < 0:  # the row's key left: follow a basic one
            key = int(basis[3])
            d[:] = -(binv[3] @ a0)
            d[basis] = 0.0
        k = int(rng.choice(np.flatnonzero(pos < 0)))
        col = ch.col
        kernel.column(binv, a_t, k, col)
        r = int(np.abs(col).argmax())
        kernel.pivot_basis(ch, r, col, True)
        rho, av = ch.prow @ a0, ch.v @ a0
        kernel.pivot_pricing(np.ones((1, n), bool), ch, r, k, col, rho, av, True)
    bmat = a0[:, basis]
    np.testing.assert_allclose(binv @ bmat, np.eye(m), atol=1e-9)
    fresh = np.linalg.inv(bmat) @ a0
    gamma = 1.0 + (fresh**2).sum(0)
    nonbasic = pos < 0
    assert (np.abs(w - gamma)[nonbasic] / gamma[nonbasic]).max() < 1e-10
    row = -fresh[pos[key]]
    row[basis] = 0.0
    np.testing.assert_allclose(d, row, atol=1e-9)
    binv += 1e-3 * rng.normal(size=(m, m))  # fabricated: a drifted inverse is seen as one
    assert np.abs(binv @ bmat - np.eye(m)).max() > 1e-4


def test_refinement_recovers_a_drifted_inverse_and_flags_a_wrong_one():
    """`kernel.refine`: with B⁻¹ off by a relative 1e-9 (the drift of rank-one updates) one
    refinement step gives x_B and the row e_pᵀB⁻¹ to round-off of the exact solves, where
    the drifted inverse alone is off by ~1e-9; an inverse off by 1e-4 leaves a residual
    above REFINE_TOL, so no optimum is certified on it."""
    rng = np.random.default_rng(4)
    m, n = 20, 60
    aq = np.linalg.qr(rng.normal(size=(n, m)))[0].T[None].copy()
    a = rng.random((1, n))
    ch, (a0, a_t, b) = _chain(aq, a / a.sum(), np.arange(m), steep=False)
    bmat = a0[:, :m]
    x_exact = np.linalg.solve(bmat, b[0])
    y_exact = np.linalg.solve(bmat.T, np.eye(m)[5])
    ch.state["j"] = int(ch.basis[5])
    for size, ok in ((1e-9, True), (1e-4, False)):
        ch.binv[:] = np.linalg.inv(bmat) @ (np.eye(m) + size * rng.normal(size=(m, m)))
        kernel.reload(b, ch)
        assert np.abs(ch.xb - x_exact).max() > 0.1 * size
        resid = kernel.refine(a_t, b, ch)
        assert (resid <= kernel.REFINE_TOL) is ok
        if ok:
            assert np.abs(ch.xr - x_exact).max() < 1e-14
            assert np.abs(ch.yr - y_exact).max() < 1e-14


def test_the_pool_takes_basic_keys_first():
    """Row order: the chains of a row share one pool of open keys, and a chain takes the
    open key basic at its vertex with the largest x_k (the smallest when minimising),
    else the lowest open key; −1 once the pool is empty (the pivots this saves:
    tests/attention/test_certify_map.py)."""
    aq, a, _, _ = shared_rows(30, 4, 1, seed=5)
    keys = np.ones(a.shape, bool)
    start = crossover.crossover(aq, a, keys)[0]
    ch, _ = _chain(np.ascontiguousarray(aq), a, start, steep=False)
    basis, xb = ch.basis, ch.xb
    pool = np.ones(30, dtype=bool)
    j = kernel.pool_next(ch, pool, 1, True)
    assert j == int(basis[xb.argmax()]) and not pool[j]
    assert kernel.pool_next(ch, pool, -1, True) == int(basis[xb.argmin()])
    pool[basis] = False
    lowest_open = int(np.flatnonzero(pool)[0])
    assert kernel.pool_next(ch, pool, 1, True) == lowest_open
    pool[:] = True
    assert kernel.pool_next(ch, pool, 1, False) == 0  # index order
    pool[:] = False
    assert kernel.pool_next(ch, pool, 1, True) == -1
