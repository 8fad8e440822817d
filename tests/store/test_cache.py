"""The run cache: exact round trip, corruption detected, settings enforced."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from identifiable.errors import IdentifiableError
from identifiable.store.cache import CacheCorruptWarning, RunCache


def _tables() -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(0)
    return {
        "a": pd.DataFrame({"x": rng.random(5), "tok": list("abcde")}),
        "b": pd.DataFrame({"y": [1, 2]}),
    }


def test_round_trip_is_exact(tmp_path: Path) -> None:
    cache = RunCache(tmp_path, {"model": "m", "n": 3})
    cache.save("attention", 0, _tables(), {"seconds": 1.5})
    tables, meta = cache.load("attention", 0)
    for name, df in _tables().items():
        assert tables[name].equals(df)
    assert meta == {"seconds": 1.5}
    assert cache.load("attention", 1) is None


def test_corrupted_table_is_recomputed(tmp_path: Path) -> None:
    cache = RunCache(tmp_path, {"model": "m"})
    cache.save("s", 3, _tables())
    table = next((tmp_path / ".cache" / "s").glob("00003.a.parquet"))
    data = bytearray(table.read_bytes())
    data[len(data) // 2] ^= 0xFF
    table.write_bytes(bytes(data))
    with pytest.warns(CacheCorruptWarning, match="checksum"):
        assert cache.load("s", 3) is None


def test_shard_without_manifest_counts_as_missing(tmp_path: Path) -> None:
    cache = RunCache(tmp_path, {"model": "m"})
    cache.save("s", 0, _tables())
    (tmp_path / ".cache" / "s" / "00000.json").unlink()  # killed before the manifest was written
    assert cache.load("s", 0) is None


def test_other_settings_refuse_to_resume(tmp_path: Path) -> None:
    RunCache(tmp_path, {"model": "m", "budget": "quick"}).start()
    RunCache(tmp_path, {"model": "m", "budget": "quick"}).check_resumable()
    with pytest.raises(IdentifiableError, match="budget"):
        RunCache(tmp_path, {"model": "m", "budget": "full"}).check_resumable()


def test_shards_of_other_settings_are_not_reused(tmp_path: Path) -> None:
    RunCache(tmp_path, {"v": 1}).save("s", 0, _tables())
    assert RunCache(tmp_path, {"v": 2}).load("s", 0) is None
