"""White-box tests of the compiled engine's thread groups (`attention/lp/groups.py`): the
merge of the groups' own copies, a failing group stopping the others, and the one BLAS
thread the lock step runs under. (The public contract: tests/attention/test_engine_threads.py.)"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from helpers.traces import engine, shared_rows, synthetic_trace
from identifiable.attention import interval_map
from identifiable.attention.lp import compiled, ensure_compiled, groups
from identifiable.errors import IdentifiableError


def _problem(n: int, d_v: int, rows: int, seed: int):
    aq, a, movable, v = shared_rows(n, d_v, rows, seed)
    return aq, a, np.ones((rows, n), bool), movable, v


def _bounds(raw: np.ndarray) -> groups.Bounds:
    rows = raw.shape[0]
    zeros = np.zeros(rows, dtype=np.int64)
    start = np.tile(np.arange(2), (rows, 1))
    return groups.Bounds(raw, raw.copy(), raw.copy(), np.zeros(raw.shape, bool), raw.copy(),
                         raw.sum(1), start, {}, zeros, zeros.copy(), zeros.copy())  # fmt: skip


def test_merge_keeps_each_threads_own_bounds():
    """Fabricated copies: each thread settled other keys (into the shared lower and
    upper) and saw other points. The merge must keep both threads' zeros and values seen
    (taking either copy whole loses the other's), OR the zeros, take the largest values
    seen, add the counts and keep the first thread's move of a row's start basis."""
    raw = np.array([[0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    b = _bounds(raw)
    p0, p1 = groups.copy(b), groups.copy(b)
    assert p0.upper is b.upper and p1.lower is b.lower and p0.seen_max is not b.seen_max
    p0.upper[0, 1], p0.lower[1, 0], p0.zero_seen[0, 3] = 0.9, 0.0, True
    p1.upper[0, 2], p1.lower[1, 3], p1.zero_seen[1, 1] = 0.7, 0.05, True
    p0.seen_max[0, 1], p1.seen_max[0, 1] = 0.8, 0.6
    p1.seen_max[1, 2] = 0.3
    p0.solved[:], p1.solved[:] = [3, 0], [1, 2]
    p0.pivots[:], p1.pivots[:] = [30, 0], [5, 7]
    p1.fallbacks[1] = 1
    p0.start[1], p1.start[1], p1.start[0] = [2, 3], [1, 3], [0, 2]
    p0.vertices[(0, 1, 1)], p1.vertices[(0, 2, 1)] = np.ones(4), np.zeros(4)
    groups.merge(b, [p0, p1])
    assert b.upper[0].tolist() == [0.4, 0.9, 0.7, 0.1] and b.upper[1].tolist() == raw[1].tolist()
    assert b.lower[1].tolist() == [0.0, 0.25, 0.25, 0.05] and b.lower[0].tolist() == raw[0].tolist()
    assert b.zero_seen.tolist() == [[False, False, False, True], [False, True, False, False]]
    assert b.seen_max[0, 1] == 0.8 and b.seen_max[1].tolist() == [0.25, 0.25, 0.3, 0.25]
    assert b.solved.tolist() == [4, 2] and b.pivots.tolist() == [35, 7]
    assert b.fallbacks.tolist() == [0, 1]
    assert b.start.tolist() == [[0, 2], [2, 3]]  # row 1: thread 0 moved it first
    assert set(b.vertices) == {(0, 1, 1), (0, 2, 1)}


def test_a_failing_thread_stops_the_others(monkeypatch):
    """Thread 0 fails at once; thread 1 waits for the stop signal, then runs, and must end
    at its first check of it (after options.steps_per_call steps) instead of finishing."""
    aq, a, allowed, movable, _ = _problem(n=60, d_v=6, rows=4, seed=6)
    real = groups.run_group
    outcome: dict = {}

    first = threading.Lock()

    def group(prob, b, tasks, row_order, what, options, chain_bytes, stop):
        if first.acquire(blocking=False):  # the first group to start fails at once
            raise IdentifiableError("layer 0, head 0: made up")
        stop.wait(10)
        try:
            real(prob, b, tasks, row_order, what, options, chain_bytes, stop)
        except groups.Stopped:
            outcome["stopped"] = True
            raise
        outcome["stopped"] = False

    monkeypatch.setattr(groups, "run_group", group)
    with pytest.raises(IdentifiableError, match="made up"):
        engine(aq, a, allowed, movable, chains_per_row=8, order="row", threads=2)
    assert outcome == {"stopped": True}


def _blas_threads() -> dict[str, int]:
    from threadpoolctl import threadpool_info

    return {p["filepath"]: p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}


def test_the_engine_runs_on_one_blas_thread_and_restores_the_count(monkeypatch):
    """The compiled lock step runs with every BLAS pool on one thread (its GEMMs are small;
    a second thread only spins) and gives the caller's counts back, also after an error."""
    from threadpoolctl import threadpool_limits

    ensure_compiled()
    seen: list[set[int]] = []
    real = compiled.run_chains

    def spy(*args):
        seen.append(set(_blas_threads().values()))
        return real(*args)

    monkeypatch.setattr(compiled, "run_chains", spy)
    with threadpool_limits(2, user_api="blas"):  # the caller's count, whatever the machine
        before = _blas_threads()
        assert set(before.values()) == {2}
        interval_map(synthetic_trace(n=12, d_v=3, layers=1, heads=1))
        assert seen and all(s == {1} for s in seen)
        assert _blas_threads() == before
        monkeypatch.setattr(compiled, "run_chains", lambda *a: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            interval_map(synthetic_trace(n=12, d_v=3, layers=1, heads=1))
        assert _blas_threads() == before
