"""The warm-started simplex engine of whole interval maps (docs/certified_attention.md).

`interval_simplex` lays out every movable key of a batch of rows as LP tasks of simplex
chains and runs them in the compiled lock step (`lockstep.run_chains`, pivots in
`kernel.py`), sharing one set of bounds; LPs the chains cannot certify go to HiGHS here.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from identifiable.attention.crossover import crossover
from identifiable.attention.lp.options import OutOfTime
from identifiable.attention.lp.verify import Certificates, failures
from identifiable.errors import IdentifiableError
from identifiable.utils.threads import one_blas_thread

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
# final basis (refined against B itself, or refactored from scratch: `kernel.refined`), the
# reduced costs d_k of maximising s·x_j (s = ±1) are d_k = −s W[p, k]
# (p the row of j in the basis). For every x ∈ P, s·x_j = s·x̂_j + Σ_{k ∉ B} d_k x_k ≤
# s·x̂_j + max(d, 0)·Σ_k x_k = s·x̂_j + max(d, 0)·Σa. So reduced costs ≤ OPT_TOL bound the
# gap to the true optimum by OPT_TOL·Σa (Σa = 1): the reported bound is exact to ~1e-11.
# The vertex x̂ itself is the witness that the bound is attained.

OPT_TOL = 1e-11  # = kernel.OPT_TOL (tested; kernel.py is imported only when the engine runs)
# Pivots between refactorisations of B⁻¹: max(_REFACTOR_EVERY, _REFACTOR_PER_M · m); every
# LP also ends on values recomputed at its basis (`kernel.refined`), so the cadence only
# bounds the drift that steers the pivots. 4m against 2m: a causal head at n = 256 (m = 129)
# took 32.3–32.8 s against 34.6–35.3 s, alternating in one process; 16m against 4m, once
# pricing had been made cheap (stop 43): the 32 widest rows at n = 512 on 2 threads 14.7 s
# against 15.5 s (8m 15.2 s; 32m and 64m 14.5-14.8 s, a plateau), the pivots within 0.01 %
# and the bounds within 2e-16.
_REFACTOR_EVERY = 25
_REFACTOR_PER_M = 16
# An LP still open after max(_PIVOTS_PER_LP, _PIVOTS_PER_M · m) pivots goes to HiGHS. Primal
# Dantzig pivots grow with m: ~400 per LP at m = 129 (Llama-3 heads, 512 keys), where a
# fixed cap of 400 sent 216 of 514 LPs of one row to HiGHS (32 s against 8.5 s).
_PIVOTS_PER_LP = 400
_PIVOTS_PER_M = 8
_MIN_BLOCK = 16  # "key" order, phase 2 (minima): rows per chain
# B⁻¹ of the chains in one lock step: _CHAIN_BYTES, split between the threads' lock steps
# down to _GROUP_BYTES each. Each pivot reads its chain's B⁻¹ twice and writes it once, so
# the batch should stay in cache; more chains a step make the products with A more
# efficient. So the batch follows the last-level cache the cores share: a quarter of it,
# between 2 and 8 MB (15 and 63 chains at m = 129); with 2 or more threads each thread's
# group gets half of it. Llama-3-sized head (benchmarks/bench_causal_certify.py), 2 threads:
# - 8 MB of L3, batches of 8 MB -> 2 MB: n = 256 37.5 -> 28.7 s; the 4 widest rows at
#   n = 512 on 1 thread 26.8 -> 21.5 s (1 MB on 1 thread, 0.5 MB on 2: slower);
# - 32 MB of L3, batches of 2 MB -> 8 MB: the 32 widest rows at n = 512 24.4 -> 19.7 s
#   (16 MB: 19.4 s), the head at n = 512 119.6 -> 99.0 s (16 MB: 98.7 s).
_LLC_PATH = "/sys/devices/system/cpu/cpu0/cache"
_LLC_DEFAULT = 8 << 20  # where the cache cannot be read: the 2 MB measured on 8 MB


def _llc_bytes(path: str = _LLC_PATH) -> int:
    """The size of cpu0's last-level cache (sysfs `indexN/size`, e.g. "32768K"), or
    `_LLC_DEFAULT` where it cannot be read. (glibc's sysconf can report the whole
    package's L3 on a virtual machine, 384 MB here against 32 MB shared by its cores.)"""
    best = 0
    try:
        for entry in os.listdir(path):
            if not entry.startswith("index"):
                continue
            with open(os.path.join(path, entry, "size")) as fh:
                text = fh.read().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * scale)
    except (OSError, ValueError):
        return _LLC_DEFAULT
    return best or _LLC_DEFAULT


