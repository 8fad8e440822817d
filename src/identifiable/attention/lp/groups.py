"""The compiled engine's chains in thread groups: each group runs its own lock step
(`lockstep.run_chains`) in its own thread on its own copy of what visited points prove,
and hands the LPs its chains cannot certify to HiGHS."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from identifiable.attention.lp.options import EngineOptions, OutOfTime
from identifiable.attention.lp.state import Certs, Shared, Tasks, new_counters, new_slots
from identifiable.errors import IdentifiableError
from identifiable.utils.threads import one_blas_thread


@dataclass
class Bounds:
    """What the chains of one `bound_keys` call share (arrays over rows R and keys n).

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


class Stopped(Exception):
    """A group ended because another group failed."""


def run(prob, b: Bounds, tasks: list, row_order: bool, what: str, options: EngineOptions) -> tuple:
    """The chains of `tasks` in the compiled lock step, in up to options.threads threads;
    returns the chains of each group.

    Each group runs every `groups`-th chain (round robin: the chains of one row, and of
    neighbouring rows, which cost about the same, alternate) in a lock step of its own,
    writing the bounds it owns in place, with its own copy of what visited points prove
    (`copy`), merged when all are done (`merge`). The engine releases the GIL. A group
    takes at least options.thread_chains chains, and the copies take at most
    options.thread_copy_bytes in all.
    """
    from identifiable.attention.lp.loading import ensure_compiled

    ensure_compiled()
    groups = max(
        1,
        min(
            int(options.threads),
            len(tasks) // options.thread_chains,
            options.thread_copy_bytes // max(1, copy_bytes(b)),
        ),
    )
    split = [tasks[g::groups] for g in range(groups)]
    with one_blas_thread():  # the GEMMs of a step are small: BLAS threads would only spin
        if groups == 1:
            run_group(prob, b, tasks, row_order, what, options, options.batch(1), None)
            return (len(tasks),)
        parts = [copy(b) for _ in range(groups)]
        stop = threading.Event()  # set by a group that fails, so that the others end too

        def one(g: int) -> None:
            try:
                run_group(
                    prob, parts[g], split[g], row_order, what, options, options.batch(groups), stop
                )
            except BaseException:
                stop.set()
                raise

        with ThreadPoolExecutor(groups) as pool:
            futures = [pool.submit(one, g) for g in range(groups)]
        errors = [f.exception() for f in futures]
        first = next((e for e in errors if e is not None and not isinstance(e, Stopped)), None)
        if first is not None:
            raise first
    merge(b, parts)
    return tuple(len(s) for s in split)


def copy(b: Bounds) -> Bounds:
    """The bounds as one group sees them: lower and upper shared (each is written only by
    the task that owns it, so the threads never touch the same element), the rest its own
    (what the visited points prove, which the kernel also reads, and the counts), so that
    no group's path depends on another's timing."""
    return Bounds(
        b.raw,
        b.lower,
        b.upper,
        b.zero_seen.copy(),
        b.seen_max.copy(),
        b.total,
        b.start.copy(),
        None if b.vertices is None else {},
        b.solved.copy(),
        b.pivots.copy(),
        b.fallbacks.copy(),
        [],
        b.sample,
    )


def copy_bytes(b: Bounds) -> int:
    """Bytes of one `copy` of b."""
    return b.zero_seen.nbytes + b.seen_max.nbytes + b.start.nbytes


def merge(b: Bounds, parts: list[Bounds]) -> None:
    """Fold the groups' own arrays into b (their bounds are already there): a point one
    group visited proves its zeros and values for all; counts add up; a row's start basis
    is the first group's that moved it (any feasible basis will do: the rule only keeps
    runs deterministic)."""
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


def run_group(
    prob,
    b: Bounds,
    tasks: list,
    row_order: bool,
    what: str,
    options: EngineOptions,
    chain_bytes: int,
    stop,
) -> None:
    """The chains of `tasks` in one compiled lock step, with HiGHS for the LPs it hands
    back; every options.steps_per_call steps the deadline (and `stop`, set when another
    group failed) is checked."""
    from identifiable.attention.lp import compiled, lockstep

    m, n = prob.a.shape[1:]
    work, counters, certs = _tasks(prob, b, tasks, row_order)
    # Chains in lock step share one pass over their B⁻¹ per step: past a core's cache that
    # pass slows down, so at most chain_bytes of them run at once.
    slots = new_slots(min(len(tasks), max(1, chain_bytes // (8 * m * m))), m, n)
    cfg = lockstep.config(options, m, row_order)
    shared = Shared(b.lower, b.upper, b.zero_seen, b.seen_max, b.total, b.start, b.solved, b.pivots)
    while True:
        code = compiled.entry(options.borrow)(
            prob, shared, slots, work, certs, counters, cfg, options.steps_per_call
        )
        if code == lockstep.DONE:
            break
        if code == lockstep.SINGULAR:  # never seen: pivots keep |α_rq| > PIVOT_TOL
            raise IdentifiableError(
                f"{what or 'interval map'}: a simplex basis became singular; bound "
                "these rows with the HiGHS backend"
            )
        for q, j, s in lockstep.waiting(slots):
            fallback(prob, b, q, j, s, what)
        if options.deadline is not None and time.time() > options.deadline:
            raise OutOfTime
        if stop is not None and stop.is_set():
            raise Stopped
    _keep(b, certs, int(counters["kept"][0]), n)


def _tasks(prob, b: Bounds, tasks: list, row_order: bool) -> tuple:
    """The task arrays of `run_chains`, its counters and the room for certificates."""
    m, n = prob.a.shape[1:]
    rows = np.array([t[0] for tl in tasks for t in tl], dtype=np.int64)
    keys = np.array([t[1] for tl in tasks for t in tl], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(tl) for tl in tasks])]).astype(np.int64)
    senses = np.array([tl[0][2] for tl in tasks], dtype=np.int64)
    pool = np.zeros((prob.b.shape[0], n), dtype=bool)
    if row_order:
        pool[rows, keys] = True
    room = rows.size if b.sample < 0 else b.sample
    certs = Certs(
        np.zeros(room, dtype=np.int64),
        np.zeros(room, dtype=np.int64),
        np.zeros(room, dtype=np.int64),
        np.zeros((room, m), dtype=np.int64),
        np.zeros((room, m)),
    )
    counters = new_counters(max(1, rows.size // room) if room else 1)
    return Tasks(rows[offsets[:-1]], senses, offsets, rows, keys, pool), counters, certs


def _keep(b: Bounds, certs: Certs, used: int, n: int) -> None:
    """The certificates (and witnesses) a group recorded, into b."""
    b.certs.append(
        (
            certs.rows[:used].copy(),
            certs.keys[:used].copy(),
            certs.senses[:used].copy(),
            certs.bases[:used].copy(),
        )
    )
    if b.vertices is None:
        return
    for t in range(used):
        x = np.zeros(n)
        x[certs.bases[t]] = np.maximum(certs.values[t], 0.0)
        b.vertices[(int(certs.rows[t]), int(certs.keys[t]), int(certs.senses[t]))] = x


def fallback(prob, b: Bounds, q: int, j: int, s: int, what: str) -> None:
    """The LP (row q, key j, sense s) goes to HiGHS; its bound, vertex and certificate are
    recorded."""
    from identifiable.attention.lp.hot import row_model

    aq, allowed = prob.a, prob.allowed
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
