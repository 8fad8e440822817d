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
from scipy.optimize import linprog
from torch import Tensor

from identifiable.errors import IdentifiableError

_LP_OPTIONS = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}
MOVABLE_TOL = 1e-9  # a key is movable if ‖its component in LN([T, 1])‖² exceeds this


@dataclass(frozen=True)
class WitnessSolution:
    """Result of `witness_lp` (all arrays `[n]` float64)."""

    weights: np.ndarray | None
    key: int | None
    reason: str


def movable_keys(basis: np.ndarray) -> np.ndarray:
    """`[n]` bool: keys whose unit vector has a component in LN([T, 1]).

    Args: basis `[n, r']` orthonormal columns spanning col([T, 1]).
    """
    return 1.0 - (basis**2).sum(1) > MOVABLE_TOL


def _solve(c: np.ndarray, basis: np.ndarray, a: np.ndarray, what: str) -> np.ndarray:
    res = linprog(
        c, A_eq=basis.T, b_eq=basis.T @ a, bounds=(0, None), method="highs", options=_LP_OPTIONS
    )
    if res.status != 0 or res.x is None:
        raise IdentifiableError(f"the LP solver (HiGHS) failed while {what}: {res.message}")
    return polish(np.asarray(res.x, dtype=np.float64), basis, a)


