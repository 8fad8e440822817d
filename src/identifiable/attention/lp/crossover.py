"""The first vertex of each row's polytope, reached from the raw row (`bound_keys`'s start).

P = {x ≥ 0 : A x = b}, A = Qᵀ (m × n) as in `solve.py`. The raw row a is in P but is
not a vertex (all its keys are > 0); the crossover walks from a to a vertex along edges
of P, so that every simplex chain starts from a feasible basis.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from identifiable.attention.lp import cache
from identifiable.utils.threads import one_blas_thread

PIVOT_TOL = 1e-9  # smallest pivot element accepted in a ratio test (here and in kernel.py)


def crossover(aq: np.ndarray, a: np.ndarray, allowed: np.ndarray, threads: int = 1) -> np.ndarray:
    """`[R, m]` a vertex basis of each row's P, reached from the raw row a (feasible).

    Args: aq `[R or 1, m, n]`, a `[R, n]`, allowed `[R, n]` (as `bound_keys`);
    threads: rows are split between up to this many threads (LAPACK and the walk
    release the GIL).

    Start from m independent columns of the row's keys (pivoted QR); every other key k with
    x_k > 0, in index order, is driven to 0 along the edge that keeps A x = b, and enters
    the basis in place of a basic key that reaches 0 first (with the value it has left).
    Every point visited stays in P; at the end every key outside the basis is 0: a vertex.
    """
    n_rows = a.shape[0]
    aq = np.require(aq, np.float64, ["C"])
    x = np.array(a, dtype=np.float64, order="C")
    allowed = np.require(allowed, bool, ["C"])
    basic = np.empty((n_rows, aq.shape[1]), dtype=np.int64)
    walk = _walker()

    def part(rows: np.ndarray) -> None:
        _starts(aq, allowed, rows, basic)
        walk(aq, x, allowed, basic, rows)

    groups = max(1, min(int(threads), n_rows))
    # Round robin: neighbouring rows (of nested causal rows: about as wide) alternate.
    parts = [np.arange(g, n_rows, groups) for g in range(groups)]
    with one_blas_thread():  # per-row LAPACK calls: BLAS threads would only contend
        if groups == 1:
            part(parts[0])
        else:
            with ThreadPoolExecutor(groups) as pool:
                for f in [pool.submit(part, p) for p in parts]:
                    f.result()
    return basic


def _starts(aq: np.ndarray, allowed: np.ndarray, rows: np.ndarray, basic: np.ndarray) -> None:
    """basic[c] = m independent columns of row c's keys (pivoted QR), for c in rows."""
    import scipy.linalg

    m = aq.shape[1]
    starts: dict[bytes, np.ndarray] = {}  # shared A: one start per distinct key set
    for c in rows:
        if aq.shape[0] > 1:
            _, _, perm = scipy.linalg.qr(aq[c], mode="economic", pivoting=True)
            basic[c] = perm[:m]
            continue
        # Rows sharing A may still see different keys (nested causal rows): each start
        # takes its columns from the row's own key set.
        key = allowed[c].tobytes()
        if key not in starts:
            idx = np.flatnonzero(allowed[c])
            _, _, perm = scipy.linalg.qr(aq[0][:, idx], mode="economic", pivoting=True)
            starts[key] = idx[perm[:m]]
        basic[c] = starts[key]


_step = numba.njit(nogil=True, error_model="numpy")


def _walker():
    """The compiled walk of `crossover` (cached on disk by numba): row by row, with one B⁻¹
    `[m, m]` at a time (the numpy walk it replaced gathered and scattered an `[R, m, m]`
    stack of inverses at each key: benchmarks/records/engine.md)."""
    return walk


@_step
def exchange(binv, col, r):
    """B⁻¹ after column r of B is replaced by the column whose B⁻¹A_k is col."""
    m = col.size
    piv = col[r]
    for j in range(m):
        binv[r, j] /= piv
    for i in range(m):
        if i != r:
            ci = col[i]
            for j in range(m):
                binv[i, j] -= ci * binv[r, j]


@_step
def lower_key(a, k, binv, xb, xc, bc, pos, col):
    """Drive x_k to 0 along the edge that keeps A x = b; k enters in place of the
    first basic key that reaches 0 before it (argmin's tie rule)."""
    m = xb.size
    for i in range(m):
        acc = 0.0
        for j in range(m):
            acc += binv[i, j] * a[j, k]
        col[i] = acc
    r, best = -1, np.inf
    for i in range(m):
        if col[i] < -PIVOT_TOL:
            ratio = max(xb[i], 0.0) / -col[i]
            if ratio < best:
                r, best = i, ratio
    xk = xc[k]
    t = min(best, xk)
    for i in range(m):  # lowering x_k by t moves x_B by t·col
        xb[i] += t * col[i]
    xc[k] = 0.0
    if best < xk:  # x_k enters at row r, keeping the value it has left
        xb[r] = xk - t
        xc[bc[r]] = 0.0
        exchange(binv, col, r)
        pos[bc[r]] = -1
        pos[k] = r
        bc[r] = k


@cache.cached(nogil=True, error_model="numpy")
def walk(aq, x, allowed, basic, rows):
    """Walk each row c of `rows` from x[c] (overwritten) to a vertex; basic[c] holds
    the start basis and receives the vertex's."""
    m, n = aq.shape[1], aq.shape[2]
    bmat, col = np.empty((m, m)), np.empty(m)
    pos = np.empty(n, dtype=np.int64)
    for c in rows:
        a = aq[0] if aq.shape[0] == 1 else aq[c]
        xc, bc = x[c], basic[c]
        pos[:] = -1
        for i in range(m):
            pos[bc[i]] = i
            for r in range(m):
                bmat[r, i] = a[r, bc[i]]
        binv = np.linalg.inv(bmat)
        xb = np.empty(m)
        for i in range(m):
            xb[i] = xc[bc[i]]
        for k in range(n):
            if pos[k] < 0 and xc[k] > 0.0 and allowed[c, k]:
                lower_key(a, k, binv, xb, xc, bc, pos, col)
