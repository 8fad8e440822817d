"""`identifiable attention`: in-process on tiny models, and once as the user runs it."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

import identifiable.cli.attention as cli_attention
from helpers.traces import TEXT_LONG
from identifiable.errors import IdentifiableError


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:  # keeps "attention" a subcommand, as in the real CLI
        pass

    cli_attention.register(app)
    return app


def _invoke(monkeypatch, model, *args: str):
    monkeypatch.setattr(cli_attention, "load", lambda name: model)
    return CliRunner().invoke(_app(), ["attention", *args])


def test_overview_and_row_view_with_json(monkeypatch, tiny_model, tmp_path):
    out = tmp_path / "a.json"
    r = _invoke(monkeypatch, tiny_model("bert"), TEXT_LONG, "--layer", "1", "--head", "1",
                "--row", "3", "--json", str(out))  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "dim LN([T,1])" in r.output and "witness: moves" in r.output
    data = json.loads(out.read_text())
    assert [x["layer"] for x in data["layers"]] == [0, 1]
    n = data["n_tokens"]
    assert all(d == n - 16 for x in data["layers"] for d in x["dim"])
    assert 0 < data["pearson_r"] < 1
    head = data["head"]
    assert head["layer"] == 1 and head["row"] == 3 and len(head["keys"]) == n
    for key in head["keys"]:
        assert key["lower"] - 1e-9 <= key["raw"] <= key["upper"] + 1e-9
        assert key["lower"] - 1e-9 <= key["witness"] <= key["upper"] + 1e-9
    assert head["witness"]["exists"] and head["witness"]["output_residual"] < 1e-9
    assert "not a distribution" in data["note"]
    assert not list(tmp_path.glob(".*tmp"))


def test_causal_early_row_has_no_witness(monkeypatch, tiny_model):
    r = _invoke(monkeypatch, tiny_model("gpt2"), TEXT_LONG, "--layer", "1", "--head", "0",
                "--row", "2", "--variant", "row-stochastic")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "no witness" in r.output and "identifiable" in r.output
    assert "causally masked entries excluded" in r.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layer", "2", "--head", "0"], r"--layer 2 is out of range: valid layers are 0\.\.1"),
        (["--layer", "1", "--head", "4"], r"valid heads are 0\.\.3"),
        (["--layer", "1", "--head", "0", "--row", "999"], r"valid rows are 0\.\."),
        (["--head", "1"], "give --layer and --head together"),
        (["--row", "1"], "--row needs --layer and --head"),
        (["--variant", "bias"], "unknown --variant 'bias'"),
    ],
)
def test_bad_input_raises_identifiable_error(monkeypatch, tiny_model, args, message):
    r = _invoke(monkeypatch, tiny_model("bert"), TEXT_LONG, *args)
    assert isinstance(r.exception, IdentifiableError)
    assert re.search(message, str(r.exception))


@pytest.mark.integration
def test_embedded_model_end_to_end(tmp_path):
    out = tmp_path / "a.json"
    run = [sys.executable, "-m", "identifiable", "attention"]
    r = subprocess.run([*run, TEXT_LONG + " " + TEXT_LONG, "--layer", "3", "--head", "5",
                        "--row", "4", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert len(data["layers"]) == 6 and data["head"]["witness"]["exists"]
    bad = subprocess.run([*run, "hello", "--layer", "9", "--head", "0"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert bad.returncode == 2 and "valid layers are 0..5" in bad.stderr
    assert "Traceback" not in bad.stderr and bad.stderr.strip().count("\n") == 0
