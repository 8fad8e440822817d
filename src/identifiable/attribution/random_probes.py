"""Tangent directions for each input token: the full basis (exact) or k random probes.

For the Jacobian block J = ∂e^l_i/∂x_j (d×d) and a d×k matrix P with orthonormal
columns, ‖J P‖_F² = Σ_a ‖J p_a‖². With P = I_d this is ‖J‖_F² exactly. With P a
Haar-random orthonormal frame, each column p_a is uniform on the unit sphere, so
E[p_a p_aᵀ] = I/d and y_a = d·‖J p_a‖² is an unbiased estimate of ‖J‖_F²; their mean
(d/k)·‖J P‖_F² is unbiased too. Any k = d orthonormal frame spans the space, so the
estimate is then exact.
"""

from __future__ import annotations

import torch

from identifiable.errors import IdentifiableError


def check_probes(probes: int | None, d: int) -> int:
    """Number of tangents per input token: d for exact mode, else the validated k."""
    if probes is None:
        return d
    if isinstance(probes, bool) or not isinstance(probes, int):
        raise IdentifiableError(f"probes must be a whole number between 1 and {d}, got {probes!r}")
    if not 1 <= probes <= d:
        raise IdentifiableError(
            f"probes must be between 1 and the model width d = {d} (k = d is exact), got {probes}"
        )
    return probes


def random_orthonormal(d: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """A Haar-random d×k matrix with orthonormal columns (float64).

    QR of a Gaussian matrix, with the signs of R's diagonal moved into Q so that the
    distribution is exactly Haar (plain QR output is biased by the sign convention).
    """
    g = torch.randn(d, k, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(g)
    signs = torch.sign(torch.diagonal(r))
    signs[signs == 0] = 1.0
    return q * signs


class ProbeBank:
    """Probe vectors of every input token, generated lazily and in token order.

    Token j's probes depend only on (seed, j) through one generator advanced in token
    order, so results do not depend on how tangents are chunked.
    """

    def __init__(self, n: int, d: int, probes: int | None, seed: int) -> None:
        self.n, self.d = n, d
        self.k = check_probes(probes, d)
        self.exact = probes is None
        self._gen = torch.Generator().manual_seed(int(seed))
        self._next = 0
        self._cache: dict[int, torch.Tensor] = {}

    def frame(self, j: int) -> torch.Tensor:
        """`[d, k]` orthonormal columns for token j (identity in exact mode)."""
        if self.exact:
            return torch.eye(self.d, dtype=torch.float64)
        while self._next <= j:
            self._cache[self._next] = random_orthonormal(self.d, self.k, self._gen)
            self._next += 1
        return self._cache[j]

    def release_before(self, j: int) -> None:
        """Forget frames of tokens < j (chunks move forward through tokens)."""
        for t in [t for t in self._cache if t < j]:
            del self._cache[t]

    def directions(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Flat tangents start..stop-1 (flat index p = j·k + a).

        Returns:
            tokens: `[B]` int64, the input token j of each tangent.
            vectors: `[B, d]` float64, the direction within token j's coordinates.
        """
        flat = torch.arange(start, stop)
        tokens = flat // self.k
        cols = flat % self.k
        if self.exact:  # coordinate basis vectors e_a, no d×d frame needed
            vectors = torch.zeros(stop - start, self.d, dtype=torch.float64)
            vectors[torch.arange(stop - start), cols] = 1.0
            return tokens, vectors
        vectors = torch.empty(stop - start, self.d, dtype=torch.float64)
        for j in tokens.unique().tolist():
            sel = tokens == j
            vectors[sel] = self.frame(j)[:, cols[sel]].T
        self.release_before(int(tokens[0]))
        return tokens, vectors
