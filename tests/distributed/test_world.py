"""The distributed machinery in one process: a real c10d store shared by thread "ranks"."""

from __future__ import annotations

import io
import threading
from contextlib import redirect_stderr
from typing import Any

import pytest
import torch.distributed as dist

from identifiable.errors import IdentifiableError
from identifiable.experiments import distributed as d
from identifiable.experiments.pipeline import Stage, progress_bars, run_stages


def _worlds(size: int, timeout_s: float = 5.0) -> list[d.World]:
    import uuid

    store, prefix = dist.HashStore(), uuid.uuid4().hex  # a run of its own per test
    return [d.World(r, size, store, prefix, timeout_s) for r in range(size)]


def _in_threads(fn: Any, worlds: list[d.World]) -> list[Any]:
    results: list[Any] = [None] * len(worlds)

    def run(i: int) -> None:
        try:
            results[i] = fn(worlds[i])
        except Exception as err:  # collected for the assertions
            results[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(worlds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_claims_share_every_shard_exactly_once() -> None:
    order = d.work_order([1, 5, 3, 5, 2, 1, 1])
    assert order == [1, 3, 2, 4, 0, 5, 6]  # most expensive first, ties in list order
    got = _in_threads(lambda w: list(d.claims(w, order)), _worlds(3))
    flat = sorted(i for part in got for i in part)
    assert flat == list(range(7))


def test_a_failed_rank_stops_the_others_at_the_barrier() -> None:
    worlds = _worlds(2)

    def rank(w: d.World) -> None:
        d.barrier(w, d.WORK_STARTS)  # the work has started: shards may be finished
        if w.rank == 1:
            d.report_failure(w, "IdentifiableError: the disk is full")
            return
        d.barrier(w, "done")

    err = _in_threads(rank, worlds)[0]
    assert isinstance(err, IdentifiableError)
    assert "rank 1: IdentifiableError: the disk is full" in str(err)
    assert "--resume" in str(err)


def test_a_refusal_before_the_work_starts_never_advises_resume() -> None:
    """Rank 0 refuses the output folder up front; rank 1, waiting for it, says so without
    --resume (there is nothing to resume)."""
    worlds = _worlds(2)

    def rank(w: d.World) -> None:
        if w.rank == 0:
            d.report_failure(w, "output folder r is not empty")
            return
        d.barrier(w, d.WORK_STARTS)

    err = _in_threads(rank, worlds)[1]
    assert isinstance(err, IdentifiableError)
    assert "rank 0: output folder r is not empty" in str(err)
    assert "--resume" not in str(err) and "rerun the same command" in str(err)


def test_a_rank_that_never_arrives_times_out_with_one_line() -> None:
    w = _worlds(2, timeout_s=0.3)[0]
    with pytest.raises(IdentifiableError, match="timed out after 0 s waiting for the other ranks"):
        d.barrier(w, "lonely")


def test_different_settings_on_two_ranks_are_refused() -> None:
    got = _in_threads(lambda w: d.check_same_run(w, f"settings-{w.rank}"), _worlds(2))
    assert all(isinstance(e, IdentifiableError) for e in got)
    assert "different settings" in str(got[0]) and "same arguments" in str(got[0])
    same = _in_threads(lambda w: d.check_same_run(w, "same"), _worlds(2))
    assert same == [None, None]


class _MemoryCache:
    """The RunCache interface, in memory and shared by the thread ranks."""

    def __init__(self) -> None:
        self.saved: dict[tuple[str, int], Any] = {}

    def load(self, stage: str, shard: int) -> Any:
        got = self.saved.get((stage, shard))
        return None if got is None else (got, {})

    def save(self, stage: str, shard: int, tables: Any, meta: Any = None) -> None:
        self.saved[(stage, shard)] = tables


def test_ranks_split_the_work_and_rank_0_reduces_in_shard_order() -> None:
    import pandas as pd

    computed: list[tuple[int, int]] = []

    def compute(shard: list[Any], index: int, advance: Any) -> dict[str, pd.DataFrame]:
        computed.append((index, len(shard)))
        return {"t": pd.DataFrame({"shard": [index], "items": [len(shard)]})}

    stage = Stage("s", "s", [["a"], ["b", "c"], ["d"], ["e"]], [1, 2, 1, 1], compute)
    cache = _MemoryCache()
    with progress_bars(False) as bars:
        got = _in_threads(lambda w: run_stages(cache, [stage], bars, w), _worlds(2))
    assert got[1] is None
    tables, _ = got[0]["s"]
    assert tables["t"]["shard"].tolist() == [0, 1, 2, 3]  # shard order, whoever computed it
    assert sorted(computed) == [(0, 1), (1, 2), (2, 1), (3, 1)]  # each shard exactly once


def test_progress_in_a_log_is_one_line_per_step_with_an_eta() -> None:
    err = io.StringIO()
    with redirect_stderr(err), progress_bars(True) as bars:
        task = bars.add_task("Fig. 1", total=3)
        for _ in range(3):
            bars.advance(task, 1)
    lines = err.getvalue().splitlines()
    assert lines[0].startswith("Fig. 1: 1/3 (33%) elapsed")
    assert "eta" in lines[0]
    assert lines[-1].startswith("Fig. 1: 3/3 (100%)")
