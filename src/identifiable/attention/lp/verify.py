"""An independent check of reported bounds: plain numpy, no code shared with the pivots.

Each bound an LP settled comes with its final basis (a `Certificates` record). For
maximising s·x_j over P = {x ≥ 0 : A x = b} at a basis B (m keys of the row):

1. B is rebuilt from A's columns and x_B = B⁻¹b solved afresh (LAPACK's LU, one step of
   iterative refinement);
2. primal feasibility: x_B ≥ −feas_tol (the vertex x̂ is a point of P);
3. the reduced costs d_k = −s·(e_pᵀB⁻¹A)_k (p the row of j in B; with j non-basic the
   maximum is not certified, the minimum is 0 since x ≥ 0) are ≤ dual_tol on every key of
   the row outside B: then s·x_j ≤ s·x̂_j + dual_tol·Σa on all of P;
4. the witness attains the bound: x̂_j equals the reported bound within match_tol.

Every bound, LP or shortcut, is also checked to be a valid outer bound of a point of P
that is known without any LP: 0 ≤ lower ≤ a ≤ upper ≤ Σa (a ∈ P ⊂ [0, Σa]ⁿ).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import scipy.linalg


@dataclass(frozen=True)
class Tolerances:
    """What the verifier accepts (docs/certified_attention.md, "The verifier").

    Attributes:
        feas: basic values down to −feas count as 0 (the engine's own cut-off is 1e-10).
        dual: largest reduced cost: the bound is then within dual·Σa of the optimum (the
            engine certifies 1e-11; the margin covers this check's own round-off).
        match: |x̂_j − reported bound| allowed.
    """

    feas: float = 1e-9
    dual: float = 1e-10
    match: float = 1e-10


@dataclass(frozen=True)
class Certificates:
    """The final bases of some LPs of one solve (`K` records).

    Attributes:
        rows, keys, senses: `[K]` int64: the LP max senses·x_keys over the row's P.
        bases: `[K, m]` int64 the keys of the final basis, in basis order.
    """

    rows: np.ndarray
    keys: np.ndarray
    senses: np.ndarray
    bases: np.ndarray

    @staticmethod
    def empty(m: int) -> Certificates:
        none = np.zeros(0, dtype=np.int64)
        return Certificates(none, none.copy(), none.copy(), np.zeros((0, m), dtype=np.int64))

    def __len__(self) -> int:
        return int(self.rows.size)


def outer_failures(
    raw: np.ndarray, allowed: np.ndarray, lower: np.ndarray, upper: np.ndarray, tol: float = 1e-12
) -> list[str]:
    """Bounds that are not valid outer bounds by the points known without an LP (see the
    module docstring): `[R, n]` arrays; one line per failing row."""
    total = raw.sum(1, keepdims=True)
    bad = (
        (lower < -tol)
        | (lower > raw + tol)
        | (upper < raw - tol)
        | (upper > total + tol)
        | (~allowed & ((lower != 0) | (upper != 0)))
    )
    return [
        f"row {q}: key {int(np.flatnonzero(bad[q])[0])} has bounds "
        f"[{lower[q, np.flatnonzero(bad[q])[0]]:.6g}, {upper[q, np.flatnonzero(bad[q])[0]]:.6g}] "
        f"outside [0, {total[q, 0]:.6g}] or not around its raw weight"
        for q in np.flatnonzero(bad.any(1))
    ]


def certificate_failure(
    a_row: np.ndarray,
    raw: np.ndarray,
    allowed: np.ndarray,
    key: int,
    sense: int,
    basis: np.ndarray,
    bound: float,
    tol: Tolerances = Tolerances(),
) -> str | None:
    """Why one LP's certificate fails (None: it holds). a_row `[m, n]` is A of the row,
    raw `[n]` its weights, allowed `[n]` its keys; the rest as `Certificates`."""
    m = a_row.shape[0]
    if basis.size != m or np.unique(basis).size != m or not allowed[basis].all():
        return f"the basis {basis.tolist()} is not {m} distinct keys of the row"
    bmat = a_row[:, basis]
    b = a_row @ raw
    with warnings.catch_warnings():
        warnings.simplefilter("error", scipy.linalg.LinAlgWarning)
        try:
            lu = scipy.linalg.lu_factor(bmat, check_finite=False)
        except (np.linalg.LinAlgError, ValueError, scipy.linalg.LinAlgWarning):
            return "the basis matrix is singular"
    xb = scipy.linalg.lu_solve(lu, b)
    xb += scipy.linalg.lu_solve(lu, b - bmat @ xb)
    if not np.isfinite(xb).all() or xb.min() < -tol.feas:
        return f"the basis is not primal feasible (min x_B = {xb.min():.3g})"
    hits = np.flatnonzero(basis == key)
    if hits.size == 0:
        if sense < 0 and abs(bound) <= tol.match:
            return None  # x_j = 0 at a point of P, and x ≥ 0 on P: the minimum is 0
        return f"key {key} is not basic, so its bound {bound:.6g} is not certified"
    p = int(hits[0])
    e = np.zeros(m)
    e[p] = 1.0
    y = scipy.linalg.lu_solve(lu, e, trans=1)
    y += scipy.linalg.lu_solve(lu, e - bmat.T @ y, trans=1)
    d = -sense * (y @ a_row)
    d[basis] = 0.0
    d[~allowed] = 0.0
    worst = int(np.argmax(d))
    if d[worst] > tol.dual:
        return f"the reduced cost of key {worst} is {d[worst]:.3g} > {tol.dual:g}: not optimal"
    value = max(float(xb[p]), 0.0)
    if abs(value - bound) > tol.match:
        return f"the vertex gives {value:.12g}, not the reported {bound:.12g}"
    return None


def failures(
    aq: np.ndarray,
    raw: np.ndarray,
    allowed: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    certs: Certificates,
    tol: Tolerances = Tolerances(),
) -> list[str]:
    """Every failure of the reported bounds of rows raw `[R, n]` (A `[R or 1, m, n]`, key
    sets allowed `[R, n]`, bounds lower/upper `[R, n]`) and their certificates; [] when
    everything holds."""
    out = outer_failures(raw, allowed, lower, upper)
    for t in range(len(certs)):
        q, j, s = int(certs.rows[t]), int(certs.keys[t]), int(certs.senses[t])
        a_row = aq[0 if aq.shape[0] == 1 else q]
        bound = float((upper if s > 0 else lower)[q, j])
        why = certificate_failure(a_row, raw[q], allowed[q], j, s, certs.bases[t], bound, tol)
        if why is not None:
            out.append(f"row {q}, key {j}, {'max' if s > 0 else 'min'}: {why}")
    return out


def vertex(raw: np.ndarray, a_row: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """The vertex `[n]` of a basis (x_B = B⁻¹b, other keys 0), solved afresh."""
    bmat = a_row[:, basis]
    b = a_row @ raw
    xb = np.linalg.solve(bmat, b)
    x = np.zeros(raw.size)
    x[basis] = np.maximum(xb, 0.0)
    return x
