"""One head's interval map over several processes (`attention/mapwork.py`), and the thread
counts the engine runs under (`identifiable/utils/threads.py`)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import torch

import identifiable.attention.mapwork as mapwork
from helpers.traces import plain_bounds, synthetic_trace
from identifiable.attention import interval_map
from identifiable.attention.linalg import head_factors


def _nested_set(n: int = 240, d_v: int = 4):
    trace = synthetic_trace(n=n, d_v=d_v, d=10, causal=True, seed=5, dtype=torch.float64)
    sets = [rs for s in mapwork._head_sets(trace, 0, 1, list(range(n)), None) for rs in s]
    nested = [rs for rs in sets if rs.movable is not None]
    assert len(nested) == 1
    return trace, nested[0]


def _work(rs) -> np.ndarray:
    return rs.keys.sum(1).astype(float) ** 2 * (rs.null_dim > 0)


def test_pieces_cover_the_rows_in_order_with_balanced_work():
    """Cutting a nested set into 4 pieces keeps every row once, in order, each piece at
    least _MIN_PIECE rows with its key sets still nested, and no piece with more than 1.5×
    the mean work (Σ k²); an unshared set and pieces=1 come back whole."""
    _, rs = _nested_set()
    parts = mapwork._pieces(rs, 4)
    assert len(parts) == 4
    assert np.array_equal(np.concatenate([p.rows for p in parts]), rs.rows)
    assert np.array_equal(np.concatenate([p.movable for p in parts]), rs.movable)
    for p in parts:
        assert p.rows.size >= mapwork._MIN_PIECE and p.aq is rs.aq
        assert not (p.keys[:-1] & ~p.keys[1:]).any()  # still nested
    work = np.array([_work(p).sum() for p in parts])
    assert work.max() <= 1.5 * work.mean()
    whole = mapwork._pieces(rs, 1)
    assert len(whole) == 1 and whole[0] is rs
    # Fewer rows than two pieces' minimum: not cut.
    short = mapwork._rows_of(rs, 0, 2 * mapwork._MIN_PIECE - 1)
    assert len(mapwork._pieces(short, 4)) == 1


def test_equal_row_counts_would_not_balance_the_work():
    """Fabricated contrast: the same set cut into equal row counts puts ~2× the work in its
    last piece, which the work-balanced cut avoids (so the balance test can fail)."""
    _, rs = _nested_set()
    work = _work(rs)
    even = np.array_split(work, 4)
    assert max(p.sum() for p in even) > 1.5 * work.sum() / 4


def test_pool_plan_splits_a_head_only_when_heads_are_too_few(monkeypatch):
    monkeypatch.setattr(mapwork, "available_cores", lambda: 8)
    assert mapwork.pool_plan(8, 1, 512) == (8, 16)  # one head: 8 processes, 16 pieces
    assert mapwork.pool_plan(8, 16, 512) == (8, 1)  # heads enough: whole heads
    assert mapwork.pool_plan(8, 1, 8) == (1, 1)  # too few rows to cut
    assert mapwork.pool_plan(1, 1, 512) == (1, 1)
    assert mapwork.pool_plan(64, 1, 512) == (8, 16)  # no more than the cores for one head
    assert mapwork.pool_plan(3, 2, 512) == (3, 6)
    assert mapwork.pool_plan(100_000, 72, 6) == (8, 1)  # never one process per head
    monkeypatch.setattr(mapwork, "available_cores", lambda: 2)
    assert mapwork.pool_plan(100_000, 72, 6) == (2, 1)  # the case, on 2 cores


def test_one_causal_head_in_two_processes_equals_one_process_and_plain_lps():
    """A causal head of 64 rows (m = 5) cut into pieces over 2 worker processes: the same
    bounds as in one process (certified optima, so equal to round-off) and as scipy's
    per-key LP on sampled rows."""
    trace = synthetic_trace(n=64, d_v=4, d=10, causal=True, seed=2, dtype=torch.float64)
    assert mapwork.pool_plan(2, 1, 64)[1] > 1 or mapwork.available_cores() < 2
    one = interval_map(trace, layers=[1], heads=[0])
    two = interval_map(trace, layers=[1], heads=[0], workers=2)
    assert torch.allclose(one.lower, two.lower, atol=1e-9, rtol=0)
    assert torch.allclose(one.upper, two.upper, atol=1e-9, rtol=0)
    assert two.fallbacks == 0 and int(two.lp_solved.sum()) > 0
    vf = (trace.values[1, 0].double() @ head_factors(trace.out_proj[1, 0].double())[0]).numpy()
    for r in (10, 40, 63):
        a = trace.attentions[1, 0, r, : r + 1].double().numpy()
        lo, hi = plain_bounds(a, vf[: r + 1])
        np.testing.assert_allclose(two.lower[0, 0, r, : r + 1].numpy(), lo, atol=1e-8, rtol=0)
        np.testing.assert_allclose(two.upper[0, 0, r, : r + 1].numpy(), hi, atol=1e-8, rtol=0)


def test_worker_processes_start_with_one_thread_per_pool():
    """`one_thread_per_process` (the workers' initializer) leaves every BLAS and OpenMP
    pool of the process, scipy's own OpenBLAS included, and torch at one thread."""
    code = (
        "from threadpoolctl import threadpool_info\n"
        "import torch\n"
        "from identifiable.utils.threads import one_thread_per_process\n"
        "one_thread_per_process()\n"
        "pools = threadpool_info()\n"
        "assert pools and all(p['num_threads'] == 1 for p in pools), pools\n"
        "assert any('scipy' in p['filepath'] for p in pools), pools\n"
        # the pip wheels of numpy and scipy bundle one OpenBLAS each: both are limited
        "assert len({p['filepath'] for p in pools if p['internal_api'] == 'openblas'}) >= 2\n"
        "assert torch.get_num_threads() == 1\n"
        "print(len(pools))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 2
