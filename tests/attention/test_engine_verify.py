"""The independent check of the engine's bounds (`attention.lp.failures`): it accepts what the
engine certifies, and refuses a basis one pivot away from it, a bound its vertex does not
attain, and bounds outside what the raw row proves."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.traces import engine, shared_rows
from identifiable.attention.lp import Certificates, failures, outer_failures, vertex


@pytest.fixture(scope="module")
def solved():
    aq, a, movable, _ = shared_rows(n=30, d_v=5, rows=3, seed=21)
    allowed = np.ones(a.shape, bool)
    sol = engine(aq, a, allowed, movable, chains_per_row=4, order="row", keep_vertices=True)
    return aq, a, allowed, sol


def _one(certs: Certificates, t: int, basis: np.ndarray) -> Certificates:
    """Certificate t alone, with its basis replaced."""
    s = slice(t, t + 1)
    return Certificates(certs.rows[s], certs.keys[s], certs.senses[s], basis[None])


def test_the_engines_bounds_pass(solved):
    aq, a, allowed, sol = solved
    certs = sol.certificates
    assert len(certs) == int(sol.lp_solved.sum()) > 20  # every LP the simplex settled
    assert failures(aq, a, allowed, sol.lower, sol.upper, certs) == []
    for t in range(len(certs)):  # each certificate's vertex is the witness kept
        q, j, s = int(certs.rows[t]), int(certs.keys[t]), int(certs.senses[t])
        x = vertex(a[q], aq[0], certs.bases[t])
        np.testing.assert_allclose(x, sol.vertices[(q, j, s)], atol=1e-12)


def _maxima_with_basic_key(sol) -> list[int]:
    c = sol.certificates
    return [t for t in range(len(c)) if c.senses[t] > 0 and c.keys[t] in c.bases[t]]


def test_one_flipped_pivot_is_refused(solved):
    """Each optimal basis with one key swapped for a key outside it (a pivot the engine did
    not make): infeasible, singular or not optimal, the check refuses every one."""
    aq, a, allowed, sol = solved
    certs = sol.certificates
    refused = 0
    for t in _maxima_with_basic_key(sol)[:10]:
        basis = certs.bases[t].copy()
        out = np.setdiff1d(np.arange(a.shape[1]), basis)
        p = int(np.flatnonzero(basis != certs.keys[t])[0])
        for k in out[:5]:
            basis[p] = k
            bad = failures(aq, a, allowed, sol.lower, sol.upper, _one(certs, t, basis))
            refused += len(bad) == 1
    assert refused == 50


def _neighbour(a_row, raw, basis, j):
    """A feasible vertex one primal pivot from `basis` that lowers x_j (the ratio test done
    here in numpy), or None: (its basis, its x_j)."""
    bmat = a_row[:, basis]
    xb = np.linalg.solve(bmat, a_row @ raw)
    for k in np.setdiff1d(np.arange(raw.size), basis):
        col = np.linalg.solve(bmat, a_row[:, k])
        p = int(np.flatnonzero(basis == j)[0])
        pos = col > 1e-9
        if col[p] <= 1e-9:
            continue  # entering k would not lower x_j
        ratios = np.where(pos, xb / np.where(pos, col, 1.0), np.inf)
        r = int(np.argmin(ratios))
        if ratios[r] <= 1e-9 or r == p:
            continue  # a degenerate step, or j itself leaves
        new = basis.copy()
        new[r] = k
        return new, float(xb[p] - ratios[r] * col[p])
    return None


def test_a_feasible_neighbour_is_refused_by_its_reduced_costs(solved):
    """A primal pivot away from the optimum gives another vertex of P, feasible, whose x_j
    is lower; even reported as the bound (so that the vertex attains it), the sign of
    its reduced costs shows that it is not the maximum."""
    aq, a, allowed, sol = solved
    certs = sol.certificates
    checked = 0
    for t in _maxima_with_basic_key(sol):
        q, j = int(certs.rows[t]), int(certs.keys[t])
        step = _neighbour(aq[0], a[q], certs.bases[t], j)
        if step is None:
            continue
        basis, value = step
        upper = sol.upper.copy()
        upper[q, j] = max(value, a[q, j])
        if value < a[q, j]:
            continue  # the outer check alone would refuse it
        bad = failures(aq, a, allowed, sol.lower, upper, _one(certs, t, basis))
        assert len(bad) == 1 and "reduced cost" in bad[0], bad
        checked += 1
    assert checked >= 5


def test_a_bound_the_vertex_does_not_attain_is_refused(solved):
    aq, a, allowed, sol = solved
    t = _maxima_with_basic_key(sol)[0]
    q, j = int(sol.certificates.rows[t]), int(sol.certificates.keys[t])
    upper = sol.upper.copy()
    upper[q, j] += 1e-6
    bad = failures(aq, a, allowed, sol.lower, upper, _one(sol.certificates, t,
                          sol.certificates.bases[t]))  # fmt: skip
    assert len(bad) == 1 and "not the reported" in bad[0]


@pytest.mark.parametrize("what", ["upper below raw", "lower negative", "upper above total",
                                  "outside the key set"])  # fmt: skip
def test_bounds_outside_what_the_raw_row_proves_are_refused(solved, what):
    _, a, allowed, sol = solved
    lower, upper, allowed = sol.lower.copy(), sol.upper.copy(), allowed.copy()
    if what == "upper below raw":
        upper[1, 3] = a[1, 3] - 1e-6
    elif what == "lower negative":
        lower[1, 3] = -1e-6
    elif what == "upper above total":
        upper[1, 3] = a[1].sum() + 1e-6
    else:
        allowed[1, 3] = False
    bad = outer_failures(a, allowed, lower, upper)
    assert len(bad) == 1 and bad[0].startswith("row 1: key 3")
