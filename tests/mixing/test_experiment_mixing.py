"""The mixing stage and its reduction; the report section's figure and claim."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from identifiable.errors import IdentifiableError
from identifiable.experiments.mixing import (
    CORRELATION_COLUMNS,
    mixing_tables,
    reduce_mixing,
    row_spearman,
)
from identifiable.mixing import context_mixing
from identifiable.report.mixing_section import mixing_claim, mixing_figure

ITEMS = ["the cat sat on the mat by the door", ("a dog ran home", "it was late and cold")]


@pytest.mark.parametrize("causal", [False, True])
def test_row_spearman_matches_scipy(causal):
    rng = np.random.default_rng(0)
    a, b = rng.random((2, 7, 7)), rng.random((2, 7, 7))
    b[1, 4] = 1.0  # a constant row: undefined
    got = row_spearman(a, b, causal)
    for layer in range(2):
        for i in range(7):
            k = i + 1 if causal else 7
            if k < 3 or (layer == 1 and i == 4):
                assert np.isnan(got[layer, i])
                continue
            want = spearmanr(a[layer, i, :k], b[layer, i, :k]).statistic
            assert got[layer, i] == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_stage_table(tiny_model, arch):
    model = tiny_model(arch)
    ticks = []
    tables = mixing_tables(
        model, ITEMS, 10, ticks.append, methods=["attention", "alti", "erasure"], seed=0
    )
    t = tables["correlations"]
    assert list(t.columns) == CORRELATION_COLUMNS and ticks == [1, 1]
    assert sorted(set(t["seq"])) == [10, 11] and sorted(set(t["layer"])) == [0, 1]
    # erasure is a reference: compared with hta only, never with itself
    assert set(t[t["method"] == "erasure"]["reference"]) == {"hta"}
    assert len(t) == 2 * 2 * (2 + 2 + 1)
    assert t["spearman"].between(-1, 1).all() and (t["rows"] > 0).all()
    # one entry recomputed by hand: alti's rollout vs HTA, layer 1 of the first sequence
    alti = context_mixing(model, ITEMS[0], "alti").rolled[1].numpy()
    hta = context_mixing(model, ITEMS[0], "hta").layerwise[1].numpy()
    rhos = []
    for i in range(alti.shape[0]):
        k = i + 1 if arch == "gpt2" else alti.shape[0]
        if k >= 3:
            rhos.append(spearmanr(alti[i, :k], hta[i, :k]).statistic)
    got = t.query("seq == 10 and layer == 1 and method == 'alti' and reference == 'hta'")
    assert float(got["spearman"].iloc[0]) == pytest.approx(np.nanmean(rhos), abs=1e-12)
    with pytest.raises(IdentifiableError, match="unknown mixing method"):
        mixing_tables(model, ITEMS, 0, ticks.append, methods=["nope"])


def fabricated(attention: float, alti: float, spread: float = 0.02, n: int = 12) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    rows = []
    for seq in range(n):
        for layer in (1, 2, 3):
            for method, centre in (("attention", attention), ("alti", alti), ("norm", 0.3)):
                value = centre + spread * rng.standard_normal()
                rows.append((seq, 20, layer, method, "hta", value, 20))
    return pd.DataFrame(rows, columns=CORRELATION_COLUMNS)


def test_reduce_is_deterministic_and_brackets_the_mean():
    table = fabricated(0.2, 0.6)
    a, b = reduce_mixing(table, seed=3), reduce_mixing(table, seed=3)
    pd.testing.assert_frame_equal(a, b)
    assert (a["ci_low"] <= a["mean"]).all() and (a["mean"] <= a["ci_high"]).all()
    assert (a["n_sequences"] == 12).all() and len(a) == 9
    means = table.groupby(["layer", "method", "reference"])["spearman"].mean().to_numpy()
    np.testing.assert_allclose(a["mean"].to_numpy(), means)
    assert not reduce_mixing(table, seed=4)["ci_low"].equals(a["ci_low"])
    wider = reduce_mixing(fabricated(0.2, 0.6, spread=0.2), seed=3)
    assert ((wider["ci_high"] - wider["ci_low"]) > (a["ci_high"] - a["ci_low"])).all()


def test_claim_passes_and_fails_on_fabricated_tables():
    status, sentence = mixing_claim(reduce_mixing(fabricated(0.2, 0.6)))
    assert status == "supported" and "alti tracks best" in sentence and "3 of 3" in sentence
    status, sentence = mixing_claim(reduce_mixing(fabricated(0.6, 0.2)))
    assert status == "not supported" and "0 of 3" in sentence
    # overlapping intervals: not a win even if alti's mean is a little higher, and not a
    # loss either: the data cannot decide it
    status, _ = mixing_claim(reduce_mixing(fabricated(0.30, 0.31, spread=0.1)))
    assert status == "not settled"
    mixed = fabricated(0.2, 0.6)
    mixed.loc[(mixed["layer"] == 3) & (mixed["method"] == "alti"), "spearman"] = 0.1
    mixed.loc[(mixed["layer"] == 3) & (mixed["method"] == "norm"), "spearman"] = 0.1
    status, _ = mixing_claim(reduce_mixing(mixed))
    assert status == "partly supported"
    only_raw = reduce_mixing(fabricated(0.2, 0.6).query("method == 'attention'"))
    assert mixing_claim(only_raw)[0] == "not tested"


def test_figure_has_a_panel_per_reference():
    table = fabricated(0.2, 0.6)
    other = table.assign(reference="erasure")
    fig = mixing_figure(reduce_mixing(pd.concat([table, other])))
    assert len(fig.axes) == 2
    assert len(fig.axes[0].lines) == 4  # three methods and the zero line
    with pytest.raises(ValueError, match="lacks columns"):
        mixing_figure(pd.DataFrame({"layer": [1]}))


def test_report_section_imports_no_computation():
    import identifiable.report.mixing_section as section

    tree = ast.parse(Path(section.__file__).read_text())
    names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    banned = ("identifiable.experiments", "identifiable.models", "identifiable.mixing", "torch")
    assert not [n for n in names if n.startswith(banned)]
