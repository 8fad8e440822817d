"""Atomic writes: a full disk leaves the old file (or nothing), never a torn one."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from identifiable.errors import IdentifiableError
from identifiable.report import files as report_files
from identifiable.store import files


def test_atomic_write_replaces_content(tmp_path: Path) -> None:
    target = tmp_path / "index.html"
    files.atomic_write_text(target, "old")
    files.atomic_write_text(target, "new ✓")
    assert target.read_text("utf-8") == "new ✓"
    assert [p.name for p in tmp_path.iterdir()] == ["index.html"]


@pytest.mark.parametrize("fail_on_call", [1, 2])
def test_disk_full_keeps_old_file_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_on_call: int
) -> None:
    target = tmp_path / "index.html"
    target.write_text("previous complete page")
    calls = {"n": 0}
    real = files._raw_write

    def full_disk(fd: int, data: memoryview) -> int:
        calls["n"] += 1
        if calls["n"] >= fail_on_call:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(files, "_raw_write", full_disk)
    with pytest.raises(IdentifiableError, match="disk full"):
        files.atomic_write_bytes(target, b"x" * (3 * files._CHUNK))  # several chunks
    assert target.read_text() == "previous complete page"
    assert [p.name for p in tmp_path.iterdir()] == ["index.html"]


def test_disk_full_on_a_new_file_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(fd: int, data: memoryview) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "_raw_write", full_disk)
    with pytest.raises(IdentifiableError, match=r"then rerun the same command$"):
        files.atomic_write_text(tmp_path / "index.html", "<html>")  # no --resume to advise
    with (
        files.retry_advice("rerun with --resume"),
        pytest.raises(IdentifiableError, match="--resume"),
    ):
        files.atomic_write_text(tmp_path / "index.html", "<html>")
    assert list(tmp_path.iterdir()) == []


def test_unwritable_parent_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(IdentifiableError, match="cannot write"):
        files.atomic_write_text(blocker / "index.html", "x")


def test_table_round_trip_is_exact(tmp_path: Path) -> None:
    df = pd.DataFrame({"layer": [1, 2], "value": [np.pi, 1 / 3], "token": ["<a>", "é"]})
    csv, parquet = files.write_table(df, tmp_path / "t")
    assert pd.read_parquet(parquet).equals(df)
    back = pd.read_csv(csv)
    assert list(back["token"]) == ["<a>", "é"]
    assert back["value"].to_numpy() == pytest.approx(df["value"].to_numpy(), rel=1e-5)


def test_figures_are_byte_reproducible() -> None:
    from matplotlib.figure import Figure

    def render() -> tuple[bytes, bytes]:
        fig = Figure(figsize=(2, 2))
        ax = fig.add_subplot()
        ax.plot([0, 1], [1, 0], label="x")
        ax.legend()
        return report_files.figure_bytes(fig)

    png1, svg1 = render()
    png2, svg2 = render()
    assert png1 == png2 and svg1 == svg2
    assert png1[:8] == b"\x89PNG\r\n\x1a\n" and b"<svg" in svg1
