"""The maintained backend: every bound by HiGHS (highspy), one persistent model per row and
hot starts between keys.

One model holds a row's P = {x ≥ 0 : A x = b} (A `[m, n]` dense, column-wise). Its 2n LPs
differ only in their objective, so between keys only one cost changes and HiGHS starts
from the previous optimal basis. Rows that share A share one model: the next row changes
b (`changeRowsBounds`) and the bounds of the keys it adds. Every bound is read from the
final basis that HiGHS reports (x_B = B⁻¹b solved afresh, `verify.vertex`), which is also
the certificate the verifier checks; an LP whose basis holds a slack (so fewer than m
keys) is reported from HiGHS's point, polished onto P, without a certificate.

The same exact shortcuts as the compiled engine settle bounds without an LP: a key that
is 0 at a point already seen has minimum 0, a key that reaches Σa has maximum Σa.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from identifiable.attention.lp.options import OutOfTime
from identifiable.attention.lp.verify import Certificates, vertex
from identifiable.errors import IdentifiableError

# HiGHS's feasibility tolerances: its default 1e-7 is the size of the agreement asked of
# the backends (1e-9), so both are 1e-10, as for the per-LP route (`highs.solve_lp`)
OPTIONS: dict[str, bool | int | float | str] = {
    "output_flag": False,
    "presolve": "off",  # presolve would drop the basis that makes the next LP hot
    "solver": "simplex",
    "primal_feasibility_tolerance": 1e-10,
    "dual_feasibility_tolerance": 1e-10,
    "threads": 1,
}


def available() -> bool:
    """Whether highspy can be imported (the `highs` extra)."""
    try:
        import highspy  # noqa: F401
    except ImportError:
        return False
    return True


class RowModel:
    """A HiGHS model of P over A `[m, n]`, whose right-hand side and key set can change."""

    def __init__(self, a: np.ndarray) -> None:
        import highspy

        m, n = a.shape
        self.a, self.inf = a, highspy.kHighsInf
        self.h: Any = highspy.Highs()  # the stubs lack some of the methods used
        for name, value in OPTIONS.items():
            self.h.setOptionValue(name, value)
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = n, m
        lp.col_cost_, lp.col_lower_ = np.zeros(n), np.zeros(n)
        lp.col_upper_ = np.zeros(n)  # no key until `load` opens the row's
        lp.row_lower_, lp.row_upper_ = np.zeros(m), np.zeros(m)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.arange(0, m * n + 1, m, dtype=np.int32)
        lp.a_matrix_.index_ = np.tile(np.arange(m, dtype=np.int32), n)
        lp.a_matrix_.value_ = np.ascontiguousarray(a.T).ravel()
        self.h.passModel(lp)
        self.keys = np.zeros(n, dtype=bool)
        self.ok = highspy.HighsModelStatus.kOptimal

    def load(self, b: np.ndarray, keys: np.ndarray) -> None:
        """The row with right-hand side b `[m]` and key set `keys` `[n]` bool."""
        rows = np.arange(b.size, dtype=np.int32)
        self.h.changeRowsBounds(b.size, rows, b, b)
        flip = np.flatnonzero(keys != self.keys).astype(np.int32)
        if flip.size:
            upper = np.where(keys[flip], self.inf, 0.0)
            self.h.changeColsBounds(flip.size, flip, np.zeros(flip.size), upper)
        self.keys = keys.copy()

    def solve(
        self, j: int, s: int, raw: np.ndarray, what: str
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Maximise s·x_j over the loaded row: (the optimal point `[n]`, its basis `[m]` of
        keys, or None when HiGHS's basis holds a slack)."""
        self.h.changeColCost(j, -float(s))
        try:
            self.h.run()
            if self.h.getModelStatus() != self.ok:
                raise IdentifiableError(
                    f"the LP solver (HiGHS) failed while {what}: "
                    f"{self.h.modelStatusToString(self.h.getModelStatus())}"
                )
            basic = np.asarray(self.h.getBasicVariables()[1], dtype=np.int64)
        finally:
            self.h.changeColCost(j, 0.0)
        if basic.size == self.a.shape[0] and basic.min() >= 0 and self.keys[basic].all():
            return vertex(raw, self.a, basic), basic
        x = np.asarray(self.h.getSolution().col_value, dtype=np.float64)
        return np.where(self.keys, np.maximum(x, 0.0), 0.0), None


class LinprogModel:
    """`RowModel`'s interface on scipy's `linprog` (HiGHS inside scipy, one cold LP each),
    where highspy is not installed."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a
        self.keys = np.zeros(a.shape[1], dtype=bool)
        self.b = np.zeros(a.shape[0])

    def load(self, b: np.ndarray, keys: np.ndarray) -> None:
        self.b, self.keys = b, keys.copy()

    def solve(self, j: int, s: int, raw: np.ndarray, what: str) -> tuple[np.ndarray, None]:
        from scipy.optimize import linprog

        from identifiable.attention.lp.highs import LP_OPTIONS

        idx = np.flatnonzero(self.keys)
        c = np.zeros(idx.size)
        c[np.searchsorted(idx, j)] = -float(s)
        res = linprog(
            c,
            A_eq=self.a[:, idx],
            b_eq=self.b,
            bounds=(0, None),
            method="highs",
            options=LP_OPTIONS,
        )
        if res.status != 0 or res.x is None:
            raise IdentifiableError(f"the LP solver (HiGHS) failed while {what}: {res.message}")
        x = np.zeros(self.keys.size)
        x[idx] = np.maximum(res.x, 0.0)
        return x, None


def row_model(a: np.ndarray) -> RowModel | LinprogModel:
    """A persistent HiGHS model of A `[m, n]` (highspy), else scipy's one LP at a time."""
    return RowModel(a) if available() else LinprogModel(a)


