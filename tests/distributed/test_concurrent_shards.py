"""A stage's shards computed at once in threads (`Stage.workers`, Fig. 2's layers): every
shard is computed once, tables come back in shard order, and an interrupted run resumed on
the same cache loses no shard that had finished."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from identifiable.experiments.pipeline import Stage, progress_bars, run_stages
from identifiable.store.cache import RunCache


class Interrupted(Exception):
    pass


def _stage(computed: list[int], fail_at: int | None = None, workers: int = 2) -> Stage:
    lock = threading.Lock()
    running = {"now": 0, "most": 0}

    def compute(shard, index, advance):
        with lock:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
        time.sleep(0.05 * (4 - index % 4))  # later shards finish first
        with lock:
            running["now"] -= 1
        if index == fail_at:
            raise Interrupted(f"shard {index}")
        with lock:
            computed.append(index)
        advance(1)
        return {"t": pd.DataFrame({"shard": [index]})}

    stage = Stage("layers", "layers", [[str(i)] for i in range(6)], [1] * 6, compute)
    stage.workers = workers
    stage.running = running  # type: ignore[attr-defined]
    return stage


def test_shards_run_at_once_and_come_back_in_order(tmp_path: Path) -> None:
    computed: list[int] = []
    stage = _stage(computed)
    cache = RunCache(tmp_path, {"run": 1})
    cache.start()
    with progress_bars(False) as bars:
        done = run_stages(cache, [stage], bars)
    assert done is not None
    assert done["layers"][0]["t"]["shard"].tolist() == list(range(6))
    assert sorted(computed) == list(range(6)) and stage.running["most"] == 2  # type: ignore[attr-defined]


def test_an_interrupted_run_resumes_without_losing_a_finished_shard(tmp_path: Path) -> None:
    first: list[int] = []
    cache = RunCache(tmp_path, {"run": 1})
    cache.start()
    with progress_bars(False) as bars, pytest.raises(Interrupted):
        run_stages(cache, [_stage(first, fail_at=2)], bars)
    # shard 3 ran beside shard 2 and finished after it failed: it is cached all the same
    assert 3 in first and 2 not in first
    assert all(cache.load("layers", k) is not None for k in first)
    again: list[int] = []
    with progress_bars(False) as bars:
        done = run_stages(RunCache(tmp_path, {"run": 1}), [_stage(again)], bars)
    assert done is not None and done["layers"][0]["t"]["shard"].tolist() == list(range(6))
    assert set(again) == set(range(6)) - set(first)  # nothing finished is computed twice
