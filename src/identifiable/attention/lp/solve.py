"""`bound_keys`: the one entry of the certificate engine (docs/certified_attention.md).

The compiled backend lays out every movable key of a batch of rows as LP tasks of simplex
chains and runs them in the compiled lock step (`compiled.run_chains`, pivots in
`kernel.py`, thread groups in `groups.py`), sharing one set of bounds; LPs the chains
cannot certify go to HiGHS. The HiGHS backend (`hot.py`) solves each LP on a persistent
model. Either way the bounds and a sample of the LPs' final bases (all, on request) pass
the independent check of `verify.py` before they are returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from identifiable.attention.lp.groups import Bounds, run
from identifiable.attention.lp.options import BoundProblem, EngineOptions
from identifiable.attention.lp.verify import Certificates, failures
from identifiable.errors import IdentifiableError

# The largest reduced cost the compiled engine accepts at an optimum (= kernel.OPT_TOL,
# tested; the kernel is imported only when the engine runs): bounds are exact to OPT_TOL·Σa
OPT_TOL = 1e-11


@dataclass(frozen=True)
class IntervalSolution:
    """What `bound_keys` found for a batch of rows (arrays over keys, float64).

    Attributes:
        lower, upper: `[R, n]` min and max of x_j over each row's P (keys outside
            the row's key set: 0).
        lp_solved: `[R]` LPs certified optimal; bounds not counted here were settled
            without an LP (a point already visited proves them).
        pivots: `[R]` simplex pivots of the compiled engine (crossover included; 0 for
            HiGHS).
        fallbacks: `[R]` LPs the compiled engine handed to HiGHS.
        vertices: with keep_vertices, (row, key, sense) → the vertex `[n]` attaining
            that bound (sense +1 upper, −1 lower), for every bound settled by an LP.
        certificates: the final bases of the LPs the verifier checked (`verify`).
        backend: "engine" or "highs", the backend that ran.
        groups: the chains of each thread group of each phase of the compiled engine.
    """

    lower: np.ndarray
    upper: np.ndarray
    lp_solved: np.ndarray
    pivots: np.ndarray
    fallbacks: np.ndarray
    vertices: dict[tuple[int, int, int], np.ndarray] | None = None
    certificates: Certificates | None = None
    backend: str = "engine"
    groups: tuple[tuple[int, ...], ...] = ()


def bound_keys(problem: BoundProblem, options: EngineOptions | None = None) -> IntervalSolution:
    """Min and max of every movable x_j over each row's P, every LP certified.

    Exact shortcuts, each proved by a feasible point already visited (P ⊂ [0, Σa]ⁿ): a
    key with x_j = 0 at a visited point has minimum 0, a key reaching Σa maximum Σa;
    keys not movable keep a_j. Every other bound is an LP certified optimal at a vertex
    (its witness). The bounds and the final bases of a sample of the LPs (every LP with
    verify="all" or keep_vertices) are checked by `verify` before they are returned.

    Layouts of the compiled engine (options.order): "key" (rows sharing A with the same or
    growing key sets) runs one chain per key and sense down the rows (dual simplex from
    the previous row's optimum); "row" runs chains_per_row chains per row drawing keys
    from one pool of the row's open keys (primal simplex); "auto" takes "key" when the
    rows share A and there are at least 8 of them.

    Raises: IdentifiableError when a bound fails the check (naming the rows); ValueError
    for a layout the problem does not allow; `OutOfTime` past options.deadline.
    """
    options = options or EngineOptions()
    _check_layout(problem, options)
    if _backend(problem, options) == "highs":
        return _highs(problem, options)
    return _engine(problem, options)


def _backend(problem: BoundProblem, options: EngineOptions) -> str:
    """options.backend, or for "auto": HiGHS where numba is missing, else as
    `loading.route` says (the engine, or HiGHS for a small problem while a cold cache is
    filled in the background)."""
    if options.backend != "auto":
        return options.backend
    if not engine_available():
        return "highs"
    from identifiable.attention.lp import loading

    return loading.route(problem.movable.sum(1), problem.aq.shape[1])


def engine_available() -> bool:
    """Whether the compiled engine can run here (numba imports)."""
    from identifiable.store import jitcache

    return jitcache.available()


def _check_layout(problem: BoundProblem, options: EngineOptions) -> None:
    if options.order != "key":
        return
    if not problem.shared:
        raise ValueError("key order needs rows that share A (aq of shape [1, m, n])")
    keys = problem.allowed
    if (keys[:-1] & ~keys[1:]).any():  # see `kernel.advance`
        raise ValueError("key order needs key sets that grow (or stay) from row to row")


def _engine(problem: BoundProblem, options: EngineOptions) -> IntervalSolution:
    """The compiled lock step: all maxima (phase 1), then the minima no visited point
    settled (phase 2: a maximising vertex has at most m non-zero keys, so it settles most
    minima at 0)."""
    movable, n_rows = problem.movable, problem.raw.shape[0]
    rows_live = np.flatnonzero(movable.any(1))
    order = options.order
    if order == "auto":
        order = "key" if problem.shared and rows_live.size >= 8 else "row"
    b = _start(problem, rows_live, options)
    prob = _arrays(problem, options)
    groups = []
    for sense in (1, -1):
        todo, size = movable, options.block or n_rows
        if sense < 0:
            b.lower[movable & b.zero_seen] = 0.0  # minima proved by visited points
            todo, size = movable & ~b.zero_seen, min(size, options.min_block)
        tasks = _layout(todo, sense, size, order, max(1, int(options.chains_per_row)))
        if tasks:
            groups.append(run(prob, b, tasks, order == "row", problem.what, options))
    return _finish(problem, options, b, tuple(groups))


def _finish(problem, options, b: Bounds, groups: tuple) -> IntervalSolution:
    """The bounds (kept around a), checked (`verify`), as an `IntervalSolution`."""
    lower, upper = np.minimum(b.lower, problem.raw), np.maximum(b.upper, problem.raw)
    certs = _certificates(b.certs, problem.aq.shape[1])
    if options.verify != "off":
        check(problem, lower, upper, certs)
    return IntervalSolution(
        lower, upper, b.solved, b.pivots, b.fallbacks, b.vertices, certs, "engine", groups
    )


def _highs(problem: BoundProblem, options: EngineOptions) -> IntervalSolution:
    """`bound_keys` by HiGHS (`hot.highs_bounds`), checked as the engine is."""
    from identifiable.attention.lp.hot import highs_bounds

    vertices: dict | None = {} if options.keep_vertices else None
    aq = np.require(problem.aq, np.float64, ["C"])
    raw = np.ascontiguousarray(problem.raw, dtype=np.float64)
    lower, upper, solved, certs = highs_bounds(
        aq,
        raw,
        problem.allowed,
        problem.movable,
        what=problem.what,
        deadline=options.deadline,
        vertices=vertices,
        threads=options.threads,
    )
    keep = 2 * options.verify_sample
    if options.verify == "sample" and not options.keep_vertices and len(certs) > keep:
        pick = np.linspace(0, len(certs) - 1, keep).astype(np.int64)
        certs = Certificates(
            certs.rows[pick], certs.keys[pick], certs.senses[pick], certs.bases[pick]
        )
    if options.verify != "off":
        check(problem, lower, upper, certs)
    zeros = np.zeros(raw.shape[0], dtype=np.int64)
    return IntervalSolution(lower, upper, solved, zeros, zeros.copy(), vertices, certs, "highs")


def _certificates(parts: list, m: int) -> Certificates:
    """The certificates the groups recorded, in one record."""
    if not parts:
        return Certificates.empty(m)
    return Certificates(*(np.concatenate([p[i] for p in parts]) for i in range(4)))


def check(problem: BoundProblem, lower, upper, certs: Certificates) -> None:
    """Refuse bounds that fail the independent check (`verify`), in one line."""
    bad = failures(problem.aq, problem.raw, problem.allowed, lower, upper, certs)
    if bad:
        raise IdentifiableError(
            f"{problem.what or 'interval map'}: a bound failed its independent check "
            f"({bad[0]}; {len(bad)} in all); this is a bug: please report it, and bound "
            "these rows with the HiGHS backend meanwhile"
        )


def _arrays(problem: BoundProblem, options: EngineOptions) -> tuple:
    """(A, Aᵀ, b, allowed, A in single precision packed in panels, `panels.pack`) as the
    compiled engine takes them: contiguous and writable (a read-only or strided array is
    another type to numba, which would compile again). The packed A serves the products
    that rows sharing A make together, in lock steps whose chains span
    options.single_min_keys keys or more; when no row can, an empty one."""
    from identifiable.attention.lp import panels
    from identifiable.attention.lp.state import Problem

    aq = np.require(problem.aq, np.float64, ["C", "W"])
    a = problem.raw
    b = a @ aq[0].T if aq.shape[0] == 1 else np.einsum("rmn,rn->rm", aq, a)
    at = np.ascontiguousarray(aq.transpose(0, 2, 1))
    single = aq.shape[0] == 1 and aq.shape[2] >= options.single_min_keys
    m = aq.shape[1]
    a32 = panels.pack(at[0]) if single else np.zeros((0, m, panels.WIDTH), np.float32)
    at32 = at[0].astype(np.float32) if single else np.zeros((0, m), np.float32)
    allowed = np.require(problem.allowed, bool, ["C", "W"])
    return Problem(aq, at, np.ascontiguousarray(b), allowed, a32, at32)


def _start(problem: BoundProblem, rows_live: np.ndarray, options: EngineOptions) -> Bounds:
    """The shared state before any LP: a, the crossover vertex of every live row (a
    feasible basis, the start of every chain) and the keys it proves at 0."""
    aq, allowed = problem.aq, problem.allowed
    a = np.ascontiguousarray(problem.raw, dtype=np.float64)
    n_rows = a.shape[0]
    zeros = np.zeros(n_rows, dtype=np.int64)
    start = np.zeros((n_rows, aq.shape[1]), dtype=np.int64)
    sample = options.verify_sample
    if options.verify == "all" or options.keep_vertices:
        sample = -1
    elif options.verify == "off":
        sample = 0
    b = Bounds(
        a,
        a.copy(),
        a.copy(),
        ~allowed,
        a.copy(),
        a.sum(1),
        start,
        {} if options.keep_vertices else None,
        zeros,
        zeros.copy(),
        zeros.copy(),
        [],
        sample,
    )
    if rows_live.size:
        from identifiable.attention.lp import loading
        from identifiable.attention.lp.crossover import crossover

        loading.ensure_compiled()  # the crossover's walk is compiled with the engine
        sub = aq if aq.shape[0] == 1 else aq[rows_live]
        start[rows_live] = crossover(sub, a[rows_live], allowed[rows_live], options.threads)
    for q in rows_live:
        b.zero_seen[q, np.setdiff1d(np.flatnonzero(allowed[q]), start[q])] = True
    return b


def _layout(todo: np.ndarray, s: int, size: int, order: str, k_chains: int) -> list:
    """Task lists (row, key, sense) for the bounds todo `[R, n]` bool of sense s: per key
    and block of `size` rows ("key" order), or `k_chains` per row, each taking every
    k-th key ("row" order, where the lists only seed the row's pool: `kernel.pool_next`
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