@dataclass
class _Row:
    """What one row's LPs have found: bounds, and what the points seen prove."""

    lower: np.ndarray
    upper: np.ndarray
    zero_seen: np.ndarray
    seen_max: np.ndarray
    solved: int = 0


def highs_bounds(
    aq: np.ndarray,
    raw: np.ndarray,
    allowed: np.ndarray,
    movable: np.ndarray,
    *,
    what: str = "",
    deadline: float | None = None,
    vertices: dict | None = None,
    threads: int = 1,
) -> tuple:
    """Min and max of every movable x_j over each row's P, by HiGHS.

    Args: as `BoundProblem` (aq `[R or 1, m, n]`, raw, allowed, movable
    `[R, n]`); vertices: where given, (row, key, sense) → the optimal point of each LP;
    threads: jobs (a row, or a part of its keys when rows are fewer than threads) run in
    up to this many threads, each with its own models (HiGHS runs without the GIL).
    Returns: (lower, upper `[R, n]`, LPs solved `[R]`, `Certificates`).
    Raises: `OutOfTime` past `deadline` (checked between LPs).
    """
    lower, upper = raw.astype(np.float64), raw.astype(np.float64)
    solved = np.zeros(raw.shape[0], dtype=np.int64)
    rows = np.flatnonzero(movable.any(1))
    parts = max(1, -(-int(threads) // max(rows.size, 1)))  # key parts per row
    jobs = [
        (int(q), movable[q] & (np.cumsum(movable[q]) % parts == p))
        for q in rows
        for p in range(parts)
    ]
    local = threading.local()
    found: list[tuple] = [() for _ in jobs]

    def job(i: int) -> None:
        q, keys = jobs[i]
        if aq.shape[0] == 1:
            if not hasattr(local, "model"):
                local.model = row_model(aq[0])
            model = local.model
        else:
            model = row_model(aq[q])
        found[i] = _bound_row(model, q, raw[q], allowed[q], keys, what, deadline, vertices)

    if min(int(threads), len(jobs)) <= 1:
        for i in range(len(jobs)):
            job(i)
    else:
        with ThreadPoolExecutor(min(int(threads), len(jobs))) as pool:
            for f in [pool.submit(job, i) for i in range(len(jobs))]:
                f.result()
    certs = []
    for (q, keys), (lo, hi, count, row_certs) in zip(jobs, found, strict=True):
        lower[q, keys], upper[q, keys] = lo[keys], hi[keys]
        solved[q] += count
        certs += row_certs
    return np.minimum(lower, raw), np.maximum(upper, raw), solved, _pack(certs, aq.shape[1])


def _bound_row(
    model,
    q: int,
    raw: np.ndarray,
    allowed: np.ndarray,
    keys: np.ndarray,
    what: str,
    deadline: float | None,
    vertices: dict | None,
) -> tuple:
    """The bounds of the keys `keys` of row q (raw `[n]`, key set allowed `[n]`) on a model:
    (lower, upper `[n]`, LPs solved, certificates as (row, key, sense, basis))."""
    model.load(model.a @ raw, allowed)
    r = _Row(raw.copy(), raw.copy(), ~allowed, raw.copy())
    total = float(raw.sum())
    where = f"{what}: " if what else ""
    certs = []
    for s in (1, -1):
        for j in np.flatnonzero(keys):
            if s > 0 and r.seen_max[j] >= total - 1e-12:
                r.upper[j] = total
                continue
            if s < 0 and r.zero_seen[j]:
                r.lower[j] = 0.0
                continue
            if deadline is not None and time.time() > deadline:
                raise OutOfTime
            x, basic = model.solve(int(j), s, raw, f"{where}bounding key {j}")
            r.solved += 1
            r.zero_seen |= x <= 0.0
            np.maximum(r.seen_max, x, out=r.seen_max)
            (r.upper if s > 0 else r.lower)[j] = x[j]
            if basic is not None:
                certs.append((q, int(j), s, basic))
            if vertices is not None:
                vertices[(q, int(j), s)] = x
    return r.lower, r.upper, r.solved, certs


def _pack(certs: list, m: int) -> Certificates:
    if not certs:
        return Certificates.empty(m)
    rows, keys, senses, bases = zip(*certs, strict=True)
    as_int = lambda v: np.array(v, dtype=np.int64)  # noqa: E731
    return Certificates(as_int(rows), as_int(keys), as_int(senses), np.stack(bases))
