"""Token identifiability on real models: tiny random ones of every kind, the embedded MiniLM, the CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pandas as pd
import pytest

from identifiable.errors import IdentifiableError
from identifiable.experiments.tokens import token_identifiability
from identifiable.tokens.probes import ProbeConfig

WORDS = [
    "the",
    "river",
    "runs",
    "past",
    "an",
    "old",
    "mill",
    "where",
    "children",
    "play",
    "in",
    "summer",
    "and",
    "the",
    "miller",
    "sells",
    "bread",
    "to",
    "every",
    "traveller",
    "who",
    "stops",
    "by",
    "the",
    "bridge",
    "before",
    "night",
    "falls",
    "on",
    "the",
    "valley",
]
TEXTS = [" ".join(WORDS[i % 7 :] + WORDS[: i % 5]) for i in range(24)]  # words repeat


SMALL = ProbeConfig(mlp_width=16, max_steps=100, select_steps=10)  # the protocol, cheaply


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_pipeline_on_tiny_models(tiny_model, arch, tmp_path):
    model = tiny_model(arch)
    result = token_identifiability(
        model,
        TEXTS,
        max_tokens=600,
        objectives=("cos",),
        progress=False,
        cache_dir=tmp_path,
        probe_config=SMALL,
    )
    df = result.per_layer
    assert sorted(set(df["layer"])) == [0, 1]  # numbered from 0
    assert set(df["probe"]) == {"naive", "linear", "mlp"} and set(df["objective"]) == {"cos"}
    assert ((df["rate"] >= 0) & (df["rate"] <= 1)).all()
    assert result.settings["cache_hit"] is False and result.settings["n_tokens"] <= 600
    if arch == "llama":
        # no absolute positions: a repeated word has the same e^0, a tie that must be counted
        assert (df["n_tied"] > 0).all() and (df["rate_strict"] <= df["rate"]).all()
    else:
        assert (df["n_tied"] == 0).all()
    again = token_identifiability(
        model,
        TEXTS,
        max_tokens=600,
        objectives=("cos",),
        progress=False,
        cache_dir=tmp_path,
        probe_config=SMALL,
    )
    assert again.settings["cache_hit"] is True
    pd.testing.assert_frame_equal(again.per_layer, df)  # deterministic, cache or not


def test_pipeline_errors_on_a_real_model(tiny_model):
    model = tiny_model("bert")
    with pytest.raises(IdentifiableError, match=r"give layers 0\.\.1 \(numbered from 0\)"):
        token_identifiability(model, TEXTS, max_tokens=600, layers=[3], progress=False)
    with pytest.raises(IdentifiableError, match="too few tokens to split"):
        token_identifiability(model, TEXTS[:2], max_tokens=600, progress=False)


@pytest.mark.integration
def test_embedded_model_quick_budget(minilm, tmp_path):
    # the real protocol with small Adam budgets: this test is about the pipeline, and the
    # convergence of the full protocol is tested in test_tokens_split_probes
    cfg = ProbeConfig(mlp_width=32, max_steps=200, select_steps=20)
    result = token_identifiability(
        minilm, "wikipedia-sample", max_tokens=2048, progress=False, probe_config=cfg
    )
    df = result.per_layer
    assert len(df) == 6 * 6 and sorted(set(df["layer"])) == [0, 1, 2, 3, 4, 5]
    rates = result.rates()
    # right after layer 0 every naive and linear probe identifies tokens (the MLPs here get
    # only 200 steps from a random start: this test is about the pipeline, not their fit)
    assert (rates.loc[0, [c for c in rates.columns if not c.startswith("mlp")]] > 0.97).all()
    assert rates.loc[5, "naive_l2"] < 0.6  # …and naive look-up fails in the last layer
    for probe in ("naive", "linear"):  # the paper's finding: cosine at least as good as L2
        assert (rates[f"{probe}_cos"] >= rates[f"{probe}_l2"] - 0.01).all()
    cross = result.cross_layer
    assert len(cross) == 2 * 36  # two fitting regimes
    lin = df[(df["probe"] == "linear") & (df["objective"] == "cos")].set_index("layer")["start"]
    cross = cross[cross["regime"] == cross["train_layer"].map(lin) + " start"]
    diag = cross[cross["train_layer"] == cross["test_layer"]].set_index("train_layer")["rate"]
    assert (diag == rates["linear_cos"]).all()
    ctrl = result.control
    assert abs(ctrl["rate"].mean() - ctrl["chance"].mean()) < 0.02
    paths = result.write(tmp_path)
    assert {p.name for p in paths} >= {"tokens_per_layer.csv", "tokens_per_layer.parquet"}
    assert pd.read_parquet(tmp_path / "tokens_per_layer.parquet").equals(df)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "identifiable", "tokens", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},  # rich wraps tables to the terminal width
    )


@pytest.mark.integration
def test_cli_writes_tables_and_prints_the_per_layer_table(tmp_path):
    r = _cli("--max-tokens", "900", "--layers", "0,5", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "linear cos" in r.stdout and "shuffled-target control" in r.stdout
    # the estimate comes first, before any work (issues 50 and 55)
    assert re.search(r"tokens on minilm, 900 tokens: about \d+ (s|min) on \d+ threads?", r.stderr)
    for stem in ("per_layer", "cross_layer", "control"):
        assert (tmp_path / f"tokens_{stem}.csv").exists()
        assert (tmp_path / f"tokens_{stem}.parquet").exists()
    assert set(pd.read_csv(tmp_path / "tokens_per_layer.csv")["layer"]) == {0, 5}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layers", "1,x"], "comma-separated integers"),
        (["--layers", "0,6", "--max-tokens", "900"], "--layers: 6 is not a layer of this model"),
        (["--quick", "--max-tokens", "10"], "either --max-tokens or --quick"),
    ],
)
def test_cli_bad_input_is_one_line(args, message, tmp_path):
    r = _cli(*args, "--out", str(tmp_path))
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr
