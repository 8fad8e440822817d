"""The first vertex of each row's polytope, reached from the raw row (`interval_simplex`'s start).

P = {x ≥ 0 : A x = b}, A = Qᵀ (m × n) as in `simplex.py`. The raw row a is in P but is
not a vertex (all its keys are > 0); the crossover walks from a to a vertex along edges
of P, so that every simplex chain starts from a feasible basis.
"""

from __future__ import annotations

import numpy as np

PIVOT_TOL = 1e-9  # smallest pivot element accepted in a ratio test (here and in kernel.py)


def crossover(aq: np.ndarray, a: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """`[R, m]` a vertex basis of each row's P, reached from the raw row a (feasible).

    Args: aq `[R or 1, m, n]`, a `[R, n]`, allowed `[R, n]` (as `interval_simplex`).

    Start from m independent columns of the row's keys (pivoted QR); every other key k with x_k > 0 is
    driven to 0 along the edge that keeps A x = b, and enters the basis in place of a
    basic key that reaches 0 first (with the value it has left). Every point visited
    stays in P; at the end every key outside the basis is 0: a vertex. All rows step
    together, one key at a time.
    """
    import scipy.linalg

    n_rows, n = a.shape
    shared = aq.shape[0] == 1
    m = aq.shape[1]
    x = a.copy()
    basic = np.empty((n_rows, m), dtype=np.int64)
    starts: dict[bytes, np.ndarray] = {}  # shared A: one start per distinct key set
    for c in range(n_rows):
        if not shared:
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
    pos = np.full((n_rows, n), -1, dtype=np.int64)
    np.put_along_axis(pos, basic, np.arange(m)[None, :], axis=1)
    bmat = (
        aq[0][:, basic].transpose(1, 0, 2)
        if shared
        else np.take_along_axis(aq, basic[:, None, :], axis=2)
    )
    binv = np.linalg.inv(bmat)
    xb = np.take_along_axis(x, basic, 1)
    all_c = np.arange(n_rows)
    for k in range(n):
        cs = all_c[(pos[:, k] < 0) & (x[:, k] > 0.0) & allowed[:, k]]
        if cs.size == 0:
            continue
        a_k = aq[0][:, k][None] if shared else aq[cs, :, k]
        col = np.matmul(binv[cs], a_k[:, :, None])[:, :, 0]
        neg = col < -PIVOT_TOL
        ratios = np.where(neg, np.maximum(xb[cs], 0.0) / np.where(neg, -col, 1.0), np.inf)
        r = ratios.argmin(1)
        best = ratios[np.arange(cs.size), r]
        xk = x[cs, k]
        t = np.minimum(best, xk)
        xb[cs] += t[:, None] * col  # lowering x_k by t moves x_B by t·col
        x[cs, k] = 0.0
        enter = best < xk
        if enter.any():
            ce, re, left, cole = cs[enter], r[enter], (xk - t)[enter], col[enter]
            ar = np.arange(ce.size)
            # x_k enters at the row that reached 0, keeping the value it has left.
            xb[ce, re] = left
            leaving = basic[ce, re]
            x[ce, leaving] = 0.0  # the key leaving sits at 0 from now on
            b_e = binv[ce]
            prow = b_e[ar, re] / cole[ar, re][:, None]
            b_e -= cole[:, :, None] * prow[:, None, :]
            b_e[ar, re] = prow
            binv[ce] = b_e
            pos[ce, leaving] = -1
            pos[ce, k] = re
            basic[ce, re] = k
    return basic
