"""The warm-started simplex engine of whole interval maps (docs/certified_attention.md).

`interval_simplex` bounds every movable key of a batch of rows through `_ChainRun`s (the
simplex state `chains._Simplex` plus each chain's tasks) sharing one `_Bounds`; LPs it
cannot certify go to HiGHS (`certificates._solve`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from identifiable.attention.chains import _Simplex
from identifiable.attention.crossover import PIVOT_TOL as _PIVOT_TOL
from identifiable.attention.crossover import crossover
from identifiable.attention.lp import solve_lp
from identifiable.threads import single_threaded

# P = {x ≥ 0 : A x = b} with A = Qᵀ (m × n, m = rank([T, 1]) ≤ d_v + 1, usually m ≪ n) and
# b = A a. A vertex of P is a basis: m keys whose columns of A are independent, all other
# keys at 0. Only B⁻¹ (m × m) and x_B = B⁻¹ b are kept, so a pivot costs one tableau row
# (m × n) and a rank-one update of B⁻¹. Every LP starts from a basis that is already half
# of an optimum:
# - the 2n LPs of one row share P and differ only in their objective, so the optimal
#   vertex of the previous LP is primal feasible (primal simplex from there);
# - the rows of a bidirectional head share A (keys and T are the same; only a changes),
#   so one objective "max s·x_j" over consecutive rows differs only in b. Reduced costs
#   do not depend on b, so the previous row's optimal basis is dual feasible for the next
#   row (dual simplex from there: ~12 pivots per row on MiniLM, against ~30 per LP when
#   warm-starting across objectives).
# Optimality is certified, not assumed: with x_B and the tableau row of j recomputed at the
# final basis (refined against B itself, or refactored from scratch, see _finish), the
# reduced costs d_k of maximising s·x_j (s = ±1) are d_k = −s W[p, k]
# (p the row of j in the basis). For every x ∈ P, s·x_j = s·x̂_j + Σ_{k ∉ B} d_k x_k ≤
# s·x̂_j + max(d, 0)·Σ_k x_k = s·x̂_j + max(d, 0)·Σa. So reduced costs ≤ OPT_TOL bound the
# gap to the true optimum by OPT_TOL·Σa (Σa = 1): the reported bound is exact to ~1e-11.
# The vertex x̂ itself is the witness that the bound is attained.

OPT_TOL = 1e-11  # largest reduced cost accepted at an optimum (bounds the gap, see above)
_FEAS_TOL = 1e-10  # basic values down to −_FEAS_TOL count as 0 (round-off)
# Largest residual (‖b − B x_B‖∞, ‖e_p − Bᵀy‖∞) before refinement for which an optimum is
# certified on refined values (`_ChainRun._refined_optimum`); beyond it, a refactor.
REFINE_TOL = 1e-8
# Pivots between refactorisations of B⁻¹: max(_REFACTOR_EVERY, 2m); every LP also ends on
# values recomputed at its basis (see _finish). 2m against m: 4.4 s against 4.9 s on a 512-key row at
# m = 129.
_REFACTOR_EVERY = 25


# An LP still open after max(_PIVOTS_PER_LP, _PIVOTS_PER_M · m) pivots goes to HiGHS. Primal
# Dantzig pivots grow with m: ~400 per LP at m = 129 (Llama-3 heads, 512 keys), where a
# fixed cap of 400 sent 216 of 514 LPs of one row to HiGHS (32 s against 8.5 s).
_PIVOTS_PER_LP = 400
_PIVOTS_PER_M = 8
_MIN_BLOCK = 16  # "key" order, phase 2 (minima): rows per chain
_CHAIN_BYTES = 2**23  # B⁻¹ of the chains in one lock-step run (8 MB: 63 chains at m = 129)


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


@single_threaded  # torch's threads would spin against numpy's (see `one_thread`)
def interval_simplex(
    aq: np.ndarray,
    a: np.ndarray,
    allowed: np.ndarray,
    movable: np.ndarray,
    *,
    chains_per_row: int = 1,
    keep_vertices: bool = False,
    what: str = "",
    order: str = "auto",
    block: int | None = None,
    deadline: float | None = None,
) -> IntervalSolution:
    """Min and max of every movable x_j over each row's P, by warm-started simplex chains.

    Exact shortcuts, each proved by a feasible point already visited (P ⊂ [0, Σa]ⁿ):
    a key with x_j = 0 at any point of P visited (every key that left the basis in a
    primal pivot, every non-basic key of a vertex) has minimum 0; a key reaching Σa
    has maximum Σa. Keys the null space cannot move keep a_j. Every other bound is an
    LP certified optimal (see OPT_TOL) at a vertex, which is also its witness; an LP
    the simplex cannot certify is handed to HiGHS (`fallbacks`).

    All maxima are solved first (phase 1), then the minima no vertex has settled
    (phase 2): a maximising vertex has at most m non-zero keys, so it settles most
    minima at 0. Tasks are laid out in one of two orders:
    - "key" (rows sharing A, i.e. `aq` is `[1, m, n]`, with the same or growing key
      sets: bidirectional or nested causal rows): one chain per key and sense (and per
      block of `block` rows), walking down the rows; each LP starts from the previous
      row's optimal basis, which stays dual feasible over the previous row's keys (dual
      simplex; keys a row adds join once x_B ≥ 0, then primal simplex);
    - "row": `chains_per_row` chains per row, each taking every K-th key; each LP
      starts from the previous key's optimal vertex (primal simplex).
    "auto" takes "key" when the rows share A and there are at least 8 of them.

    Args:
        aq: `[R, m, n]` (or `[1, m, n]`, shared by all rows) Qᵀ per row, Q an orthonormal
            basis of col([T, 1]) over the row's keys (rows of zeros past a row's own rank
            are not allowed: group rows by m); columns of keys outside the key set are 0.
        a: `[R, n]` raw weights, 0 outside the key set.
        allowed: `[R, n]` bool, the row's key set.
        movable: `[R, n]` bool, keys the null space can move (see `movable_keys`).
        chains_per_row: "row" order: independent chains per row, each taking every
            K-th key: more chains, fewer lock-step iterations (for long rows).
        keep_vertices: return the vertex that settled each bound (witnesses).
        what: prefix for error messages (e.g. "layer 2, head 3").
        order: "auto", "key" or "row" (see above).
        block: "key" order: rows per chain (default: all rows in one chain).
        deadline: a wall-clock time (`time.time()`); past it, raise `OutOfTime`.
    """
    n_rows = a.shape[0]
    rows_live = np.flatnonzero(movable.any(1))
    shared = aq.shape[0] == 1
    if order == "auto":
        order = "key" if shared and rows_live.size >= 8 else "row"
    if order == "key" and not shared:
        raise ValueError("key order needs rows that share A (aq of shape [1, m, n])")
    if order == "key" and (allowed[:-1] & ~allowed[1:]).any():  # see `_Simplex.move`
        raise ValueError("key order needs key sets that grow (or stay) from row to row")
    b = _start(aq, a, allowed, rows_live, keep_vertices)
    k_chains = max(1, int(chains_per_row))
    for sense in (1, -1):
        todo, size = movable, block or n_rows
        if sense < 0:
            b.lower[movable & b.zero_seen] = 0.0  # minima proved by visited points (see above)
            # Few minima are left, often one key over many rows: short chains keep the
            # lock step busy (blocks of _MIN_BLOCK rows; measured on MiniLM heads).
            todo, size = movable & ~b.zero_seen, min(size, _MIN_BLOCK)
        tasks = _layout(todo, sense, size, order, k_chains)
        # Chains in lock step share one pass over their B⁻¹ per step: past a few MB that
        # pass leaves the cache, so long task lists run in batches (see _CHAIN_BYTES).
        per_run = max(1, _CHAIN_BYTES // (8 * aq.shape[1] ** 2))
        for i in range(0, len(tasks), per_run):
            run = tasks[i : i + per_run]
            _ChainRun(aq, a, allowed, run, b, what, deadline, order == "row").run()
    return IntervalSolution(
        np.minimum(b.lower, a), np.maximum(b.upper, a), b.solved, b.pivots, b.fallbacks,
        b.vertices,
    )  # fmt: skip


def _start(aq, a, allowed, rows_live, keep_vertices: bool) -> _Bounds:
    """The shared state before any LP: a, the crossover vertex of every live row (a
    feasible basis, the start of phase-2 chains) and the keys it proves at 0."""
    n_rows = a.shape[0]
    zeros = np.zeros(n_rows, dtype=np.int64)
    start = np.zeros((n_rows, aq.shape[1]), dtype=np.int64)
    b = _Bounds(a.copy(), a.copy(), ~allowed.copy(), a.copy(), a.sum(1), start,
                {} if keep_vertices else None, zeros, zeros.copy(), zeros.copy())  # fmt: skip
    if rows_live.size:
        sub = aq if aq.shape[0] == 1 else aq[rows_live]
        start[rows_live] = crossover(sub, a[rows_live], allowed[rows_live])
    for q in rows_live:
        b.zero_seen[q, np.setdiff1d(np.flatnonzero(allowed[q]), start[q])] = True
    return b


def _layout(todo: np.ndarray, s: int, size: int, order: str, k_chains: int) -> list:
    """Task lists (row, key, sense) for the bounds todo `[R, n]` bool of sense s: per key
    and block of `size` rows ("key" order), or `k_chains` per row, each taking every
    k-th key ("row" order, where the lists only seed the row's pool: `_ChainRun._next_key`
    picks each chain's next key)."""
    tasks: list[list[tuple[int, int, int]]] = []
    if order == "key":
        for j in np.flatnonzero(todo.any(0)):
            rs = np.flatnonzero(todo[:, j])
            for i in range(0, rs.size, size):
                tasks.append([(int(r), int(j), s) for r in rs[i : i + size]])
    else:
        for q in np.flatnonzero(todo.any(1)):
            keys = np.flatnonzero(todo[q])
            for c in range(min(k_chains, keys.size)):
                tasks.append([(int(q), int(j), s) for j in keys[c::k_chains]])
    return tasks


@dataclass
class _Bounds:
    """What the chains of one `interval_simplex` call share (arrays over rows R and keys n).

    Attributes:
        lower, upper: `[R, n]` bounds found so far (a where not yet settled).
        zero_seen: `[R, n]` bool, keys at 0 in some feasible point visited (minimum 0).
        seen_max: `[R, n]` the largest value of each key at a visited point.
        total: `[R]` Σa per row (P ⊂ [0, Σa]ⁿ).
        start: `[R, m]` a feasible basis per row (the start of phase-2 chains).
        vertices: (row, key, sense) → the vertex that settled that bound, if kept.
        solved, pivots, fallbacks: `[R]` int64 counts (see `IntervalSolution`).
    """

    lower: np.ndarray
    upper: np.ndarray
    zero_seen: np.ndarray
    seen_max: np.ndarray
    total: np.ndarray
    start: np.ndarray
    vertices: dict[tuple[int, int, int], np.ndarray] | None
    solved: np.ndarray
    pivots: np.ndarray
    fallbacks: np.ndarray


class OutOfTime(Exception):
    """Raised by `interval_simplex` when its `deadline` (wall clock, `time.time()`) has passed."""


class _ChainRun:
    """The chains of one phase of `interval_simplex`, advanced in lock step until every
    task is settled: the simplex state (`_Simplex`) plus each chain's place in its task
    list, its current objective (key j, sense s) and its pivot counters."""

    def __init__(self, aq, a, allowed, tasks, bounds: _Bounds, what: str, deadline,
                 row_order: bool) -> None:  # fmt: skip
        self.aq, self.a, self.allowed, self.what = aq, a, allowed, what
        self.tasks, self.b, self.deadline = tasks, bounds, deadline
        # Row order prices by steepest edge (see `_step`) and draws keys from a pool.
        self.ch = _Simplex(aq, a, allowed, tasks, bounds.start, steepest=row_order)
        n_chains = len(tasks)
        self.ptr = np.zeros(n_chains, dtype=np.int64)
        self.steps = np.zeros(n_chains, dtype=np.int64)
        self.degenerate = np.zeros(n_chains, dtype=np.int64)
        self.cur_j = np.zeros(n_chains, dtype=np.int64)
        self.cur_s = np.zeros(n_chains, dtype=np.int64)
        self.active = np.ones(n_chains, dtype=bool)
        self.moved = np.zeros(n_chains, dtype=bool)
        self.refactor_every = max(_REFACTOR_EVERY, 2 * self.ch.m)
        self.cap = max(_PIVOTS_PER_LP, _PIVOTS_PER_M * self.ch.m)
        # Row order: the chains of a row draw from one pool of its open keys (`_next_key`)
        # instead of each walking its own fixed list; key order keeps its lists. With a
        # pool, a chain's list only seeds the pool and names its row and sense (ptr unused).
        self.pool: np.ndarray | None = None
        if row_order:
            self.pool = np.zeros(a.shape, dtype=bool)
            for tl in tasks:
                q, js = tl[0][0], [t[1] for t in tl]
                self.pool[q, js] = True

    def run(self) -> None:
        for c in range(len(self.tasks)):
            self.advance(c)
        count = 0
        while self._live():
            count += 1
            if self.deadline is not None and count % 8 == 0 and time.time() > self.deadline:
                raise OutOfTime
            self._step()

    def _live(self) -> bool:
        """Reload moved chains and drop finished ones (every step then works in place)."""
        if self.moved.any():
            self.ch.reload(np.flatnonzero(self.moved))
            self.moved[:] = False
        if not self.active.all():
            keep = np.flatnonzero(self.active)
            if keep.size == 0:
                return False
            self.ch.compact(keep)
            self.tasks = [self.tasks[i] for i in keep]
            for name in ("ptr", "steps", "degenerate", "cur_j", "cur_s", "active", "moved"):
                setattr(self, name, getattr(self, name)[keep])
        return True

    def advance(self, c: int) -> None:
        """Move chain c to its next task that no visited point settles already."""
        b, tl = self.b, self.tasks[c]
        while self.pool is not None or self.ptr[c] < len(tl):
            q, j, s = tl[self.ptr[c]] if self.pool is None else self._next_key(c, tl[0])
            if j < 0:
                break
            if s > 0 and b.seen_max[q, j] >= b.total[q] - 1e-12:
                b.upper[q, j] = b.total[q]
            elif s < 0 and b.zero_seen[q, j]:
                b.lower[q, j] = 0.0
            else:
                if (self.cur_j[c], self.cur_s[c]) != (j, s):  # d does not depend on b
                    self.cur_j[c], self.cur_s[c] = j, s
                    self.ch.fresh_d[c] = False
                if q != self.ch.row[c]:
                    # same objective, new right-hand side: x_B = B⁻¹b anew
                    self.moved[c] = self.ch.move(c, q)
                return
            self.ptr[c] += 1
        self.active[c] = False

    def _next_key(self, c: int, task: tuple[int, int, int]) -> tuple[int, int, int]:
        """Row order: chain c's next key, taken from its row's pool (j = −1: none left).

        Of the open keys basic at the chain's vertex, the one with the largest x_k when
        maximising (smallest when minimising), since its LP starts where x_k is already
        high (low): 7.7 % fewer lock-step steps than fixed lists of every K-th key on a
        512-key row at m = 129 (3,678 against 3,984; index order from a pool, 3,853).
        Otherwise the lowest open key. The pool also keeps the row's chains busy until
        its last key is taken."""
        q, s = task[0], task[2]
        open_keys = self.pool[q]  # type: ignore[index]
        basic = self.ch.basic[c]
        live = open_keys[basic]
        if live.any():
            x = self.ch.xb[c] if s > 0 else -self.ch.xb[c]
            j = int(basic[np.flatnonzero(live)[x[live].argmax()]])
        elif open_keys.any():
            j = int(open_keys.argmax())
        else:
            return q, -1, s
        open_keys[j] = False
        return q, j, s

    def settle(self, cs: np.ndarray, values: np.ndarray) -> None:
        """Chains cs reached the optimum `values` of their current LP (certified)."""
        b, ch = self.b, self.ch
        rows = ch.row[cs]
        js, ss = self.cur_j[cs], self.cur_s[cs]
        up = ss > 0
        b.upper[rows[up], js[up]] = values[up]
        b.lower[rows[~up], js[~up]] = values[~up]
        np.add.at(b.solved, rows, 1)
        # The vertex is a visited point of P: its non-basic keys are 0.
        np.logical_or.at(b.zero_seen, rows, (ch.pos[cs] < 0) & self.allowed[rows])
        np.maximum.at(b.seen_max, (rows[:, None], ch.basic[cs]), ch.xb[cs])
        b.start[rows] = ch.basic[cs]
        for i, c in enumerate(cs):
            if b.vertices is not None:
                b.vertices[(int(rows[i]), int(js[i]), int(ss[i]))] = ch.vertex(int(c))
            self.ptr[c] += 1
            self.steps[c] = self.degenerate[c] = 0
            self.advance(int(c))

    def fallback(self, c: int) -> None:
        """Chain c's LP goes to HiGHS; the chain restarts clean on its next task."""
        b, ch, allowed = self.b, self.ch, self.allowed
        q, j, s = int(ch.row[c]), int(self.cur_j[c]), int(self.cur_s[c])
        b.fallbacks[q] += 1
        rows = self.aq[0 if self.aq.shape[0] == 1 else q][:, allowed[q]]
        sub_a = self.a[q, allowed[q]]
        idx = int(np.flatnonzero(np.flatnonzero(allowed[q]) == j)[0])
        where = f"{self.what}: " if self.what else ""
        x_sub = solve_lp(-s * np.eye(sub_a.size)[idx], rows.T, sub_a, f"{where}bounding key {j}")
        x = np.zeros(self.a.shape[1])
        x[allowed[q]] = x_sub
        b.zero_seen[q] |= (x <= 0.0) & allowed[q]
        np.maximum(b.seen_max[q], x, out=b.seen_max[q])
        (b.upper if s > 0 else b.lower)[q, j] = float(x[j])
        if b.vertices is not None:
            b.vertices[(q, j, s)] = x
        ch.refactor(np.array([c]), weights=True)  # the basis may have drifted: start clean
        self.ptr[c] += 1
        self.steps[c] = self.degenerate[c] = 0
        self.advance(c)

    def _reduced_costs(self) -> tuple[np.ndarray, np.ndarray]:
        """d `[C, n]` of maximising s·x_j (−inf where blocked) and whether j is non-basic.

        d_k = −s·(B⁻¹A)[p_j, k] when j is basic; when it is not, only d_j = s is non-zero.
        """
        ch, n_c = self.ch, self.active.size
        stale = np.flatnonzero(~ch.fresh_d)
        if stale.size:
            j, s = self.cur_j[stale], self.cur_s[stale]
            pj = ch.pos[stale, j]
            nbs = pj < 0
            d = ch.tableau_rows(np.maximum(pj, 0), stale)
            d *= -s[:, None]
            d[nbs] = 0.0
            d[np.flatnonzero(nbs), j[nbs]] = s[nbs]
            ch.d[stale] = d
            ch.fresh_d[stale] = True
        nb = ch.pos[np.arange(n_c), self.cur_j] < 0
        return np.where(ch.blocked, -np.inf, ch.d), nb

    def _dual_choice(
        self, d: np.ndarray, slow: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Dual mode (some x_B < 0, d ≤ 0): a negative basic value leaves (dual steepest
        edge, exact weights), the key with the smallest ratio d_k / α_k enters (ties to the
        largest |α_k|; Bland's rule when slow). Returns enter, leave, `ok` (a key found) and
        the pivot rows α `[C, n]`."""
        ch, xb = self.ch, self.ch.xb
        neg = xb < -_FEAS_TOL
        # Weights ‖e_pᵀB⁻¹‖² of the negative rows only (22 of 129 per chain, mean over a
        # causal head at n = 160): one pass over every B⁻¹ for all rows took 13 % of the head.
        cn, pn = np.nonzero(neg)
        rows = ch.binv[cn, pn]
        score = np.full(xb.shape, -1.0)
        score[cn, pn] = xb[cn, pn] ** 2 / np.einsum("km,km->k", rows, rows)
        p = score.argmax(1)
        p = np.where(slow, np.where(neg, ch.basic, _BIG).argmin(1), p)
        alpha = ch.tableau_rows(p)
        # d is −inf at blocked keys, so their ratio −inf / α is +inf wherever α < 0: only
        # α ≥ −_PIVOT_TOL needs masking (fewer passes over [C, n] than masking both).
        ratio = np.minimum(d, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio /= alpha
        ratio[alpha >= -_PIVOT_TOL] = np.inf
        best = ratio.min(1)
        tie = ratio <= best[:, None] + 1e-12
        k = np.where(tie, alpha, np.inf).argmin(1)  # the largest |α| among the ties
        if slow.any():
            k = np.where(slow, tie.argmax(1), k)
        return k, p, np.isfinite(best), alpha

    def _primal_leave(self, cp: np.ndarray, col: np.ndarray, slow: np.ndarray) -> np.ndarray:
        """Primal ratio test for chains cp (col = B⁻¹A_k): the leaving row, −1 if unbounded;
        updates the degenerate-pivot counters."""
        ch = self.ch
        cpr = col[cp]
        posm = cpr > _PIVOT_TOL
        ratios = np.where(posm, np.maximum(ch.xb[cp], 0.0) / np.where(posm, cpr, 1.0), np.inf)
        bestp = ratios.min(1)
        tie = ratios <= bestp[:, None] + 1e-12
        r = np.where(tie, cpr, -np.inf).argmax(1)
        r = np.where(slow[cp], np.where(tie, ch.basic[cp], _BIG).argmin(1), r)
        self.degenerate[cp] = np.where(bestp <= 1e-14, self.degenerate[cp] + 1, 0)
        return np.where(np.isfinite(bestp), r, -1)

    def _step(self) -> None:
        """One pivot (or the no-op pivot) for every chain, then settle what is optimal."""
        ch = self.ch
        n_c = self.active.size
        ar = np.arange(n_c)
        d, nb = self._reduced_costs()
        catching = ch.catching_up()
        infeasible = (ch.xb < -_FEAS_TOL).any(1)
        slow = self.degenerate > 2 * ch.m
        # Primal mode (x_B ≥ 0): the largest d_k² / γ_k enters in row order (steepest edge),
        # the largest d_k in key order (Dantzig); Bland's rule when slow. On a 512-key row at
        # m = 129: 218 pivots per LP by steepest edge, 396 by Dantzig's rule.
        over = d > OPT_TOL
        score = np.where(over, d * d / ch.w, -1.0) if ch.steepest else d
        pick = np.where(slow, over.argmax(1), score.argmax(1))
        # A non-basic key at a feasible vertex is at 0: that is its minimum.
        done_zero = ~infeasible & nb & (self.cur_s < 0) & ~catching
        enter = np.where(~infeasible & over[ar, pick] & ~done_zero, pick, -1)
        leave = np.full(n_c, -1, dtype=np.int64)
        lost = np.zeros(n_c, dtype=bool)
        alpha = None
        if infeasible.any():
            k, p, found, alpha = self._dual_choice(d, slow)
            enter = np.where(infeasible, np.where(found, k, -1), enter)
            leave = np.where(infeasible, p, -1)
            lost = infeasible & ~found
        go = enter >= 0
        # Optimal (primal feasible, no entering key): certify on recomputed values (_finish).
        opt = ~infeasible & ~go & ~done_zero
        kk = np.where(go, enter, ch.basic[:, 0])
        col = ch.columns(kk)
        primal = go & (leave < 0)
        if primal.any():
            leave[ar[primal]] = self._primal_leave(ar[primal], col, slow)
        dual = go & infeasible
        if dual.any():  # a dual pivot is degenerate when the entering reduced cost is 0
            deg = d[ar[dual], kk[dual]] >= -1e-14
            self.degenerate[dual] = np.where(deg, self.degenerate[dual] + 1, 0)
        self.steps[go] += 1
        ok = go & (leave >= 0) & (self.steps <= self.cap)
        ok &= np.abs(col[ar, np.maximum(leave, 0)]) > _PIVOT_TOL
        self._apply(ok, primal & ~catching, leave, kk, col, alpha, infeasible)
        caught = opt & catching  # optimal over the new keys at the old b: now load b_q
        if caught.any():
            ch.b_row[caught] = ch.row[caught]
            ch.reload(ar[caught])
        self._finish(done_zero, opt & ~caught, ar[(go & ~ok) | lost])

    def _apply(self, ok, primal, leave, kk, col, alpha, dual) -> None:
        """Pivot the chains `ok` (every other chain takes the exact no-op pivot)."""
        if not ok.any():
            return
        ch, ar = self.ch, np.arange(ok.size)
        # A primal pivot moves between vertices of P: the key that leaves is 0 there.
        pz = ok & primal
        self.b.zero_seen[ch.row[pz], ch.basic[ar[pz], leave[pz]]] = True
        ps = np.where(ok, leave, 0)
        kk = np.where(ok, kk, ch.basic[:, 0])
        col[~ok] = 0.0
        col[~ok, 0] = 1.0
        ch.pivot(ps, kk, col, ok, alpha, None if alpha is None else dual & ok)
        self.b.pivots += np.bincount(ch.row[ok], minlength=self.b.pivots.size)
        ch.refactor(ar[ok & (ch.since >= self.refactor_every)])

    def _finish(self, done_zero: np.ndarray, opt: np.ndarray, failed: np.ndarray) -> None:
        """Settle zero minima and certified optima (an optimum reached on an updated B⁻¹ is
        certified on refined values, `_refined_optimum`, or refactored and tried again next
        step); HiGHS for failures."""
        ch, ar = self.ch, np.arange(opt.size)
        if done_zero.any():
            self.settle(ar[done_zero], np.zeros(int(done_zero.sum())))
        fresh = ar[opt & (ch.since == 0)]
        stale = ar[opt & (ch.since > 0)]
        if stale.size:  # certified on refined x_B and reduced costs, else refactored
            good = self._refined_optimum(stale)
            fresh = np.concatenate([fresh, stale[good]])
            ch.refactor(stale[~good])
        if fresh.size:
            pjf = ch.pos[fresh, self.cur_j[fresh]]
            vals = np.maximum(ch.xb[fresh, np.maximum(pjf, 0)], 0.0)
            self.settle(fresh, np.where(pjf >= 0, vals, 0.0))
        for c in failed:
            self.fallback(int(c))

    def _refined_optimum(self, cs: np.ndarray) -> np.ndarray:
        """`[C]` bool: chains cs (optimal on their updated B⁻¹) whose optimality holds on
        x_B and reduced costs recomputed by iterative refinement (`_Simplex.refined`);
        those chains take the refined x_B and d. The test is the one a fresh factorisation
        gets (x_B ≥ −_FEAS_TOL, d ≤ OPT_TOL on unblocked keys), so the bound is as exact;
        it replaces that factorisation (O(m³) per LP: 12 % of a causal head's time)."""
        ch = self.ch
        j, s = self.cur_j[cs], self.cur_s[cs]
        pj = ch.pos[cs, j]
        x, y, resid = ch.refined(cs, np.maximum(pj, 0))
        d = ch.times_a(y[:, None], cs)[:, 0]
        d *= -s[:, None]
        good = (pj >= 0) & (resid <= REFINE_TOL) & (x >= -_FEAS_TOL).all(1)
        good &= (np.where(ch.blocked[cs], -np.inf, d) <= OPT_TOL).all(1)
        ch.xb[cs[good]] = x[good]
        ch.d[cs[good]] = d[good]
        return good


_BIG = np.iinfo(np.int64).max
