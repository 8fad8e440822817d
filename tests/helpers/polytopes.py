"""Exact uniform marginals of small polytopes of valid attention rows (dimension 1-3),
for the posterior sampler's Kolmogorov-Smirnov tests.

P = {x ≥ 0 : Bᵀ x = Bᵀ a} is parametrised as x = a + N z (N an orthonormal basis of
null(Bᵀ)); its vertices come from scipy's half-space intersection, and the CDF of a weight
x_j under the uniform distribution is vol(P ∩ {x_j ≤ t}) / vol(P). The clipped polytope is
the convex hull of P's vertices with x_j ≤ t and of the points where the segment between
any two vertices crosses x_j = t (every edge is such a segment, and the other segments'
crossings lie inside P ∩ {x_j = t}), so its volume is exact up to round-off.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial import ConvexHull, HalfspaceIntersection


def null_basis(basis: np.ndarray) -> np.ndarray:
    """`[s, k]` an orthonormal basis of null(Bᵀ) for B `[s, m]` with orthonormal columns."""
    full, _ = np.linalg.qr(basis, mode="complete")
    return full[:, basis.shape[1] :]


def vertices(a: np.ndarray, null: np.ndarray) -> np.ndarray:
    """`[V, k]` the vertices of {z : a + N z ≥ 0} (k ≥ 2; a > 0, so z = 0 is inside)."""
    halfspaces = np.hstack([-null, -a[:, None]])  # −N z − a ≤ 0
    return HalfspaceIntersection(halfspaces, np.zeros(null.shape[1])).intersections


def _volume(points: np.ndarray, k: int) -> float:
    if len(points) <= k:
        return 0.0
    try:
        return float(ConvexHull(points).volume)
    except Exception:  # a flat (degenerate) piece has no volume
        return 0.0


class ExactMarginal:
    """The CDF of weight j under the uniform distribution on P (dimension k of 1 to 3)."""

    def __init__(self, a: np.ndarray, null: np.ndarray, j: int) -> None:
        self.k = null.shape[1]
        self.a_j, self.n_j = float(a[j]), null[j]
        if self.k == 1:
            n = null[:, 0]
            lo = max((-a[i] / n[i] for i in range(len(a)) if n[i] > 0), default=-np.inf)
            hi = min((-a[i] / n[i] for i in range(len(a)) if n[i] < 0), default=np.inf)
            self.ends = sorted((self.a_j + self.n_j[0] * lo, self.a_j + self.n_j[0] * hi))
            return
        self.verts = vertices(a, null)
        self.values = self.a_j + self.verts @ self.n_j
        self.total = _volume(self.verts, self.k)

    def __call__(self, t: np.ndarray) -> np.ndarray:
        return np.array([self._one(float(x)) for x in np.atleast_1d(t)])

    def _one(self, t: float) -> float:
        if self.k == 1:
            lo, hi = self.ends
            return float(np.clip((t - lo) / (hi - lo), 0.0, 1.0)) if hi > lo else float(t >= lo)
        below = self.values <= t
        if below.all():
            return 1.0
        if not below.any():
            return 0.0
        pts = [self.verts[below]]
        v, f = self.verts, self.values
        lo, hi = np.nonzero(below)[0], np.nonzero(~below)[0]
        w = (t - f[lo][:, None]) / (f[hi][None, :] - f[lo][:, None])  # [L, H] in [0, 1)
        cross = v[lo][:, None, :] + w[..., None] * (v[hi][None, :, :] - v[lo][:, None, :])
        pts.append(cross.reshape(-1, self.k))
        return _volume(np.vstack(pts), self.k) / self.total
