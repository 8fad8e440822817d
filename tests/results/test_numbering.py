"""One layer numbering on every surface: the tables of HTA, context mixing and effective
attention join on `layer` (0-based, block l), and the rows that meet agree numerically."""

from __future__ import annotations

import numpy as np
import pandas as pd

import identifiable as idf

TEXT = "the quick brown fox jumps over the lazy dog while the cat sleeps by the warm fire"


def _index(df: pd.DataFrame, value: str) -> pd.Series:
    return df.set_index(["layer", "query", "key"])[value].sort_index()


def test_hta_mixing_and_effective_attention_tables_join_on_layer(tiny_model) -> None:
    model = tiny_model("bert")
    trace = model.trace(TEXT)
    n_layers = trace.n_layers
    hta = idf.hidden_token_attribution(model, TEXT)  # exact
    via_mixing = idf.context_mixing(model, TEXT, method="hta")
    attention = idf.context_mixing(model, TEXT, method="attention")
    eff = idf.effective_attention(trace)

    h = hta.to_pandas()
    m = via_mixing.to_pandas()
    a = attention.to_pandas()
    e = eff.to_pandas()
    layers = set(range(n_layers))
    for table in (h, m, a, e):
        assert set(table["layer"]) == layers  # every surface: 0..L-1

    # HTA computed directly and as a mixing method: the same numbers under the same labels
    joined = pd.concat([_index(h, "contributions"), _index(m, "layerwise")], axis=1, join="inner")
    assert len(joined) == n_layers * trace.n_tokens**2
    np.testing.assert_allclose(joined.iloc[:, 0], joined.iloc[:, 1], rtol=1e-6, atol=1e-9)

    # mixing's "attention" (head-averaged raw attention of block l) against the raw maps of
    # effective attention's table for the same layer label
    raw_mean = e.groupby(["layer", "query", "key"])["raw"].mean().sort_index()
    both = pd.concat([raw_mean, _index(a, "layerwise")], axis=1, join="inner")
    assert len(both) == n_layers * trace.n_tokens**2
    np.testing.assert_allclose(both.iloc[:, 0], both.iloc[:, 1], rtol=1e-5, atol=1e-7)

    # the check can fail: a table numbered from 1 no longer meets the others
    shifted = h.assign(layer=h["layer"] + 1)
    meet = pd.concat([_index(shifted, "contributions"), _index(m, "layerwise")], axis=1)
    off = meet.dropna()
    assert not np.allclose(off.iloc[:, 0], off.iloc[:, 1], rtol=1e-6, atol=1e-9)


def test_hta_summary_and_plot_use_the_same_numbers(tiny_model) -> None:
    model = tiny_model("bert")
    hta = idf.hidden_token_attribution(model, TEXT)
    assert [x["layer"] for x in hta.to_dict()["layers"]] == list(range(hta.n_layers))
    fig = hta.plot()
    title = fig._suptitle.get_text() if fig._suptitle is not None else ""
    assert f"layer {hta.n_layers - 1}" in title and f"layer {hta.n_layers}" not in title
