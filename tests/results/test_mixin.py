"""The `Result` mixin on synthetic dataclasses: every method checked against the numbers
it was given (no model), so a failure here is the mixin's and not an analysis's."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from identifiable.errors import IdentifiableError
from identifiable.results import Result, load

TOKENS = ["[CLS]", "<script>alert(1)</script>", "a&b", "$x$", "cat", "[SEP]"]


@dataclass(frozen=True)
class Inner(Result, dims={"rank": ("layer", "head")}):
    rank: torch.Tensor  # [L, H]


@dataclass(frozen=True)
class Maps(
    Result,
    dims={
        "raw": ("layer", "head", "query", "key"),
        "effective": ("layer", "head", "query", "key"),
        "null": ("layer", "head", "query", "key"),
        "width": ("layer", "head"),
    },
    plot={"fields": ("raw", "effective", "null"), "layer": 0, "head": 0},
    summary=("variant",),
):
    raw: torch.Tensor  # [L, H, n, n]
    effective: torch.Tensor  # [L, H, n, n]
    width: torch.Tensor  # [L, H]
    inner: Inner
    variant: str
    tokens: list[str] | None = None
    model_name: str = ""
    heads_kept: tuple[int, ...] = ()
    options: dict = field(default_factory=dict)

    @property
    def null(self) -> torch.Tensor:
        return self.raw.double() - self.effective


@dataclass
class Rows(
    Result,
    dims={
        "lower": ("layer", "row", "key"),
        "upper": ("layer", "row", "key"),
        "raw": ("layer", "row", "key"),
    },
    plot={"kind": "interval", "fields": ("lower", "upper", "raw")},
):
    lower: torch.Tensor  # [L', R, n]
    upper: torch.Tensor
    raw: torch.Tensor
    layers: tuple[int, ...]
    rows: tuple[int, ...]
    tokens: list[str] | None = None


@dataclass
class Tables(Result, tables={"per_layer": ("layer", "probe", "objective")}):
    per_layer: pd.DataFrame
    settings: dict = field(default_factory=dict)


def _maps(n: int = 6) -> Maps:
    g = torch.Generator().manual_seed(0)
    raw = torch.rand(2, 3, n, n, generator=g).softmax(-1)
    eff = raw.double() + 0.2 * torch.rand(2, 3, n, n, generator=g, dtype=torch.float64) - 0.1
    return Maps(
        raw=raw,
        effective=eff,
        width=torch.arange(6).reshape(2, 3),
        inner=Inner(torch.tensor([[1, 2, 3], [4, 5, 6]])),
        variant="paper",
        tokens=TOKENS[:n],
        model_name="tiny<model>",
        heads_kept=(0, 2),
        options={"k": 1},
    )


def test_repr_is_short_and_names_the_shapes() -> None:
    m = _maps()
    text = repr(m)
    assert text.startswith("Maps(model='tiny<model>', n_tokens=6, variant='paper'")
    assert m.n_tokens == 6  # the name repr prints is an attribute
    assert "raw: float32[layer=2, head=3, query=6, key=6]" in text
    assert "effective: float64[layer=2, head=3, query=6, key=6]" in text
    assert "inner=Inner(…)" in text
    assert "tensor(" not in text and len(text) < 400
    # the null property is not computed for repr
    assert "null:" not in text


def test_html_escapes_every_label() -> None:
    html = _maps()._repr_html_()
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "a&amp;b" in html and "tiny&lt;model&gt;" in html
    assert "[layer=2, head=3, query=6, key=6]" in html
    assert html.count("<tr>") == 1 + 3  # header + raw, effective, width


def test_to_pandas_is_tidy_with_token_labels() -> None:
    m = _maps()
    df = m.to_pandas()
    assert list(df.columns) == [
        "layer", "head", "query", "query_token", "key", "key_token", "raw", "effective", "null",
    ]  # fmt: skip
    assert len(df) == 2 * 3 * 6 * 6
    row = df[(df.layer == 1) & (df["head"] == 2) & (df["query"] == 4) & (df.key == 1)].iloc[0]
    assert row.raw == pytest.approx(float(m.raw[1, 2, 4, 1]))
    assert row.null == pytest.approx(float(m.null[1, 2, 4, 1]))
    assert row.query_token == "cat" and row.key_token == TOKENS[1]
    sub = m.to_pandas("effective", layer=1, head=[0, 2])
    assert set(sub["head"]) == {0, 2} and set(sub["layer"]) == {1}
    assert len(sub) == 2 * 36
    with pytest.raises(IdentifiableError, match="same dimensions"):
        m.to_pandas("raw", "width")
    with pytest.raises(IdentifiableError, match="layer 5 is not in this result"):
        m.to_pandas(layer=5)


def test_to_xarray_has_named_dims_and_token_coords() -> None:
    m = _maps()
    ds = m.to_xarray()
    assert ds["raw"].dims == ("layer", "head", "query", "key")
    assert ds["width"].dims == ("layer", "head")
    assert list(ds["key_token"].values) == TOKENS
    assert ds.attrs["model"] == "tiny<model>" and ds.attrs["variant"] == "paper"
    np.testing.assert_allclose(ds["null"].sel(layer=1, head=0).values, m.null[1, 0].numpy())


def test_coordinates_follow_rows_and_layers() -> None:
    r = Rows(
        lower=torch.zeros(1, 2, 6, dtype=torch.float64),
        upper=torch.ones(1, 2, 6, dtype=torch.float64) * 0.5,
        raw=torch.full((1, 2, 6), 1 / 6, dtype=torch.float64),
        layers=(3,),
        rows=(1, 4),
        tokens=TOKENS,
    )
    df = r.to_pandas(row=4)
    assert set(df["layer"]) == {3} and set(df["row"]) == {4}
    ds = r.to_xarray()
    assert list(ds["row"].values) == [1, 4] and list(ds["row_token"].values) == [TOKENS[1], "cat"]
    fig = r.plot(layer=3, row=4)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [*TOKENS[:3], r"\$x\$", *TOKENS[4:]]
    assert "row 4" in fig._suptitle.get_text()


def test_plot_draws_each_field_on_a_centred_scale() -> None:
    m = _maps()
    fig = m.plot(layer=1, head=2)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["raw", "effective", "null"]
    images = [ax.images[0] for ax in panels]
    np.testing.assert_allclose(images[1].get_array(), m.effective[1, 2].numpy())
    lo, hi = images[0].get_clim()
    assert lo == -hi and lo < 0  # null attention is negative somewhere: diverging scale
    assert [t.get_text() for t in panels[0].get_yticklabels()][1] == TOKENS[1]
    assert len(fig.axes) == 6  # three panels, each with its own colour bar
    with pytest.raises(IdentifiableError, match="not a dimension"):
        m.plot(depth=1)


def test_tables_pandas_xarray_and_layer_lines() -> None:
    rows = [
        {"layer": layer, "probe": p, "objective": "cos", "rate": r, "ci_low": r - 0.1,
         "ci_high": r + 0.1, "chance": 0.01}
        for p, base in (("linear", 0.9), ("naive", 0.5))
        for layer, r in zip(range(3), (base, base - 0.1, base - 0.2), strict=True)
    ]  # fmt: skip
    t = Tables(pd.DataFrame(rows), settings={"seed": 0})
    assert "per_layer: table[6 rows × 7 columns]" in repr(t)
    assert len(t.to_pandas(probe="naive")) == 3
    ds = t.to_xarray()
    assert ds["rate"].dims == ("layer", "probe", "objective")
    assert float(ds["rate"].sel(layer=2, probe="linear", objective="cos")) == pytest.approx(0.7)
    fig = t.plot()
    ax = fig.axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["linear cos", "naive cos", "chance"]
    np.testing.assert_allclose(ax.get_lines()[1].get_ydata(), [0.5, 0.4, 0.3])


def test_save_load_round_trip(tmp_path: Path) -> None:
    m = _maps()
    path = m.save(tmp_path / "m.safetensors")
    back = Maps.load(path)
    assert torch.equal(back.raw, m.raw) and back.raw.dtype == torch.float32
    assert torch.equal(back.effective, m.effective)
    assert torch.equal(back.inner.rank, m.inner.rank) and isinstance(back.inner, Inner)
    assert back.tokens == TOKENS and back.heads_kept == (0, 2) and back.options == {"k": 1}
    with pytest.raises(IdentifiableError, match="outside identifiable"):
        load(path)  # the generic loader imports identifiable's own classes only
    t = Tables(
        pd.DataFrame({"layer": [0, 1], "probe": ["a", None], "rate": [0.5, np.nan]}),
        settings={"x": [1, 2]},
    )
    back_t = Tables.load(t.save(tmp_path / "t.safetensors"))
    pd.testing.assert_frame_equal(back_t.per_layer, t.per_layer)


def test_load_refuses_files_that_are_not_ours(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    foreign = tmp_path / "foreign.safetensors"
    save_file({"x": torch.zeros(2)}, str(foreign))
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    for path in (foreign, text):
        with pytest.raises(IdentifiableError, match="is not an identifiable result file"):
            Maps.load(path)
    with pytest.raises(IdentifiableError, match="no such file"):
        Maps.load(tmp_path / "missing.safetensors")
    saved = _maps().save(tmp_path / "m.safetensors")
    with pytest.raises(
        IdentifiableError, match=r"holds a Maps, not a Rows: load it with Maps\.load"
    ):
        Rows.load(saved)


def test_load_never_imports_a_module_named_by_the_file(tmp_path: Path) -> None:
    import json

    from safetensors.torch import save

    header = {"format": "identifiable.result", "version": 1, "class": "os:system", "fields": {}}
    path = tmp_path / "evil.safetensors"
    path.write_bytes(save({"x": torch.zeros(1)}, metadata={"identifiable": json.dumps(header)}))
    with pytest.raises(IdentifiableError, match="outside identifiable"):
        load(path)


def test_to_bertviz_shapes() -> None:
    m = _maps()
    layers = m.to_bertviz("null")
    assert len(layers) == 2 and tuple(layers[0].shape) == (1, 3, 6, 6)
    torch.testing.assert_close(layers[1][0].double(), m.null[1], atol=1e-6, rtol=0)
    with pytest.raises(IdentifiableError, match="layer, head, query, key"):
        m.to_bertviz("width")
