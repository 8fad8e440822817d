"""Certificates of non-identifiability (docs/definitions.md#intervals), beyond the paper.

For one head and query row with raw weights a (the keys the row can see), the
set of attention rows that produce the same head output is the polytope
    P = {ã ≥ 0 : (ã − a) Q = 0},
where Q (n×r') is an orthonormal basis of col([T, 1]): (ã − a) ⟂ col(T) keeps
ã T = a T, and ⟂ 1 keeps Σã = Σa (= 1). Orthonormal equality rows make the
LP solver's absolute feasibility tolerance a meaningful relative one.

- `witness_lp` finds the vertex of P that minimises the weight of the row's
  largest key that the null space can move at all (normally the argmax).
- `interval_lp` gives min and max of ã_j over P for every key j: up to 2n
  LPs (HiGHS), minus those settled without solving: keys the null space
  cannot touch are fixed at a_j, and a key that is 0 (or 1) at any vertex
  already found has its min (max) proved, since P ⊂ [0, 1]^n.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from identifiable.attention.lp import BoundProblem, solve_lp

# `witness_lp` moves a key whose ‖component in LN([T, 1])‖² exceeds this (a visible move);
# bounds never use it (`movable_keys`)
MOVABLE_TOL = 1e-9


@dataclass(frozen=True)
class WitnessSolution:
    """Result of `witness_lp` (all arrays `[n]` float64)."""

    weights: np.ndarray | None
    key: int | None
    reason: str


def movable_keys(basis: np.ndarray) -> np.ndarray:
    """`[n]` bool: keys whose bounds take an LP: all of them where dim LN([T, 1]) > 0.

    A key whose unit vector lies in col([T, 1]) cannot move, but no computed test says so
    exactly: the residual ‖(I − QQᵀ)e_j‖² of a computed basis is accurate to ~1e-10 only
    (Cholesky QR is orthonormal to eps·κ²), and a key below the old cut-off of 1e-9 moved
    by 1.3e-5 (tests/attention/test_certificates.py, the example with seed 158). The LP of a
    key that truly cannot move has an objective constant on P, so it should end at its
    first vertex (reasoned; such keys were not met on the benchmark heads).

    Args: basis `[n, r']` orthonormal columns spanning col([T, 1]).
    """
    n, r = basis.shape
    return np.full(n, r < n)


def witness_lp(a: np.ndarray, basis: np.ndarray) -> WitnessSolution:
    """A different valid row ã ∈ P, moving as much mass as possible off one key.

    Args:
        a: `[n]` raw weights (≥ 0, summing to 1).
        basis: `[n, r']` orthonormal basis of col([T, 1]) for the keys the row sees.
    Returns: the vertex minimising ã_key, key = argmax of a over movable keys.
    """
    n, r = basis.shape
    if r >= n:
        return WitnessSolution(None, None, f"dim LN([T, 1]) = 0 ({n} keys, rank([T, 1]) = {r})")
    movable = 1.0 - (basis**2).sum(1) > MOVABLE_TOL  # keys that visibly move
    key = int(np.argmax(np.where(movable, a, -np.inf)))
    x = solve_lp(np.eye(n)[key], basis, a, f"minimising the weight of key {key}")
    if np.abs(x - a).sum() <= 1e-9:
        return WitnessSolution(
            None, None, "the optimum is the raw row itself (degenerate null space)"
        )
    return WitnessSolution(x, key, "")


def interval_lp(a: np.ndarray, basis: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Min and max of each ã_j over P.

    Args: as `witness_lp`.
    Returns: lower `[n]`, upper `[n]`, number of LPs solved.
    """
    n = a.shape[0]
    lower, upper = a.copy(), a.copy()
    movable = movable_keys(basis)
    seen_min, seen_max = a.copy(), a.copy()  # bounds from vertices found so far
    done_min = ~movable
    solved = 0

    def record(x: np.ndarray) -> None:
        np.minimum(seen_min, x, out=seen_min)
        np.maximum(seen_max, x, out=seen_max)

    for j in np.flatnonzero(movable):  # maxima first: each vertex proves many minima = 0
        if seen_max[j] >= 1.0 - 1e-12:
            upper[j] = 1.0
            continue
        x = solve_lp(-np.eye(n)[j], basis, a, f"maximising the weight of key {j}")
        solved += 1
        record(x)
        upper[j] = x[j]
    for j in np.flatnonzero(~done_min):
        if seen_min[j] <= 1e-12:
            lower[j] = 0.0
            continue
        x = solve_lp(np.eye(n)[j], basis, a, f"minimising the weight of key {j}")
        solved += 1
        record(x)
        lower[j] = x[j]
    # A vertex of P is its own certificate; keep the reported interval containing a.
    return np.minimum(lower, a), np.maximum(upper, a), solved


def output_residual(x: Tensor, a: Tensor, values: Tensor, out_proj: Tensor) -> float:
    """‖(ã − a) T‖ / ‖a T‖ with T = V H formed explicitly (an independent check).

    Args: x, a `[n]`; values `[n, d_v]`; out_proj `[d_v, d]`; float64.
    """
    ref = (a @ values) @ out_proj
    diff = ((x - a) @ values) @ out_proj
    return float(torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(ref).clamp_min(1e-300))


def row_problem(a: np.ndarray, basis: np.ndarray, what: str = "") -> BoundProblem:
    """One row's problem for `lp.bound_keys` (a `[n]`, basis `[n, r']` as `witness_lp`)."""
    n = a.shape[0]
    movable = movable_keys(basis)
    allowed = np.ones((1, n), dtype=bool)
    return BoundProblem(
        basis.T[None].copy(), a[None].astype(np.float64), allowed, movable[None], what
    )
