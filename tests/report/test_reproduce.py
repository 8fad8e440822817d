"""`reproduce` end to end on a tiny model: complete folder, resumable, refuses bad folders, survives a full disk."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from identifiable.errors import IdentifiableError
from identifiable.experiments import stages
from identifiable.runs.reproduce import reproduce
from identifiable.store import files

FIGURES = [
    "fig1a_pearson_by_length",
    "fig1b_raw_attention",
    "fig1c_effective_attention",
    "fig2a_identifiability",
    "fig2b_cross_layer",
    "fig3a_own_contribution",
    "fig3b_own_not_top",
    "fig4a_neighbour_groups",
    "fig4b_relative_position",
    "mixing_correlations",  # beyond the paper: context mixing vs HTA and erasure
    "certify_movement",  # beyond the paper: certified attention
    "posterior_uncertainty",  # beyond the paper: the attention posterior
]


def outputs(out: Path) -> dict[str, bytes]:
    """Every output file (the cache excluded) by relative path."""
    return {
        str(p.relative_to(out)): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and ".cache" not in p.relative_to(out).parts
    }


def test_folder_is_complete(finished_run: Path) -> None:
    out = finished_run
    for stem in FIGURES:
        for ext in ("png", "svg"):
            assert (out / "figures" / f"{stem}.{ext}").stat().st_size > 1000, f"{stem}.{ext}"
    summary = json.loads((out / "summary.json").read_text())
    for name in summary["tables"]:
        csv, parquet = out / "tables" / f"{name}.csv", out / "tables" / f"{name}.parquet"
        assert pd.read_parquet(parquet).shape[0] == pd.read_csv(csv).shape[0] > 0, name
    assert summary["model"]["head_dim"] == 16 and summary["model"]["layers"] == 2
    assert {"torch", "transformers", "identifiable"} <= set(summary["versions"])
    assert set(summary["claims"]) >= {"fig1a", "fig1bc", "fig2a_cos", "fig3a", "fig4a"}
    assert {"mixing_hta", "mixing_erasure", "certify_pinned"} <= set(summary["claims"])
    assert {"posterior_band", "posterior_top"} <= set(summary["claims"])
    # a smoke run is a pipeline check: no claim carries a finding's status
    assert summary["pipeline_check"] and summary["headline"].startswith("pipeline check, not")
    for claim in summary["claims"].values():
        assert claim["status"] == "pipeline check, not evidence"
        assert claim["rule_status"] in {
            "supported",
            "partly supported",
            "not supported",
            "not tested",
            "not settled",
        }
    html = (out / "index.html").read_text()
    assert html.count("data:image/png;base64,") == len(FIGURES)
    assert "not a probability distribution" in html
    assert "http://" not in html and "https://" not in html


def test_fig1a_verdict_follows_the_data(finished_run: Path) -> None:
    by_length = pd.read_parquet(finished_run / "tables" / "fig1a_pearson_by_length.parquet")
    claim = json.loads((finished_run / "summary.json").read_text())["claims"]["fig1a"]
    short = by_length[by_length["length"] <= 16]["pearson_r"]
    assert (short > 1 - 1e-9).all()  # n ≤ d_v: effective attention equals raw attention
    assert claim["n_long"] == int((by_length["length"] > 16).sum())
    assert claim["median_r_long"] == pytest.approx(
        by_length[by_length["length"] > 16]["pearson_r"].median()
    )


def test_interrupted_run_resumes_to_identical_outputs(
    tiny_bert: Any,
    corpus: list[Any],
    finished_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = tmp_path / "report"
    real = stages.attribution_shard_tables

    def killed(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt  # as if the run were stopped during the last stage

    monkeypatch.setattr(stages, "attribution_shard_tables", killed)
    with pytest.raises(KeyboardInterrupt):
        reproduce(tiny_bert, corpus, out, budget="smoke", progress=False)
    assert not (out / "index.html").exists()

    with pytest.raises(IdentifiableError, match="--resume"):
        reproduce(tiny_bert, corpus, out, budget="smoke", progress=False)

    def must_not_rerun(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a finished shard was computed again")

    monkeypatch.setattr(stages, "attention_tables", must_not_rerun)
    monkeypatch.setattr(stages, "attribution_shard_tables", real)
    result = reproduce(tiny_bert, corpus, out, budget="smoke", progress=False, resume=True)
    assert result.timings["attention_s"] == 0.0 and result.timings["tokens_s"] == 0.0
    assert outputs(out) == outputs(finished_run)


def test_resume_with_other_settings_is_refused(
    tiny_bert: Any, corpus: list[Any], finished_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "copy"
    shutil.copytree(finished_run, out)
    with pytest.raises(IdentifiableError, match="seed"):
        reproduce(tiny_bert, corpus, out, budget="smoke", progress=False, resume=True, seed=1)


def test_disk_full_while_writing_index_leaves_no_page(
    tiny_bert: Any,
    corpus: list[Any],
    finished_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = tmp_path / "report"
    shutil.copytree(finished_run, out)  # every stage done: only the report is written
    previous = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    real = files._raw_write

    def full_when_page(fd: int, data: memoryview) -> int:
        if bytes(data[:15]) == b"<!DOCTYPE html>":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(files, "_raw_write", full_when_page)
    with pytest.raises(IdentifiableError, match="disk full"):
        reproduce(tiny_bert, corpus, out, budget="smoke", progress=False, resume=True)
    # the previous report is intact, byte for byte, and no torn file is left anywhere
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == previous
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    assert not [p for p in tmp_path.rglob("index.html") if out not in p.parents]
    monkeypatch.setattr(files, "_raw_write", real)
    reproduce(tiny_bert, corpus, out, budget="smoke", progress=False, resume=True)
    assert outputs(out) == outputs(finished_run)


def test_non_empty_folder_is_refused_and_force_starts_over(
    tiny_bert: Any, corpus: list[Any], tmp_path: Path
) -> None:
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(IdentifiableError, match=r"not empty.*--resume.*--force"):
        reproduce(tiny_bert, corpus, out, budget="smoke", progress=False)
    with pytest.raises(IdentifiableError, match="holds no identifiable run"):
        reproduce(tiny_bert, corpus, out, budget="smoke", progress=False, resume=True)
    (out / "index.html").write_text("stale")
    (out / ".cache").mkdir()
    (out / ".cache" / "junk").write_text("x")
    # --force only replaces a run of ours (one with a manifest): here it deletes nothing.
    with pytest.raises(IdentifiableError, match=r"--force refused.*nothing was deleted"):
        reproduce(tiny_bert, corpus, out, budget="smoke", progress=False, force=True)
    assert sorted(p.name for p in out.iterdir()) == [".cache", "index.html", "notes.txt"]
    assert (out / ".cache" / "junk").read_text() == "x"


def test_out_is_a_file_or_unwritable(tiny_bert: Any, corpus: list[Any], tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(IdentifiableError, match="is a file"):
        reproduce(tiny_bert, corpus, blocker, budget="smoke", progress=False)
    with pytest.raises(IdentifiableError, match="is a file, not a folder"):  # its parent
        reproduce(tiny_bert, corpus, blocker / "sub", budget="smoke", progress=False)


def test_unknown_budget(tiny_bert: Any, corpus: list[Any], tmp_path: Path) -> None:
    with pytest.raises(IdentifiableError, match="quick, paper, smoke"):
        reproduce(tiny_bert, corpus, tmp_path / "x", budget="huge", progress=False)