def _batch_bytes(llc: int) -> int:
    """B⁻¹ bytes of one lock step for a last-level cache of `llc` bytes (see above)."""
    return min(8 << 20, max(2 << 20, llc // 4))


_CHAIN_BYTES = _batch_bytes(_llc_bytes())
_GROUP_BYTES = _CHAIN_BYTES // 2
# The shared second product of a lock step (ρ and Aᵀv: they steer the pivots, and bound
# nothing) runs in single precision from this many keys on, from A packed once
# (`panels.py`). With OpenBLAS's sgemm the threshold was 384 (a head at n = 256 took
# 1.05-1.08x with single precision); with the packed product, a causal head at n = 512 on 2
# threads, alternating in one process: 128 keys 48.9-50.9 s, 256 keys 49.9-52.2 s, 384 keys
# 58.4 s (medians), bounds within 2.4e-16. d is kept honest in double: `kernel.DRIFT`.
_SINGLE_MIN_KEYS = 128
_STEPS_PER_CALL = 16  # lock steps between checks of the deadline
_THREAD_CHAINS = 8  # chains per thread at least (`_run`)
_THREAD_COPY_BYTES = 2**28  # the threads' own copies of the shared state, in all (`_run`)
# Switches kept for the tests and benchmarks that measure the choices made: row order's
# pool takes basic keys first (1) or keys in index order (2); optima are certified on
# refined values (True) or each on a fresh factorisation (False).
_POOL_RULE = 1
_REFINE = True
# verify="sample": the independent check (`lp.verify`) takes about this many LPs of each
# lock step group, spread over its tasks (cost measured in benchmarks/records/engine.md)
_VERIFY_SAMPLE = 8


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
        certificates: the final bases of the LPs the verifier checked (`lp.verify`):
            every LP the simplex settled with verify="all" or keep_vertices, a sample
            with verify="sample", none with "off".
    """

    lower: np.ndarray
    upper: np.ndarray
    lp_solved: np.ndarray
    pivots: np.ndarray
    fallbacks: np.ndarray
    vertices: dict[tuple[int, int, int], np.ndarray] | None = None
    certificates: Certificates | None = None


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
    threads: int = 1,
    verify: str = "sample",
    backend: str = "engine",
) -> IntervalSolution:
    """Min and max of every movable x_j over each row's P, by warm-started simplex chains.

    Exact shortcuts, proofs and layouts: docs/certified_attention.md ("How the bounds
    are computed"). An LP the simplex cannot certify is handed to HiGHS (`fallbacks`).
    "auto" order takes "key" when the rows share A and there are at least 8 of them.

    Args:
        aq: `[R, m, n]` (or `[1, m, n]`, shared by all rows) Qᵀ per row, Q an orthonormal
            basis of col([T, 1]) over the row's keys (rows of zeros past a row's own rank
            are not allowed: group rows by m); columns of keys outside the key set are 0.
        a: `[R, n]` raw weights, 0 outside the key set.
        allowed: `[R, n]` bool, the row's key set.
        movable: `[R, n]` bool, keys the null space can move (see `movable_keys`).
        chains_per_row: "row" order: chains per row, all in the lock step (more chains,
            fewer steps, for long rows).
        keep_vertices: return the vertex that settled each bound (witnesses).
        what: prefix for error messages (e.g. "layer 2, head 3").
        order: "auto", "key" or "row" (see above).
        block: "key" order: rows per chain (default: all rows in one chain).
        deadline: a wall-clock time (`time.time()`); past it, raise `OutOfTime`.
        threads: the chains are split into up to this many groups, each run by its own
            lock step in its own thread (see `_run`); the bounds are the same certified
            optima, the pivots and witnesses those of the split.
        verify: "sample" (a few LPs of each group), "all" or "off": the bounds and the
            final bases of those LPs are checked by `lp.verify`, which shares no code with
            the pivots; a failure raises IdentifiableError.
        backend: "engine" (the compiled lock step) or "highs" (`lp.hot`: one HiGHS model
            per row, hot starts between keys; scipy's linprog without highspy).
    """
    if verify not in ("sample", "all", "off"):
        raise ValueError(f"verify must be 'sample', 'all' or 'off', not {verify!r}")
    n_rows = a.shape[0]
    rows_live = np.flatnonzero(movable.any(1))
    shared = aq.shape[0] == 1
    if order == "auto":
        order = "key" if shared and rows_live.size >= 8 else "row"
    if order == "key" and not shared:
        raise ValueError("key order needs rows that share A (aq of shape [1, m, n])")
    if order == "key" and (allowed[:-1] & ~allowed[1:]).any():  # see `kernel.advance`
        raise ValueError("key order needs key sets that grow (or stay) from row to row")
    if backend == "highs":
        return _highs(aq, a, allowed, movable, keep_vertices, what, deadline, verify, threads)
    b = _start(aq, a, allowed, rows_live, keep_vertices, threads)
    b.sample = 0 if verify == "off" else -1 if verify == "all" or keep_vertices else _VERIFY_SAMPLE
    prob = _problem(aq, a, allowed)
    for sense in (1, -1):
        todo, size = movable, block or n_rows
        if sense < 0:
            b.lower[movable & b.zero_seen] = 0.0  # minima proved by visited points (see above)
            # Few minima are left, often one key over many rows: short chains keep the
            # lock step busy (blocks of _MIN_BLOCK rows; measured on MiniLM heads).
            todo, size = movable & ~b.zero_seen, min(size, _MIN_BLOCK)
        tasks = _layout(todo, sense, size, order, max(1, int(chains_per_row)))
        if tasks:
            _run(prob, b, tasks, order == "row", what, deadline, threads)
    lower, upper = np.minimum(b.lower, a), np.maximum(b.upper, a)
    certs = _certificates(b.certs, aq.shape[1])
    if verify != "off":
        _check(prob[0], b.raw, prob[3], lower, upper, certs, what)
    return IntervalSolution(lower, upper, b.solved, b.pivots, b.fallbacks, b.vertices, certs)


def _highs(
    aq, a, allowed, movable, keep_vertices, what, deadline, verify, threads
) -> IntervalSolution:
    """`interval_simplex` by HiGHS (`lp.hot.highs_bounds`), checked as the engine is."""
    from identifiable.attention.lp.hot import highs_bounds

    vertices: dict | None = {} if keep_vertices else None
    aq = np.require(aq, np.float64, ["C"])
    a = np.ascontiguousarray(a, dtype=np.float64)
    lower, upper, solved, certs = highs_bounds(aq, a, allowed, movable, what=what,
                                               deadline=deadline, vertices=vertices,
                                               threads=threads)  # fmt: skip
    if verify == "sample" and len(certs) > 2 * _VERIFY_SAMPLE:
        pick = np.linspace(0, len(certs) - 1, 2 * _VERIFY_SAMPLE).astype(np.int64)
        certs = Certificates(certs.rows[pick], certs.keys[pick], certs.senses[pick],
                             certs.bases[pick])  # fmt: skip
    if verify != "off":
        _check(aq, a, allowed, lower, upper, certs, what)
    zeros = np.zeros(a.shape[0], dtype=np.int64)
    return IntervalSolution(lower, upper, solved, zeros, zeros.copy(), vertices, certs)


def _certificates(parts: list, m: int) -> Certificates:
    """The certificates the groups recorded, in one record."""
    if not parts:
        return Certificates.empty(m)
    return Certificates(*(np.concatenate([p[i] for p in parts]) for i in range(4)))


def _check(aq, raw, allowed, lower, upper, certs: Certificates, what: str) -> None:
    """Refuse bounds that fail the independent check (`lp.verify`), in one line."""
    bad = failures(aq, raw, allowed, lower, upper, certs)
    if bad:
        raise IdentifiableError(
            f"{what or 'interval map'}: a bound of the simplex engine failed its independent "
            f"check ({bad[0]}; {len(bad)} in all); this is a bug: please report it, and bound "
            "these rows with backend='highs'"
        )


def _problem(aq, a, allowed) -> tuple:
    """(A, Aᵀ, b, allowed, A in single precision packed in panels, `panels.pack`) as the
    compiled engine takes them:
    contiguous and writable (a read-only or strided array is another type to numba, which
    would compile again). The packed single-precision A is for the products that rows sharing A
    make together (`lockstep`), in lock steps whose chains span _SINGLE_MIN_KEYS keys or
    more; when no row can, an empty one."""
    aq = np.require(aq, np.float64, ["C", "W"])
    b = a @ aq[0].T if aq.shape[0] == 1 else np.einsum("rmn,rn->rm", aq, a)
    at = np.ascontiguousarray(aq.transpose(0, 2, 1))
    from identifiable.attention import panels

    single = aq.shape[0] == 1 and aq.shape[2] >= _SINGLE_MIN_KEYS
    a32 = panels.pack(at[0]) if single else np.zeros((0, aq.shape[1], panels.WIDTH), np.float32)
    return aq, at, np.ascontiguousarray(b), np.require(allowed, bool, ["C", "W"]), a32


def _start(aq, a, allowed, rows_live, keep_vertices: bool, threads: int = 1) -> _Bounds:
    """The shared state before any LP: a, the crossover vertex of every live row (a
    feasible basis, the start of every chain) and the keys it proves at 0."""
    n_rows = a.shape[0]
    zeros = np.zeros(n_rows, dtype=np.int64)
    start = np.zeros((n_rows, aq.shape[1]), dtype=np.int64)
    a = np.ascontiguousarray(a, dtype=np.float64)
    b = _Bounds(a, a.copy(), a.copy(), ~allowed, a.copy(), a.sum(1), start,
                {} if keep_vertices else None, zeros, zeros.copy(), zeros.copy())  # fmt: skip
    if rows_live.size:
        from identifiable.attention import lockstep

        lockstep.ensure_compiled()  # the crossover's walk is compiled with the engine
        sub = aq if aq.shape[0] == 1 else aq[rows_live]
        start[rows_live] = crossover(sub, a[rows_live], allowed[rows_live], threads)
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


@dataclass
class _Bounds:
    """What the chains of one `interval_simplex` call share (arrays over rows R and keys n).

    Attributes:
        raw: `[R, n]` the raw weights a.
        lower, upper: `[R, n]` bounds found so far (a where not yet settled).
        zero_seen: `[R, n]` bool, keys at 0 in some feasible point visited (minimum 0).
        seen_max: `[R, n]` the largest value of each key at a visited point.
        total: `[R]` Σa per row (P ⊂ [0, Σa]ⁿ).
        start: `[R, m]` a feasible basis per row (the start of every chain).
        vertices: (row, key, sense) → the vertex that settled that bound, if kept.
        solved, pivots, fallbacks: `[R]` int64 counts (see `IntervalSolution`).
        certs: (rows, keys, senses, bases) of the LPs kept for the verifier, per group.
        sample: LPs a group keeps for the verifier (−1: all of them).
    """

    raw: np.ndarray
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
    certs: list = field(default_factory=list)
    sample: int = 0


def _run(prob, b: _Bounds, tasks: list, row_order: bool, what: str, deadline, threads: int) -> None:
    """The chains of `tasks` in the compiled lock step, in up to `threads` threads.

    Each thread runs every `threads`-th chain (round robin: the chains of one row, and
    neighbouring rows, which cost about the same, alternate) in a lock step of its own,
    writing the bounds it owns in place, with its own copy of what visited points prove,
    merged when all are done (`_copy`, `_merge`). The
    compiled engine releases the GIL, so the threads run on as many cores. A thread takes
    at least `_THREAD_CHAINS` chains: fewer would leave its products with A too small;
    and the threads' own arrays (`_copy`) take at most `_THREAD_COPY_BYTES` in all
    (R·n·9 + R·m·8 bytes a thread: 38 MB for a bidirectional head at n = 2,048).
    """
    from identifiable.attention import lockstep

    lockstep.ensure_compiled()
    groups = max(1, min(int(threads), len(tasks) // _THREAD_CHAINS,
                        _THREAD_COPY_BYTES // max(1, _copy_bytes(b))))  # fmt: skip
    with one_blas_thread():  # the GEMMs of a step are small: BLAS threads would only spin
        if groups == 1:
            _run_group(prob, b, tasks, row_order, what, deadline, _CHAIN_BYTES, None)
            return
        parts = [_copy(b) for _ in range(groups)]
        stop = threading.Event()  # set by a group that fails, so that the others end too

        def one(g: int) -> None:
            try:
                _run_group(prob, parts[g], tasks[g::groups], row_order, what, deadline,
                           _GROUP_BYTES, stop)  # fmt: skip
            except BaseException:
                stop.set()
                raise

        with ThreadPoolExecutor(groups) as pool:
            futures = [pool.submit(one, g) for g in range(groups)]
        errors = [f.exception() for f in futures]
        first = next((e for e in errors if e is not None and not isinstance(e, _Stopped)), None)
        if first is not None:
            raise first
    _merge(b, parts)


class _Stopped(Exception):
    """A group of `_run` ended because another group failed."""


def _copy(b: _Bounds) -> _Bounds:
    """The bounds as one thread of `_run` sees them: lower and upper shared (each is
    written only by the task that owns it, so the threads never touch the same element),
    the rest its own (what the visited points prove, which the kernel also reads, and
    the counts), so that no thread's path depends on another's timing."""
    return _Bounds(b.raw, b.lower, b.upper, b.zero_seen.copy(), b.seen_max.copy(), b.total,
                   b.start.copy(), None if b.vertices is None else {}, b.solved.copy(),
                   b.pivots.copy(), b.fallbacks.copy(), [], b.sample)  # fmt: skip


def _copy_bytes(b: _Bounds) -> int:
    """Bytes of one `_copy` of b."""
    return b.zero_seen.nbytes + b.seen_max.nbytes + b.start.nbytes


def _merge(b: _Bounds, parts: list[_Bounds]) -> None:
    """Fold the threads' own arrays into b (their bounds are already there): a point one
    thread visited proves its zeros and values for all; counts add up; a row's start
    basis is the first thread's that moved it (any feasible basis will do: the rule only
    keeps runs deterministic)."""
    start0 = b.start.copy()
    solved0, pivots0, fallbacks0 = b.solved.copy(), b.pivots.copy(), b.fallbacks.copy()
    for p in parts:
        b.zero_seen |= p.zero_seen
        np.maximum(b.seen_max, p.seen_max, out=b.seen_max)
        b.solved += p.solved - solved0
        b.pivots += p.pivots - pivots0
        b.fallbacks += p.fallbacks - fallbacks0
        moved = (p.start != start0).any(1) & (b.start == start0).all(1)
        b.start[moved] = p.start[moved]
        if b.vertices is not None and p.vertices is not None:
            b.vertices.update(p.vertices)
        b.certs += p.certs


def _run_group(prob, b: _Bounds, tasks: list, row_order: bool, what: str, deadline,
               chain_bytes: int, stop) -> None:  # fmt: skip
    """The chains of `tasks` in one compiled lock step, with HiGHS for the LPs it hands
    back; every `_STEPS_PER_CALL` steps the deadline (and `stop`, set when another
    thread's group failed) is checked."""
    from identifiable.attention import kernel, lockstep

    m, n = prob[0].shape[1:]
    n_rows = prob[2].shape[0]
    rows = np.array([t[0] for tl in tasks for t in tl], dtype=np.int64)
    keys = np.array([t[1] for tl in tasks for t in tl], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(tl) for tl in tasks])]).astype(np.int64)
    first = rows[offsets[:-1]]
    senses = np.array([tl[0][2] for tl in tasks], dtype=np.int64)
    pool = np.zeros((n_rows, n), dtype=bool)
    if row_order:
        pool[rows, keys] = True
    # Chains in lock step share one pass over their B⁻¹ per step: past a core's cache that
    # pass slows down, so at most chain_bytes of them run at once (see _CHAIN_BYTES).
    slots = lockstep.new_slots(min(len(tasks), max(1, chain_bytes // (8 * m * m))), m, n)
    state = slots[7]
    cfg = np.array([max(_PIVOTS_PER_LP, _PIVOTS_PER_M * m), max(_REFACTOR_EVERY, _REFACTOR_PER_M * m),
                    row_order, _POOL_RULE if row_order else 0, _REFINE, _SINGLE_MIN_KEYS],
                   dtype=np.int64)  # fmt: skip
    room = rows.size if b.sample < 0 else b.sample
    vert = (np.zeros(room, dtype=np.int64), np.zeros(room, dtype=np.int64),
            np.zeros(room, dtype=np.int64), np.zeros((room, m), dtype=np.int64),
            np.zeros((room, m)))  # fmt: skip
    # witnesses kept, LPs settled, every how many LPs one is kept, next chain to start
    counters = np.array([0, 0, max(1, rows.size // room) if room else 1, 0], dtype=np.int64)
    bnd = (b.lower, b.upper, b.zero_seen, b.seen_max, b.total, b.start, b.solved, b.pivots)
    work = (first, senses, offsets, rows, keys, pool)
    while True:
        code = lockstep.run_chains(prob, bnd, slots, work, vert, counters[:3], cfg,
                                   counters[3:], _STEPS_PER_CALL)  # fmt: skip
        if code == lockstep.DONE:
            break
        if code == lockstep.SINGULAR:  # never seen: pivots keep |α_rq| > PIVOT_TOL
            raise IdentifiableError(
                f"{what or 'interval map'}: a simplex basis became singular; bound "
                "this row with attention.certificates.interval_lp (HiGHS per key)"
            )
        for c in np.flatnonzero(state[:, kernel.WAIT]):
            _fallback(prob, b, state[c], what)
            state[c, kernel.WAIT], state[c, kernel.RESTART] = 0, 1
        if deadline is not None and time.time() > deadline:
            raise OutOfTime
        if stop is not None and stop.is_set():
            raise _Stopped
    used = int(counters[0])
    b.certs.append(tuple(v[:used].copy() for v in vert[:4]))
    if b.vertices is not None:
        for t in range(used):
            x = np.zeros(n)
            x[vert[3][t]] = np.maximum(vert[4][t], 0.0)
            b.vertices[(int(vert[0][t]), int(vert[1][t]), int(vert[2][t]))] = x


def _fallback(prob, b: _Bounds, st: np.ndarray, what: str) -> None:
    """The LP of a chain's state st goes to HiGHS; its bound and vertex are recorded."""
    from identifiable.attention import kernel
    from identifiable.attention.lp.hot import row_model

    q, j, s = int(st[kernel.ROW]), int(st[kernel.J]), int(st[kernel.S])
    aq, allowed = prob[0], prob[3]
    b.fallbacks[q] += 1
    model = row_model(aq[0 if aq.shape[0] == 1 else q])
    model.load(model.a @ b.raw[q], allowed[q])
    where = f"{what}: " if what else ""
    x, basic = model.solve(j, s, b.raw[q], f"{where}bounding key {j}")
    if basic is not None and b.sample != 0:
        b.certs.append((np.array([q]), np.array([j]), np.array([s]), basic[None]))
    b.zero_seen[q] |= (x <= 0.0) & allowed[q]
    np.maximum(b.seen_max[q], x, out=b.seen_max[q])
    (b.upper if s > 0 else b.lower)[q, j] = float(x[j])
    if b.vertices is not None:
        b.vertices[(q, j, s)] = x
