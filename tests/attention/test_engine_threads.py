"""The interval engine in several threads (`EngineOptions.threads`): the chains split round
robin into groups, one lock step per group on a private copy of what visited points prove,
merged afterwards. Bounds equal one thread's and per-key LPs; the split is deterministic;
the deadline stops every group; bad thread counts are refused in one line. (The groups'
own machinery, merge and stop, is tested white-box in tests/attention/lp/.)"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from helpers.traces import assert_certified, engine, shared_rows, synthetic_trace
from identifiable.attention import interval_map
from identifiable.attention.certificates import row_problem
from identifiable.attention.intervals import _row_problem
from identifiable.attention.lp import EngineOptions, OutOfTime, batch_bytes, llc_bytes
from identifiable.errors import IdentifiableError
from identifiable.utils.threads import engine_threads


def _problem(n: int, d_v: int, rows: int, seed: int):
    aq, a, movable, v = shared_rows(n, d_v, rows, seed)
    return aq, a, np.ones((rows, n), bool), movable, v


@pytest.mark.parametrize(("order", "threads"), [("row", 2), ("row", 3), ("key", 2)])
def test_threads_give_the_bounds_of_one_thread_and_of_per_key_lps(order, threads):
    aq, a, allowed, movable, v = _problem(n=40, d_v=5, rows=6, seed=3)
    one = engine(aq, a, allowed, movable, chains_per_row=8, order=order)
    many = engine(aq, a, allowed, movable, chains_per_row=8, order=order, threads=threads,
                  keep_vertices=True)  # fmt: skip
    chains = sum(one.groups[0])
    assert len(one.groups[0]) == 1 and chains >= threads * EngineOptions().thread_chains
    assert len(many.groups[0]) == threads and sum(many.groups[0]) == chains  # the maxima
    np.testing.assert_allclose(many.lower, one.lower, atol=1e-9)
    np.testing.assert_allclose(many.upper, one.upper, atol=1e-9)
    assert_certified(many, a, v)  # every group's witnesses came back
    assert int(many.fallbacks.sum()) == 0 and int(many.pivots.sum()) > 0


def test_threads_are_deterministic():
    """Each thread's chains and their order are fixed by the split, so a rerun repeats
    every count and every bound bit for bit."""
    aq, a, allowed, movable, _ = _problem(n=40, d_v=5, rows=6, seed=4)
    runs = [engine(aq, a, allowed, movable, chains_per_row=8, order="row", threads=2)
            for _ in range(2)]  # fmt: skip
    assert np.array_equal(runs[0].upper, runs[1].upper)
    assert np.array_equal(runs[0].lower, runs[1].lower)
    assert np.array_equal(runs[0].pivots, runs[1].pivots)


def test_too_few_chains_stay_in_one_group():
    aq, a, allowed, movable, _ = _problem(n=20, d_v=4, rows=1, seed=5)
    sol = engine(aq, a, allowed, movable, chains_per_row=4, order="row", threads=4)
    assert sol.groups[0] == (4,)


def test_threads_honour_the_deadline():
    aq, a, allowed, movable, _ = _problem(n=60, d_v=6, rows=4, seed=7)
    with pytest.raises(OutOfTime):
        engine(aq, a, allowed, movable, chains_per_row=8, order="row", threads=2,
               deadline=time.time() - 1.0)  # fmt: skip


def test_interval_map_and_one_row_use_the_threads():
    """A causal head whose nested rows run one chain per row: with threads=2 the map equals
    the one-thread map; one row's 3 chains split 2 + 1 over two groups when a group may take
    a single chain."""
    trace = synthetic_trace(n=48, d_v=4, d=10, causal=True, seed=12, dtype=torch.float64)
    one = interval_map(trace, layers=[1], heads=[0], threads=1)
    two = interval_map(trace, layers=[1], heads=[0], threads=2)
    torch.testing.assert_close(two.lower, one.lower, atol=1e-9, rtol=0)
    torch.testing.assert_close(two.upper, one.upper, atol=1e-9, rtol=0)
    assert two.fallbacks == 0
    a, seen, _, _, basis, _ = _row_problem(trace, 1, 0, 47, None)
    p = row_problem(a[seen].numpy(), basis)
    row = engine(p.aq, p.raw, p.allowed, p.movable, chains_per_row=3, threads=2,
                 thread_chains=1)  # fmt: skip
    assert row.groups[0] == (2, 1)
    np.testing.assert_allclose(row.lower[0], one.lower[0, 0, 47].numpy(), atol=1e-9, rtol=0)
    np.testing.assert_allclose(row.upper[0], one.upper[0, 0, 47].numpy(), atol=1e-9, rtol=0)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_bad_thread_counts_are_refused_in_one_line(bad):
    with pytest.raises(
        IdentifiableError, match=r"^threads=.*(must be at least 1|takes a whole number)"
    ):
        engine_threads(bad)
    assert engine_threads(None) == torch.get_num_threads()
    assert engine_threads(3) == 3


def test_threads_are_capped_by_the_memory_of_their_copies():
    """Each group copies what the visited points prove ([R, n] bool and float, [R, m]
    starts); past thread_copy_bytes in all, fewer groups run."""
    aq, a, allowed, movable, _ = _problem(n=40, d_v=5, rows=6, seed=3)
    one_copy = 6 * 40 * 9 + 6 * aq.shape[1] * 8
    sol = engine(aq, a, allowed, movable, chains_per_row=8, order="row", threads=4,
                 thread_copy_bytes=2 * one_copy)  # fmt: skip
    assert len(sol.groups[0]) == 2


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
        ({"index0": "32K", "index3": "lots"}, 8 << 20, 2 << 20),
    ],
)
def test_the_batch_follows_the_last_level_cache(tmp_path, sizes, llc, batch):
    assert llc_bytes(_caches(tmp_path, sizes)) == llc
    assert batch_bytes(llc) == batch


def test_an_unreadable_cache_gives_the_default_batch(tmp_path):
    assert llc_bytes(str(tmp_path / "absent")) == 8 << 20
    assert batch_bytes(8 << 20) == 2 << 20  # as before caches were read
