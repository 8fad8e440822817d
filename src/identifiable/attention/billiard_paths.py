"""The compiled loop of `billiard_cpu` (numba, cached in the user cache's "posterior"
folder): kept in a file of its own so that its cache key changes only with this code."""

from __future__ import annotations

import math

import numpy as np

from identifiable.store import jitcache


@jitcache.cached("posterior", "the posterior's billiard walk", nogil=True, error_model="numpy")
def paths(x, spread, metric, length, dirs, picks, most, lo, hi, out):  # pragma: no cover
    """Chains `lo` to `hi` of `x` `[P, s]` (P = R·C, chain p on row p // C): one billiard
    path each, as `billiard.step` draws it, written to `out` `[P, s]`. `spread` `[R, s, k]`,
    `metric` `[R, s, s]` (G = S Sᵀ, symmetric), `length` `[R]`, `dirs` `[P, k]` Gaussian,
    `picks` `[P]` uniform, `most` the reflection cap."""
    chains = x.shape[0] // spread.shape[0]
    s, k = spread.shape[1], spread.shape[2]
    u = np.empty(s)
    y = np.empty(s)
    t = np.empty(s)
    for p in range(lo, hi):
        r = p // chains
        norm = 0.0
        for a in range(k):
            norm += dirs[p, a] * dirs[p, a]
        norm = max(math.sqrt(norm), 1e-300)
        for i in range(s):
            acc = 0.0
            for a in range(k):
                acc += spread[r, i, a] * dirs[p, a]
            u[i] = acc / norm
            y[i] = x[p, i]
        left = 2.0 * length[r] * picks[p]  # τ ~ U[0, 2L]
        for _ in range(most + 1):
            # the first facet met and the length to it, in passes that vectorise
            for i in range(s):
                t[i] = y[i] / -u[i] if u[i] < 0.0 else math.inf
            h = math.inf
            for i in range(s):
                h = min(h, t[i])
            j = 0
            while t[j] != h and j < s - 1:
                j += 1
            hit = h < left
            move = h if hit else left
            for i in range(s):
                y[i] = max(y[i] + move * u[i], 0.0)
            left -= move
            if not hit:
                break
            coef = 2.0 * u[j] / metric[r, j, j]  # reflect off x_j = 0: u ← u − 2 u_j / G_jj · G_j
            for i in range(s):
                u[i] -= coef * metric[r, j, i]
        for i in range(s):
            out[p, i] = x[p, i] if left > 0.0 else y[i]  # over the cap: stay
