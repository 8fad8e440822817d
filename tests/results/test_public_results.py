"""Every public result on a tiny model: repr, HTML, plot, pandas, xarray and files.

The text is longer than the tiny models' head width (16), so null spaces, witnesses and
intervals are not trivial. Each check compares what a method shows with the tensor it
came from; a hostile token (`<script>`) proves the HTML escapes labels.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.figure import Figure

import identifiable as idf
from identifiable.attention.constrained import constrained_attention
from identifiable.attention.intervals import interval_map
from identifiable.mixing import context_mixing
from identifiable.results import Result, load

TEXT = (
    "The miller sells bread to every traveller who stops by the old stone bridge "
    "before night falls on the quiet valley."
)
HOSTILE = "<script>alert(1)</script>"
WORDS = ["the", "miller", "sells", "bread", "to", "every", "traveller", "who", "stops", "by"]
TEXTS = [" ".join(WORDS[i % 7 :] + WORDS[: i % 5]) for i in range(24)]


@pytest.fixture(scope="module")
def results(tiny_model) -> dict[str, tuple[Result, str, tuple[str, ...]]]:
    """name → (result, primary array, its dims)."""
    model = tiny_model("bert")
    trace = model.trace(TEXT)
    assert trace.n_tokens > trace.head_dim  # otherwise every null space is 0
    eff = idf.effective_attention(trace)
    row = trace.n_tokens - 2
    out = {
        "trace": (trace, "attentions", ("layer", "head", "query", "key")),
        "null_space": (idf.null_space(trace), "dim", ("layer", "head", "query")),
        "effective": (eff, "effective", ("layer", "head", "query", "key")),
        "witness": (idf.witness(trace, 1, 2, row), "raw", ("key",)),
        "intervals": (idf.attention_intervals(trace, 1, 2, row), "lower", ("key",)),
        "interval_map": (
            interval_map(trace, layers=[1], heads=[0, 2], rows=[3, row]),
            "lower",
            ("layer", "head", "row", "key"),
        ),
        "constrained": (
            constrained_attention(trace, 1, 2, rows=[3, row]),
            "weights",
            ("row", "key"),
        ),
        "hta": (
            idf.hidden_token_attribution(model, TEXT, probes=4, progress=False),
            "contributions",
            ("layer", "query", "key"),
        ),
        "mixing": (context_mixing(model, TEXT, "rollout"), "layerwise", ("layer", "query", "key")),
        "tokens": (
            idf.token_identifiability(
                model,
                TEXTS,
                max_tokens=400,
                probe_kinds=("linear",),
                objectives=("cos",),
                progress=False,
            ),
            "per_layer",
            ("layer", "probe", "objective"),
        ),
    }
    return out


NAMES = [
    "trace", "null_space", "effective", "witness", "intervals", "interval_map",
    "constrained", "hta", "mixing", "tokens",
]  # fmt: skip


def _hostile(result: Result) -> Result:
    """The same result with one token replaced by markup."""
    tokens = list(result.tokens)
    tokens[1] = HOSTILE
    return dataclasses.replace(result, tokens=tokens)


def _value(result: Result, name: str) -> np.ndarray:
    value = getattr(result, name)
    return value.detach().double().numpy() if hasattr(value, "detach") else np.asarray(value)


@pytest.mark.parametrize("name", NAMES)
def test_repr_is_short_and_names_shapes(results, name) -> None:
    result, primary, dims = results[name]
    text = repr(result)
    assert text.startswith(type(result).__name__ + "(")
    assert "tensor(" not in text and "array(" not in text and len(text) < 900
    if name == "tokens":
        assert f"per_layer: table[{len(result.per_layer)} rows" in text
        return
    shape = getattr(result, primary).shape
    assert f"{primary}: " in text
    assert "[" + ", ".join(f"{d}={s}" for d, s in zip(dims, shape, strict=True)) + "]" in text
    if getattr(result, "tokens", None) is not None:
        assert f"n_tokens={len(result.tokens)}" in text
        assert result.n_tokens == len(result.tokens)
    if getattr(result, "model_name", ""):
        assert "model='tiny-bert'" in text


@pytest.mark.parametrize("name", NAMES)
def test_html_summary_escapes_tokens(results, name) -> None:
    result, primary, dims = results[name]
    if name == "tokens":
        html = result._repr_html_()
        assert "per_layer" in html and "rate" in html and "<table" in html
        return
    html = _hostile(result)._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert f"<code>{primary}</code>" in html
    shape = getattr(result, primary).shape
    assert ", ".join(f"{d}={s}" for d, s in zip(dims, shape, strict=True)) in html


@pytest.mark.parametrize("name", NAMES)
def test_to_pandas_matches_the_tensor(results, name) -> None:
    result, primary, dims = results[name]
    df = result.to_pandas()
    if name == "tokens":
        pd.testing.assert_frame_equal(df, result.per_layer.reset_index(drop=True))
        return
    assert set(dims) <= set(df.columns) and primary in df.columns
    arr = _value(result, primary)
    assert len(df) == arr.size
    # one entry, found through its coordinates
    pick = df.iloc[len(df) // 2]
    index = []
    for d in dims:
        coord = result._coord(d, arr.shape[dims.index(d)])
        index.append(int(np.flatnonzero(coord == pick[d])[0]))
    assert pick[primary] == pytest.approx(arr[tuple(index)])
    tokens = getattr(result, "tokens", None)
    if "key" in dims and tokens is not None:
        assert pick["key_token"] == tokens[int(pick["key"])]


@pytest.mark.parametrize("name", NAMES)
def test_to_xarray_names_dimensions(results, name) -> None:
    result, primary, dims = results[name]
    ds = result.to_xarray()
    if name == "tokens":
        assert ds["rate"].dims == dims
        return
    assert ds[primary].dims == dims
    np.testing.assert_allclose(ds[primary].values.astype(float), _value(result, primary))
    if "key" in dims:
        assert list(ds["key_token"].values) == list(result.tokens)


@pytest.mark.parametrize("name", NAMES)
def test_plot_returns_a_labelled_figure(results, name) -> None:
    result, _, _ = results[name]
    fig = result.plot()
    assert isinstance(fig, Figure)
    drawn = [ax for ax in fig.axes if ax.get_xlabel()]
    assert drawn, "no labelled axes"
    assert type(result).__name__ in fig._suptitle.get_text()
    if name == "tokens":
        labels = {line.get_label() for line in drawn[0].get_lines()}
        assert "linear cos" in labels
        return
    ticks = [t.get_text() for ax in drawn for t in ax.get_xticklabels()]
    if drawn[0].get_xlabel() in ("key", "query"):
        assert result.tokens[1] in ticks  # token labels, not positions
    fig.canvas.draw()  # renders (token text is not read as mathematics)


def test_plot_of_effective_attention_shows_the_chosen_head(results) -> None:
    eff = results["effective"][0]
    fig = eff.plot(layer=1, head=3)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["raw", "effective", "null"]
    np.testing.assert_allclose(panels[1].images[0].get_array(), eff.effective[1, 3].numpy())
    assert "layer 1, head 3" in fig._suptitle.get_text()


@pytest.mark.parametrize("name", NAMES)
def test_save_load_round_trip(results, name, tmp_path: Path) -> None:
    result, _, _ = results[name]
    path = result.save(tmp_path / f"{name}.safetensors")
    back = type(result).load(path)
    again = load(path)  # the generic loader finds the class in the file
    assert type(again) is type(result)
    for f in dataclasses.fields(result):
        a, b = getattr(result, f.name), getattr(back, f.name)
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b) and a.dtype == b.dtype, f.name
        elif isinstance(a, pd.DataFrame):
            pd.testing.assert_frame_equal(a, b)
        elif isinstance(a, Result):
            assert repr(a) == repr(b)
        elif f.name not in ("meta", "settings", "options"):  # JSON-ready copies
            assert a == b, f.name


def test_model_repr(tiny_model) -> None:
    text = repr(tiny_model("llama"))
    assert text == (
        "Model('tiny-llama', family='llama', layers=2, heads=4 (2 key/value), head_dim=16, "
        "dtype=float32, device=cpu)"
    )


def test_to_bertviz_round_trip(results) -> None:
    """bertviz draws what to_bertviz gives: its HTML carries the tokens and the weights."""
    bertviz = pytest.importorskip("bertviz", reason="bertviz is installed by scripts/setup.sh")
    import json
    import re

    eff = results["effective"][0]
    for which in ("raw", "effective", "null"):
        layers = eff.to_bertviz(which)
        assert len(layers) == eff.raw.shape[0]
        assert tuple(layers[0].shape) == (1, *eff.raw.shape[1:])
        torch.testing.assert_close(
            layers[1][0].double(), getattr(eff, which)[1].double(), atol=1e-6, rtol=0
        )
    html = bertviz.head_view(eff.to_bertviz("effective"), eff.tokens, html_action="return")
    text = html.data
    start = re.search(r"params\s*=\s*\{", text).end() - 1
    params, _ = json.JSONDecoder().raw_decode(text, start)
    shown = params["attention"][0]
    assert shown["left_text"] == eff.tokens == shown["right_text"]
    assert "traveller" in eff.tokens
    np.testing.assert_allclose(
        np.asarray(shown["attn"][1])[2], eff.effective[1, 2].numpy(), atol=1e-6
    )
    trace = results["trace"][0]
    raw = trace.to_bertviz()
    assert torch.equal(torch.stack([t[0] for t in raw]), trace.attentions.float())