def polish(x: np.ndarray, basis: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Put an LP solution back on the affine set (ã − a) Q = 0 exactly, then clip rounding negatives."""
    x = x - basis @ (basis.T @ (x - a))
    return np.where(x < 0, 0.0, x)


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
    movable = movable_keys(basis)
    key = int(np.argmax(np.where(movable, a, -np.inf)))
    x = _solve(np.eye(n)[key], basis, a, f"minimising the weight of key {key}")
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
    movable = movable_keys(basis) if basis.shape[1] < n else np.zeros(n, dtype=bool)
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
        x = _solve(-np.eye(n)[j], basis, a, f"maximising the weight of key {j}")
        solved += 1
        record(x)
        upper[j] = x[j]
    for j in np.flatnonzero(~done_min):
        if seen_min[j] <= 1e-12:
            lower[j] = 0.0
            continue
        x = _solve(np.eye(n)[j], basis, a, f"minimising the weight of key {j}")
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


# ---- warm-started simplex for whole interval maps ---------------------------------------
#
# P = {x ≥ 0 : A x = b} with A = Qᵀ (m × n, m = rank([T, 1]) ≤ d_v + 1, usually m ≪ n) and
# b = A a. A vertex of P is a basis: m keys whose columns of A are independent, all other
# keys at 0. The tableau W = A_B⁻¹ [A | b] (m × (n + 1)) is small, so a pivot costs one
# m × n rank-one update, and every LP "min or max x_j over P" starts from the optimal vertex
# of the previous one: the 2n LPs of a row share one feasible region and differ only in
# their objective, so each needs few pivots (often none or one).
#
# Optimality is certified, not assumed: with the tableau refactored from scratch at the
# final basis, the reduced costs d_k of maximising s·x_j (s = ±1) are d_k = −s W[p, k]
# (p the row of j in the basis). For every x ∈ P, s·x_j = s·x̂_j + Σ_{k ∉ B} d_k x_k ≤
# s·x̂_j + max(d, 0)·Σ_k x_k = s·x̂_j + max(d, 0)·Σa. So reduced costs ≤ OPT_TOL bound the
# gap to the true optimum by OPT_TOL·Σa (Σa = 1): the reported bound is exact to ~1e-11.
# The vertex x̂ itself is the witness that the bound is attained.

OPT_TOL = 1e-11  # largest reduced cost accepted at an optimum (bounds the gap, see above)
_PIVOT_TOL = 1e-9  # smallest pivot element accepted in a ratio test
_FEAS_TOL = 1e-10  # basic values down to −_FEAS_TOL count as 0 (round-off)
_REFACTOR_EVERY = 25  # pivots between refactorisations of the tableau


_PIVOTS_PER_LP = 400  # an LP still open after this many pivots goes to HiGHS


@dataclass(frozen=True)
class IntervalSolution:
    """Result of `interval_simplex` for a batch of rows (arrays over keys, float64).

    Attributes:
        lower, upper: `[R, n]` min and max of x_j over each row's P (keys outside
            the row's key set: 0).
        lp_solved: `[R]` LPs certified optimal by the simplex; bounds not counted
            here were settled without an LP (see `interval_simplex`).
        pivots: `[R]` simplex pivots (crossover to the first vertex included).
        fallbacks: `[R]` LPs handed to HiGHS because the simplex could not certify them.
        vertices: if requested, (row, key, sense) → the vertex `[n]` attaining that
            bound (sense +1 upper, −1 lower), for every bound settled by an LP.
    """

    lower: np.ndarray
    upper: np.ndarray
    lp_solved: np.ndarray
    pivots: np.ndarray
    fallbacks: np.ndarray
    vertices: dict[tuple[int, int, int], np.ndarray] | None = None


class _Chains:
    """Many revised-simplex runs ("chains") advanced in lock-step, one pivot each per step.

    Chain c works on problem q = prob[c]: {x ≥ 0 : A_q x = b_q}, A_q `[m, n]` (zero
    columns for keys outside the row's key set, which never enter), and walks through
    its own list of objectives (key, sense), each LP warm-started from the previous
    optimum. It keeps only B⁻¹ (m × m) and the basic values; the one tableau row that
    pricing needs is B⁻¹[p] A. Stepping all chains together turns the per-pivot Python
    overhead into batched numpy operations, which is what makes whole heads cheap.
    """

    def __init__(self, aq: np.ndarray, a: np.ndarray, allowed: np.ndarray, prob: np.ndarray):
        self.prob = prob
        # One A for every chain when all rows share their key set (bidirectional heads):
        # then pricing is a single GEMM and nothing n-sized is copied per step.
        self.shared = aq.shape[0] == 1
        self.a_one = aq[0]  # (used only when shared)
        self.aq = aq if self.shared else np.ascontiguousarray(aq[prob])  # [C or 1, m, n]
        self.allowed = allowed[prob]
        n_chains = prob.size
        self.m, self.n = aq.shape[1:]
        self.b = np.einsum("cmn,cn->cm", self.aq, a[prob]) if not self.shared else a[prob] @ aq[0].T
        self.zero_seen = ~allowed  # [Q, n]: x_j = 0 at some feasible point found
        self.seen_max = a.copy()  # [Q, n]
        self.pivots = np.zeros(a.shape[0], dtype=np.int64)
        self.since = np.zeros(n_chains, dtype=np.int64)
        self._crossover(a[prob].copy())

    def refactor(self, cs: np.ndarray) -> None:
        """B⁻¹ and x_B afresh from the basis indices (no accumulated round-off)."""
        if cs.size == 0:
            return
        self.binv[cs] = np.linalg.inv(self.bmat(cs))
        self.xb[cs] = np.einsum("cij,cj->ci", self.binv[cs], self.b[cs])
        self.since[cs] = 0

    def bmat(self, cs: np.ndarray) -> np.ndarray:
        """`[P, m, m]` basis matrices A_B."""
        if self.shared:
            return self.a_one[:, self.basic[cs]].transpose(1, 0, 2)
        return np.take_along_axis(self.aq[cs], self.basic[cs][:, None, :], axis=2)

    def column(self, cs: np.ndarray, ks: np.ndarray) -> np.ndarray:
        """`[P, m]` tableau columns B⁻¹ A_k."""
        cols = self.a_one[:, ks].T if self.shared else self.aq[cs, :, ks]
        return np.einsum("cij,cj->ci", self.binv[cs], cols)

    def rows(self, cs: np.ndarray, ps: np.ndarray) -> np.ndarray:
        """`[P, n]` tableau rows (B⁻¹ A)[p]."""
        if self.shared:
            return self.binv[cs, ps] @ self.a_one
        return np.einsum("cm,cmn->cn", self.binv[cs, ps], self.aq[cs])

    def pivot(self, cs: np.ndarray, rs: np.ndarray, ks: np.ndarray, col: np.ndarray) -> None:
        """Key ks enters at basis row rs (col = B⁻¹ A_k); x_B must already be updated."""
        ar = np.arange(cs.size)
        binv = self.binv[cs]
        prow = binv[ar, rs] / col[ar, rs][:, None]
        binv -= col[:, :, None] * prow[:, None, :]
        binv[ar, rs] = prow
        self.binv[cs] = binv
        leaving = self.basic[cs, rs]
        self.basic[cs, rs] = ks
        self.pos[cs, leaving] = -1
        self.pos[cs, ks] = rs
        self.blocked[cs, leaving] = ~self.allowed[cs, leaving]
        self.blocked[cs, ks] = True
        q = self.prob[cs]
        self.zero_seen[q, leaving] = True
        np.maximum.at(self.seen_max, (q[:, None], self.basic[cs]), np.maximum(self.xb[cs], 0.0))
        np.add.at(self.pivots, q, 1)
        self.since[cs] += 1

    def _crossover(self, x: np.ndarray) -> None:
        """From the raw row a (feasible) to a vertex, key by key, in every chain at once.

        Start from m independent columns (pivoted QR); every other key k with x_k > 0
        is driven to 0 along the edge that keeps A x = b, and enters the basis in place
        of a basic key that reaches 0 first (with the value it has left). While this
        runs, x_B holds the basic values with the keys not yet visited at their current
        values.
        """
        import scipy.linalg

        n_chains = self.prob.size
        self.basic = np.empty((n_chains, self.m), dtype=np.int64)
        for c in range(n_chains):
            if c == 0 or not self.shared:
                _, _, perm = scipy.linalg.qr(
                    self.aq[0 if self.shared else c], mode="economic", pivoting=True
                )
            self.basic[c] = perm[: self.m]
        self.pos = np.full((n_chains, self.n), -1, dtype=np.int64)
        np.put_along_axis(self.pos, self.basic, np.arange(self.m)[None, :], axis=1)
        self.blocked = ~self.allowed
        np.put_along_axis(self.blocked, self.basic, True, axis=1)
        self.binv = np.linalg.inv(self.bmat(all_c := np.arange(n_chains)))
        self.xb = np.take_along_axis(x, self.basic, 1)
        for k in range(self.n):
            cs = all_c[(self.pos[:, k] < 0) & (x[:, k] > 0.0)]
            if cs.size == 0:
                continue
            col = self.column(cs, np.full(cs.size, k))
            neg = col < -_PIVOT_TOL
            ratios = np.where(neg, np.maximum(self.xb[cs], 0.0) / np.where(neg, -col, 1.0), np.inf)
            r = ratios.argmin(1)
            best = ratios[np.arange(cs.size), r]
            xk = x[cs, k]
            t = np.minimum(best, xk)
            self.xb[cs] += t[:, None] * col  # lowering x_k by t moves x_B by t·col
            x[cs, k] = 0.0
            enter = best < xk
            if enter.any():
                ce, re, left = cs[enter], r[enter], (xk - t)[enter]
                # x_k enters at the row that reached 0, keeping the value it has left.
                self.xb[ce, re] = left
                x[ce, self.basic[ce, re]] = 0.0  # the key leaving sits at 0 from now on
                self.pivot(ce, re, np.full(ce.size, k), col[enter])
        self.refactor(all_c)
        q = self.prob
        for c in range(n_chains):
            self.zero_seen[q[c], ~self.blocked[c]] = True
            self.zero_seen[q[c], self.basic[c][self.xb[c] <= _FEAS_TOL]] = True
            np.maximum.at(self.seen_max[q[c]], self.basic[c], np.maximum(self.xb[c], 0.0))

    def vertex(self, c: int) -> np.ndarray:
        x = np.zeros(self.n)
        x[self.basic[c]] = np.maximum(self.xb[c], 0.0)
        return x


def interval_simplex(
    aq: np.ndarray,
    a: np.ndarray,
    allowed: np.ndarray,
    movable: np.ndarray,
    *,
    chains_per_row: int = 1,
    keep_vertices: bool = False,
    what: str = "",
) -> IntervalSolution:
    """Min and max of every movable x_j over each row's P, by warm-started simplex chains.

    Exact shortcuts, each proved by a feasible point already visited (P ⊂ [0, Σa]ⁿ):
    a key with x_j = 0 at any point visited (every key that left the basis, every
    non-basic key of a vertex) has minimum 0; a key reaching Σa has maximum Σa. Keys
    the null space cannot move keep a_j. Every other bound is an LP certified optimal
    (see OPT_TOL) at a vertex, which is also its witness; an LP the simplex cannot
    certify is handed to HiGHS (`fallbacks`).

    Args:
        aq: `[R, m, n]` (or `[1, m, n]`, shared by all rows) Qᵀ per row, Q an orthonormal basis of col([T, 1]) over the
            row's keys (rows of zeros past a row's own rank are not allowed: group rows
            by m); columns of keys outside the row's key set are 0.
        a: `[R, n]` raw weights, 0 outside the key set.
        allowed: `[R, n]` bool, the row's key set.
        movable: `[R, n]` bool, keys the null space can move (see `movable_keys`).
        chains_per_row: independent simplex chains per row, each taking every
            K-th key: more chains, fewer lock-step iterations (for long rows).
        what: prefix for error messages (e.g. "layer 2, head 3").
    """
    n_rows, n = a.shape
    m = aq.shape[1]
    lower, upper = a.copy(), a.copy()
    solved = np.zeros(n_rows, dtype=np.int64)
    fallbacks = np.zeros(n_rows, dtype=np.int64)
    vertices: dict[tuple[int, int, int], np.ndarray] | None = {} if keep_vertices else None
    live = movable.any(1)
    rows_live = np.flatnonzero(live)
    if rows_live.size == 0:
        return IntervalSolution(
            lower, upper, solved, np.zeros(n_rows, np.int64), fallbacks, vertices
        )
    k_chains = max(1, int(chains_per_row))
    prob = np.repeat(rows_live, k_chains)
    tasks: list[list[tuple[int, int]]] = []
    for q in rows_live:
        keys = np.flatnonzero(movable[q])
        for c in range(k_chains):
            mine = keys[c::k_chains]
            tasks.append([(int(j), 1) for j in mine] + [(int(j), -1) for j in mine])
    ch = _Chains(aq, a, allowed, prob)
    total = a.sum(1)
    n_chains = prob.size
    ptr = np.zeros(n_chains, dtype=np.int64)
    steps = np.zeros(n_chains, dtype=np.int64)
    degenerate = np.zeros(n_chains, dtype=np.int64)
    cur_j = np.zeros(n_chains, dtype=np.int64)
    cur_s = np.zeros(n_chains, dtype=np.int64)
    active = np.ones(n_chains, dtype=bool)

    def settle(c: int, value: float, x: np.ndarray | None) -> None:
        q, j, s = int(prob[c]), int(cur_j[c]), int(cur_s[c])
        (upper if s > 0 else lower)[q, j] = value
        if vertices is not None and x is not None:
            vertices[(q, j, s)] = x
        ptr[c] += 1
        steps[c] = degenerate[c] = 0
        advance(c)

    def advance(c: int) -> None:
        """Move chain c to its next task that no visited point settles already."""
        q = prob[c]
        while ptr[c] < len(tasks[c]):
            j, s = tasks[c][ptr[c]]
            if s > 0 and ch.seen_max[q, j] >= total[q] - 1e-12:
                upper[q, j] = total[q]
            elif s < 0 and ch.zero_seen[q, j]:
                lower[q, j] = 0.0
            else:
                cur_j[c], cur_s[c] = j, s
                return
            ptr[c] += 1
        active[c] = False

    def fallback(c: int) -> None:
        q, j, s = int(prob[c]), int(cur_j[c]), int(cur_s[c])
        fallbacks[q] += 1
        rows = aq[0 if aq.shape[0] == 1 else q][:, allowed[q]]
        sub_a = a[q, allowed[q]]
        idx = int(np.flatnonzero(np.flatnonzero(allowed[q]) == j)[0])
        where = f"{what}: " if what else ""
        x_sub = _solve(-s * np.eye(sub_a.size)[idx], rows.T, sub_a, f"{where}bounding key {j}")
        x = np.zeros(n)
        x[allowed[q]] = x_sub
        ch.zero_seen[q] |= (x <= 0.0) & allowed[q]
        np.maximum(ch.seen_max[q], x, out=ch.seen_max[q])
        ch.refactor(np.array([c]))
        settle(c, float(x[j]), x)

    for c in range(n_chains):
        advance(c)
    ar = np.arange(n_chains)
    while active.any():
        cs = ar[active]
        j, s = cur_j[cs], cur_s[cs]
        p = ch.pos[cs, j]
        enter = np.full(cs.size, -1, dtype=np.int64)
        basic_j = p >= 0
        grow = ~basic_j & (s > 0)
        enter[grow] = j[grow]  # maximising a non-basic key: it enters
        done_zero = ~basic_j & (s < 0)  # a non-basic key is at 0: its minimum
        cb = np.flatnonzero(basic_j)
        if cb.size:
            c_b = cs[cb]
            row = ch.rows(c_b, p[cb])  # tableau row p
            d = np.where(ch.blocked[c_b], -np.inf, -s[cb, None] * row)
            dantzig = d.argmax(1)
            pick = np.where(d[np.arange(cb.size), dantzig] > OPT_TOL, dantzig, -1)
            slow = degenerate[c_b] > 2 * m
            if slow.any():  # Bland's rule (lowest index) after a run of degenerate pivots
                over = d[slow] > OPT_TOL
                pick[slow] = np.where(over.any(1), over.argmax(1), -1)
            enter[cb] = pick
        # Chains at an optimum: certify on a fresh factorisation, or refactor first.
        opt = (enter < 0) & ~done_zero
        stale = cs[opt & (ch.since[cs] > 0)]
        fresh = cs[opt & (ch.since[cs] == 0)]
        for c in cs[done_zero]:
            settle(int(c), 0.0, ch.vertex(int(c)) if vertices is not None else None)
        for c in fresh:
            if (ch.xb[c] >= -_FEAS_TOL).all():
                solved[prob[c]] += 1
                settle(int(c), float(max(ch.xb[c, ch.pos[c, cur_j[c]]], 0.0)),
                       ch.vertex(int(c)) if vertices is not None else None)  # fmt: skip
            else:
                fallback(int(c))
        ch.refactor(stale)
        go = enter >= 0
        if not go.any():
            continue
        cp, kp = cs[go], enter[go]
        col = ch.column(cp, kp)  # [P, m]
        posm = col > _PIVOT_TOL
        xb = np.maximum(ch.xb[cp], 0.0)
        ratios = np.where(posm, xb / np.where(posm, col, 1.0), np.inf)
        best = ratios.min(1)
        tie = ratios <= best[:, None] + 1e-12
        r = np.where(tie, col, -np.inf).argmax(1)  # largest pivot among (near-)ties
        slow = degenerate[cp] > 2 * m
        if slow.any():
            r[slow] = np.where(tie[slow], ch.basic[cp[slow]], np.iinfo(np.int64).max).argmin(1)
        degenerate[cp] = np.where(best <= 1e-14, degenerate[cp] + 1, 0)
        steps[cp] += 1
        ok = np.isfinite(best) & (steps[cp] <= _PIVOTS_PER_LP)
        if ok.any():
            co, ro, ko, colo = cp[ok], r[ok], kp[ok], col[ok]
            theta = best[ok]
            xb_new = ch.xb[co] - theta[:, None] * colo
            xb_new[np.arange(co.size), ro] = theta
            ch.xb[co] = xb_new
            ch.pivot(co, ro, ko, colo)
            ch.refactor(co[ch.since[co] >= _REFACTOR_EVERY])
        for c in cp[~ok]:
            fallback(int(c))
    return IntervalSolution(
        np.minimum(lower, a), np.maximum(upper, a), solved, ch.pivots, fallbacks, vertices
    )


def row_problem(a: np.ndarray, basis: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One row's (aq `[1, m, n]`, allowed `[1, n]`, movable `[1, n]`) for `interval_simplex`."""
    n = a.shape[0]
    movable = movable_keys(basis) if basis.shape[1] < n else np.zeros(n, dtype=bool)
    return basis.T[None].copy(), np.ones((1, n), dtype=bool), movable[None]
