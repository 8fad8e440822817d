"""`identifiable posterior` through the real entry point (identifiable.cli.main)."""

from __future__ import annotations

import pandas as pd
import pytest

import identifiable.cli.posterior as cli_posterior
from helpers.cli import Outcome, assert_refused, run_main
from helpers.traces import TEXT_LONG


@pytest.fixture
def model(monkeypatch, tiny_model):
    m = tiny_model("gpt2")
    monkeypatch.setattr(cli_posterior, "load", lambda name: m)
    monkeypatch.setattr(cli_posterior.console, "width", 240)  # no wrapped column titles
    return m


def _run(capsys, *args: str) -> Outcome:
    return Outcome(*run_main(["posterior", *args], capsys))


def test_a_row_table_and_a_parquet_table(model, capsys, tmp_path) -> None:
    out = tmp_path / "post.parquet"
    got = _run(capsys, TEXT_LONG, "--layer", "1", "--head", "0", "--row", "20",
               "--samples", "100", "--out", str(out))  # fmt: skip
    assert got.code == 0, got.err
    assert "P(top stays)" in got.out and "R̂" in got.out and "auto" in got.out
    df = pd.read_parquet(out)
    assert {"mean", "credible_lower", "credible_upper", "ess", "rhat", "flags"} <= set(df.columns)
    assert set(df["row"]) == {20} and len(df) == 21  # causal: row 20 has 21 keys
    assert abs(df["mean"].sum() - 1) < 1e-9


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--prior", "gauss"], "unknown prior 'gauss'"),
        (["--walk", "gibbs"], "unknown walk 'gibbs': use one of auto, billiard, hitrun"),
        (["--prior", "dirichlet", "--alpha", "0"], "alpha must be a positive number"),
        (["--samples", "0"], "samples must be an integer ≥ 1"),
        (["--row", "999"], "row"),
        (["--row", "20", "--time-budget", "0.0001"], "more than the time budget"),
        (["--out", "x.csv"], "must end in .parquet"),
    ],
)
def test_bad_input_exits_2_in_one_line(model, capsys, args, words) -> None:
    got = _run(capsys, TEXT_LONG, "--layer", "1", "--head", "0", *args)
    assert_refused(got, words)
