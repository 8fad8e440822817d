"""The interval engine in several threads (`simplex._run`): the chains split round robin,
one lock step per thread on a private copy of the bounds, merged afterwards. Bounds
equal one thread's and per-key LPs; the split really runs in separate threads; a
failing thread stops the others; bad thread counts are refused in one line."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import identifiable.attention.simplex as simplex
from helpers.traces import assert_certified, shared_rows, synthetic_trace
from identifiable.attention import attention_intervals, interval_map
from identifiable.attention.certificates import OutOfTime, interval_simplex
from identifiable.errors import IdentifiableError
from identifiable.utils.threads import engine_threads


def _problem(n: int, d_v: int, rows: int, seed: int):
    aq, a, movable, v = shared_rows(n, d_v, rows, seed)
    return aq, a, np.ones((rows, n), bool), movable, v


def _spy_groups(monkeypatch) -> list:
    """(thread id, chains, sense) of every `_run_group` call. (Counting distinct thread
    ids would not do: the pool may hand a second group to a thread whose first is done.)"""
    calls: list = []
    real = simplex._run_group

    def spy(prob, b, tasks, *args):
        calls.append((threading.get_ident(), len(tasks), tasks[0][0][2]))
        return real(prob, b, tasks, *args)

    monkeypatch.setattr(simplex, "_run_group", spy)
    return calls


@pytest.mark.parametrize(("order", "threads"), [("row", 2), ("row", 3), ("key", 2)])
def test_threads_give_the_bounds_of_one_thread_and_of_per_key_lps(monkeypatch, order, threads):
    aq, a, allowed, movable, v = _problem(n=40, d_v=5, rows=6, seed=3)
    calls = _spy_groups(monkeypatch)
    one = interval_simplex(aq, a, allowed, movable, verify="all", chains_per_row=8, order=order)
    (_, chains, _), *_ = calls
    calls.clear()
    many = interval_simplex(aq, a, allowed, movable, verify="all", chains_per_row=8, order=order,
                            threads=threads, keep_vertices=True)  # fmt: skip
    maxima = [c for c in calls if c[2] > 0]
    assert len(maxima) == threads  # the maxima ran as `threads` groups, in pool threads
    assert sum(c[1] for c in maxima) == chains >= threads * simplex._THREAD_CHAINS
    assert threading.get_ident() not in {c[0] for c in maxima}
    np.testing.assert_allclose(many.lower, one.lower, atol=1e-9)
    np.testing.assert_allclose(many.upper, one.upper, atol=1e-9)
    assert_certified(many, a, v)  # every thread's witnesses came back
    assert int(many.fallbacks.sum()) == 0 and int(many.pivots.sum()) > 0


def test_threads_are_deterministic():
    """Each thread's chains and their order are fixed by the split, so a rerun repeats
    every count and every bound bit for bit."""
    aq, a, allowed, movable, _ = _problem(n=40, d_v=5, rows=6, seed=4)
    runs = [interval_simplex(aq, a, allowed, movable, verify="all", chains_per_row=8, order="row", threads=2)
            for _ in range(2)]  # fmt: skip
    assert np.array_equal(runs[0].upper, runs[1].upper)
    assert np.array_equal(runs[0].lower, runs[1].lower)
    assert np.array_equal(runs[0].pivots, runs[1].pivots)


def test_too_few_chains_stay_in_the_calling_thread(monkeypatch):
    aq, a, allowed, movable, _ = _problem(n=20, d_v=4, rows=1, seed=5)
    calls = _spy_groups(monkeypatch)
    interval_simplex(
        aq, a, allowed, movable, verify="all", chains_per_row=4, order="row", threads=4
    )
    assert {c[0] for c in calls} == {threading.get_ident()} and len(calls) == 1


def _bounds(raw: np.ndarray) -> simplex._Bounds:
    rows = raw.shape[0]
    zeros = np.zeros(rows, dtype=np.int64)
    start = np.tile(np.arange(2), (rows, 1))
    return simplex._Bounds(raw, raw.copy(), raw.copy(), np.zeros(raw.shape, bool), raw.copy(),
                           raw.sum(1), start, {}, zeros, zeros.copy(), zeros.copy())  # fmt: skip


def test_merge_keeps_each_threads_own_bounds():
    """Fabricated copies: each thread settled other keys (into the shared lower and
    upper) and saw other points. The merge must keep both threads' zeros and values seen
    (taking either copy whole loses the other's), OR the zeros, take the largest values
    seen, add the counts and keep the first thread's move of a row's start basis."""
    raw = np.array([[0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    b = _bounds(raw)
    p0, p1 = simplex._copy(b), simplex._copy(b)
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
    simplex._merge(b, [p0, p1])
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
    at its first check of it (after `_STEPS_PER_CALL` steps) instead of finishing."""
    aq, a, allowed, movable, _ = _problem(n=60, d_v=6, rows=4, seed=6)
    real = simplex._run_group
    outcome: dict = {}

    first = threading.Lock()

    def group(prob, b, tasks, row_order, what, deadline, chain_bytes, stop):
        if first.acquire(blocking=False):  # the first group to start fails at once
            raise IdentifiableError("layer 0, head 0: made up")
        stop.wait(10)
        try:
            real(prob, b, tasks, row_order, what, deadline, chain_bytes, stop)
        except simplex._Stopped:
            outcome["stopped"] = True
            raise
        outcome["stopped"] = False

    monkeypatch.setattr(simplex, "_run_group", group)
    with pytest.raises(IdentifiableError, match="made up"):
        interval_simplex(
            aq, a, allowed, movable, verify="all", chains_per_row=8, order="row", threads=2
        )
    assert outcome == {"stopped": True}


def test_threads_honour_the_deadline():
    aq, a, allowed, movable, _ = _problem(n=60, d_v=6, rows=4, seed=7)
    with pytest.raises(OutOfTime):
        interval_simplex(aq, a, allowed, movable, verify="all", chains_per_row=8, order="row", threads=2,
                         deadline=time.time() - 1.0)  # fmt: skip


def test_interval_map_and_one_row_use_the_threads(monkeypatch):
    """A causal head whose nested rows run one chain per row: with threads=2 those chains
    split over 2 threads; the map equals the one-thread map. One row's chains split too."""
    trace = synthetic_trace(n=48, d_v=4, d=10, causal=True, seed=12, dtype=torch.float64)
    one = interval_map(trace, layers=[1], heads=[0], threads=1)
    calls = _spy_groups(monkeypatch)
    two = interval_map(trace, layers=[1], heads=[0], threads=2)
    groups = [c for c in calls if c[2] > 0 and c[0] != threading.get_ident()]
    assert len(groups) >= 2 and sum(c[1] for c in groups) >= 16  # the nested rows' chains
    torch.testing.assert_close(two.lower, one.lower, atol=1e-9, rtol=0)
    torch.testing.assert_close(two.upper, one.upper, atol=1e-9, rtol=0)
    assert two.fallbacks == 0
    calls.clear()
    monkeypatch.setattr(simplex, "_THREAD_CHAINS", 1)  # the row has 3 chains (keys // 16)
    row = attention_intervals(trace, 1, 0, 47, threads=2)
    assert [c[1] for c in calls if c[2] > 0] == [2, 1]
    torch.testing.assert_close(row.lower, one.lower[0, 0, 47], atol=1e-9, rtol=0)
    torch.testing.assert_close(row.upper, one.upper[0, 0, 47], atol=1e-9, rtol=0)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_bad_thread_counts_are_refused_in_one_line(bad):
    with pytest.raises(IdentifiableError, match=r"^threads must be a whole number of at least 1"):
        engine_threads(bad)
    assert engine_threads(None) == torch.get_num_threads()
    assert engine_threads(3) == 3


def test_threads_are_capped_by_the_memory_of_their_copies(monkeypatch):
    """Each thread copies what the visited points prove ([R, n] bool and float, [R, m]
    starts); past `_THREAD_COPY_BYTES` in all, fewer threads run."""
    aq, a, allowed, movable, _ = _problem(n=40, d_v=5, rows=6, seed=3)
    one_copy = 6 * 40 * 9 + 6 * aq.shape[1] * 8
    monkeypatch.setattr(simplex, "_THREAD_COPY_BYTES", 2 * one_copy)
    calls = _spy_groups(monkeypatch)
    interval_simplex(
        aq, a, allowed, movable, verify="all", chains_per_row=8, order="row", threads=4
    )
    assert len([c for c in calls if c[2] > 0]) == 2


def _caches(root, sizes: dict) -> str:
    """A fabricated sysfs cache folder: {"index0": "48K", ...}."""
    for entry, size in sizes.items():
        (root / entry).mkdir()
        (root / entry / "size").write_text(size + "\n")
    return str(root)


@pytest.mark.parametrize(
    ("sizes", "llc", "batch"),
    [
        ({"index0": "48K", "index2": "1024K", "index3": "32768K"}, 32 << 20, 8 << 20),
        ({"index0": "32K", "index2": "1024K", "index3": "8192K"}, 8 << 20, 2 << 20),
        ({"index0": "32K", "index3": "1G"}, 1 << 30, 8 << 20),  # capped at 63 chains
        ({"index0": "32K", "index2": "512K"}, 512 << 10, 2 << 20),  # no L3: at least 15
        ({"index0": "32K", "index3": "lots"}, simplex._LLC_DEFAULT, 2 << 20),
    ],
)
def test_the_batch_follows_the_last_level_cache(tmp_path, sizes, llc, batch):
    assert simplex._llc_bytes(_caches(tmp_path, sizes)) == llc
    assert simplex._batch_bytes(llc) == batch


def test_an_unreadable_cache_gives_the_default_batch(tmp_path):
    assert simplex._llc_bytes(str(tmp_path / "absent")) == simplex._LLC_DEFAULT
    assert simplex._batch_bytes(simplex._LLC_DEFAULT) == 2 << 20  # as before caches were read
