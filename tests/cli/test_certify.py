"""`identifiable certify` through the real entry point (identifiable.cli.main)."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

import identifiable.cli.certify as cli_certify
from helpers.traces import TEXT_LONG
from identifiable.cli import main


def _run(monkeypatch, capsys, model, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(cli_certify, "load", lambda name: model)
    monkeypatch.setattr(cli_certify.console, "width", 240)  # no wrapped column titles
    try:
        main(["certify", *args])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_head_map_parquet_and_summary(monkeypatch, capsys, tiny_model, tmp_path):
    model = tiny_model("gpt2")
    out = tmp_path / "map.parquet"
    code, stdout, stderr = _run(monkeypatch, capsys, model, TEXT_LONG, "--layer", "1",
                                "--head", "1", "--out", str(out))  # fmt: skip
    assert code == 0, stderr
    assert "movable mass" in stdout and "L1 paper A_eff" in stdout
    assert "…" not in stdout  # on 80 columns the values are whole; headers wrap instead
    df = pd.read_parquet(out)
    assert list(df.columns) == list(cli_certify.COLUMNS)
    n = model.trace(TEXT_LONG).n_tokens
    assert len(df) == n * (n + 1) // 2  # causal: row q has q + 1 keys
    assert (df["key"] <= df["query"]).all() and set(df["layer"]) == {1}
    assert (df["lower"] <= df["raw"] + 1e-9).all() and (df["raw"] <= df["upper"] + 1e-9).all()
    assert (df["lower"] <= df["constrained"] + 1e-9).all()
    assert (df["constrained"] <= df["upper"] + 1e-9).all()
    sums = df.groupby("query")["constrained"].sum()
    assert ((sums - 1).abs() < 1e-5).all()
    assert not list(tmp_path.glob(".*tmp"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layer", "1", "--head", "9"], r"--head 9 is out of range: valid heads are 0\.\.3"),
        (["--layer", "3", "--head", "0"], r"valid layers are 0\.\.1"),
        (["--layer", "1", "--head", "0", "--row", "500"], r"--row 500 is out of range"),
        # A small estimate is printed with two digits, not rounded to "0 s".
        (
            ["--time-budget", "0.000001"],
            r"needs about (?!0 s)[\d.e-]+ s .*more than the time budget",
        ),
        (["--time-budget", "nan"], r"--time-budget nan must be a finite number above 0"),
        (["--time-budget", "-1"], r"--time-budget -1 must be a finite number above 0"),
        (["--out", "x.csv"], r"must end in \.parquet"),
    ],
)
def test_bad_input_one_line_exit_2(monkeypatch, capsys, tiny_model, tmp_path, args, message):
    import re

    code, _, stderr = _run(monkeypatch, capsys, tiny_model("bert"), TEXT_LONG, *args,
                           *(["--out", str(tmp_path / "m.parquet")] if "--out" not in args else []))  # fmt: skip
    assert code == 2
    assert re.search(message, stderr) and stderr.strip().count("\n") == 0
    assert "Traceback" not in stderr and not list(tmp_path.iterdir())  # nothing written


def test_corrupt_trace_names_layer_and_head(monkeypatch, capsys, tiny_model, tmp_path):
    model = tiny_model("bert")
    real = model.trace

    def corrupt(*args, **kwargs):
        tr = real(*args, **kwargs)
        tr.attentions[1, 3, 2, 0] += 0.5
        return tr

    monkeypatch.setattr(model, "trace", corrupt)
    code, _, stderr = _run(
        monkeypatch, capsys, model, TEXT_LONG, "--out", str(tmp_path / "m.parquet")
    )
    assert code == 2 and "layer 1, head 3, row 2" in stderr
    assert "infeasible" in stderr and not list(tmp_path.iterdir())


@pytest.mark.integration
def test_minilm_as_the_user_runs_it(tmp_path):
    out = tmp_path / "m.parquet"
    r = subprocess.run([sys.executable, "-m", "identifiable", "certify", TEXT_LONG, "--layer", "3",
                        "--head", "0", "--out", str(out)], capture_output=True, text=True,
                       timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr
    df = pd.read_parquet(out)
    assert set(df["layer"]) == {3} and df["query"].nunique() == df["key"].nunique()
