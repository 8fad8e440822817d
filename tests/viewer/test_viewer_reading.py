"""Figures for reading, in headless Chromium: the viewer draws the colours Python computes
(`identifiable.results.colormap`) on per-panel scales that a [CLS] column cannot wash out, its head
grid shows each head's null fraction, and the row table shows effective attention and
intervals on an axis wide enough to read a 0.05-wide interval. Screenshots go to
artifacts/ (docs/img/ holds copies)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from identifiable.results.colormap import NEUTRAL, STOPS, colour, panel_scale
from identifiable.store.files import atomic_write_text
from identifiable.viewer.encoding import IntervalRow, decode_head
from identifiable.viewer.page import read_viewer_data, viewer_html

pytestmark = pytest.mark.browser

TOKENS = ["[CLS]", "the", "<b>cat</b>", "sat", "on", "a", "mat", "[SEP]"]
N = len(TOKENS)
PIXEL = """([sel, x, y]) => Array.from(document.querySelector(sel).getContext('2d')
  .getImageData(x, y, 1, 1).data.slice(0, 3))"""


def P(name: str) -> str:
    return f"[data-part='{name}']"


def cls_heavy(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """2 layers × 3 heads of attention where key 0 ([CLS]) takes 0.93 of every row and the
    other keys share 0.07 (about 100× less each); effective attention moves the small
    entries by up to ±0.002–0.012 (by head) and keeps the [CLS] column. Raw entries of 0 exist (exactly
    representable on the page): rows 2 and 5 give key 6 nothing."""
    g = torch.Generator().manual_seed(seed)
    rest = torch.rand(2, 3, N, N - 1, generator=g, dtype=torch.float64)
    rest[..., [2, 5], 5] = 0.0
    rest = 0.07 * rest / rest.sum(-1, keepdim=True)
    raw = torch.cat([torch.full((2, 3, N, 1), 0.93, dtype=torch.float64), rest], -1)
    amp = 0.002 * torch.arange(1, 7, dtype=torch.float64).reshape(2, 3, 1, 1)  # differs per head
    eff = raw + amp * (2 * torch.rand(raw.shape, generator=g, dtype=torch.float64) - 1)
    eff[..., 0] = raw[..., 0]
    return raw, eff


def page_for(tmp_path: Path, name: str = "v.html", **extra: Any) -> Path:
    raw, eff = cls_heavy()
    args: dict[str, Any] = dict(
        tokens=TOKENS, raw=raw, effective=eff, null_dims=torch.full((2, 3), 4),
        head_dim=4, layer=1, head=2, model_name="fabricated",
    )  # fmt: skip
    return atomic_write_text(tmp_path / name, viewer_html(**(args | extra)))


def fraction(v: float) -> str:
    """viewer.js `fraction`: two decimals, or two significant digits below 0.095."""
    if v == 0:
        return "0"
    return f"{v:.2f}" if v >= 0.095 else f"{v:#.2g}"  # JS toPrecision(2) keeps the zeros


def pixel(page: Any, kind: str, i: int, j: int) -> tuple[int, ...]:
    """The colour at the centre of cell (i, j) of a 300 px map."""
    got = page.evaluate(
        PIXEL, [P(f"map-{kind}"), int((j + 0.5) * 300 / N), int((i + 0.5) * 300 / N)]
    )
    return tuple(got)


def test_python_and_the_browser_draw_the_same_colours_on_per_panel_scales(
    tmp_path: Path, open_page: Any
) -> None:
    loaded = open_page(page_for(tmp_path))
    page = loaded.page
    (data,) = read_viewer_data(page.content())
    assert data["colormap"]["stops"] == [list(s) for s in STOPS]  # the page carries Python's stops
    raw, eff = decode_head(data["matrices"]["1,2"], N)
    panels = {"raw": raw, "effective": eff, "null": raw - eff}
    for kind, values in panels.items():
        s = panel_scale(values)
        shown = float(page.get_attribute(P(f"scale-{kind}"), "data-scale"))
        assert shown == pytest.approx(s, rel=1e-12), kind  # the same rule on both sides
        # the [CLS] column (0.93) is ~100× the rest, yet the rest spans the scale
        inner = np.abs(values[:, 1:])
        assert values[:, 0].max() > 50 * inner.mean() or kind == "null"
        assert inner.max() >= s, kind  # some cell outside key 0 reaches an end colour
        for i in range(N):
            for j in range(N):
                want = colour(float(values[i, j]), s)
                got = pixel(page, kind, i, j)
                assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 1, (kind, i, j)
        ends = {pixel(page, kind, i, j) for i in range(N) for j in range(1, N)}
        assert tuple(STOPS[-1]) in ends, kind  # the small entries reach full red
    # 0 is the neutral colour: raw rows 2 and 5 give key 6 exactly 0
    assert raw[2, 6] == 0 and pixel(page, "raw", 2, 6) == NEUTRAL == colour(0.0, 1.0)
    # with one scale set by the [CLS] column the same cells would be almost neutral: the
    # per-panel rule is what makes them readable
    washed = {colour(float(v), 0.93) for v in raw[:, 1:].ravel()}
    assert max(abs(c - n) for rgb in washed for c, n in zip(rgb, NEUTRAL, strict=True)) < 20
    assert "99th percentile" in page.inner_text(P("scale-rule"))
    assert loaded.console_errors == [] and loaded.requests == []


def test_the_head_grid_shows_each_heads_null_fraction(tmp_path: Path, open_page: Any) -> None:
    raw, eff = cls_heavy()
    # by default the page computes ‖A − A_eff‖_F / ‖A‖_F itself: check it independently
    want = [
        [float(np.linalg.norm(raw[k, h] - eff[k, h]) / np.linalg.norm(raw[k, h])) for h in range(3)]
        for k in range(2)
    ]
    assert len({fraction(v) for r in want for v in r}) == 6  # they differ per head
    loaded = open_page(page_for(tmp_path))
    page = loaded.page
    for layer in range(2):
        for head in range(3):
            cell = page.locator(f"table.idf-grid td[data-layer='{layer}'][data-head='{head}']")
            assert cell.inner_text() == fraction(want[layer][head])
            assert f"{want[layer][head]:.4f}" in cell.get_attribute("title")
    note = page.inner_text(P("null-dims-note"))
    assert "4 for every head" in note and "n − d_v = 4" in note
    assert page.locator("table.idf-grid td", has_text="4").count() == 0  # not the old "4"s
    # fabricated distances and null dims that differ: shown as given, the dims as a range
    distance = torch.tensor([[0.05, 0.61, 0.3], [0.9, 0.12, 0.44]])
    dims = torch.tensor([[4, 4, 3], [4, 2, 4]])
    loaded = open_page(page_for(tmp_path, "w.html", head_distance=distance, null_dims=dims))
    texts = loaded.page.locator("table.idf-grid td").all_inner_texts()
    assert texts == [fraction(v) for v in distance.flatten().tolist()]
    assert "from 2 to 4" in loaded.page.inner_text(P("null-dims-note"))
    assert "0.900, the largest here" in loaded.page.inner_text(P("grid-legend"))
    loaded.screenshot("viewer-head-grid.png")


ROW = np.array([0.25, 0.2, 0.15, 0.12, 0.1, 0.08, 0.06, 0.04])

SPANS = """(sel) => [...document.querySelectorAll(sel + ' table tr[data-key]')].map((tr) => {
  const r = tr.querySelector('.idf-span').getBoundingClientRect();
  return [+tr.dataset.key, r.width, tr.querySelector('.idf-eff-cell').textContent];
})"""


def test_the_row_table_shows_effective_attention_and_readable_intervals(
    tmp_path: Path, open_page: Any
) -> None:
    raw, eff = cls_heavy()
    raw[1, 2, 3] = torch.from_numpy(ROW)
    eff[1, 2, 3] = raw[1, 2, 3] + torch.linspace(-0.01, 0.01, N, dtype=torch.float64)
    lo, hi = ROW - 0.02, ROW + 0.03  # every interval is 0.05 wide
    row = IntervalRow(1, 2, 3, ROW, lo, hi, ROW[::-1].copy())
    path = page_for(tmp_path, raw=raw, effective=eff, intervals=[row], row=3)
    loaded = open_page(path)
    page = loaded.page
    (data,) = read_viewer_data(page.content())
    _, shown_eff = decode_head(data["matrices"]["1,2"], N)
    spans = page.evaluate(SPANS, P("interval-panel"))
    assert len(spans) == N
    for key, width, eff_text in spans:
        assert eff_text == f"{shown_eff[3, key]:.4f}"  # the effective column is the map's row
        # 0.05 on a 0–1 axis of a 260 px bar would be 13 px; on the row's own axis it is wider
        assert width > 30, (key, width)
    axis = [
        float(v) for v in page.get_attribute(P("interval-panel") + " table", "data-axis").split(",")
    ]
    assert axis[0] < lo.min() and axis[1] > hi.max() and axis[1] - axis[0] < 0.35
    assert "bar axis fitted to this row" in page.inner_text(P("interval-panel"))
    assert loaded.console_errors == [] and loaded.requests == []
    loaded.screenshot("viewer-row-table.png")


TEXT = (
    "The old river city was quiet that morning, and the people who lived near the station "
    "watched the first train leave before the music started in the small green square. "
    "Later the rain came down on the red roofs of the houses by the water."
)


def shoot(page: Any, first: str, last: str, path: Path) -> None:
    """A screenshot from the top of `first` to the bottom of `last`, `first`'s width."""
    a, b = page.locator(first).bounding_box(), page.locator(last).bounding_box()
    clip = {"x": a["x"], "y": a["y"], "width": a["width"], "height": b["y"] + b["height"] - a["y"]}
    page.screenshot(path=str(path), clip=clip, full_page=True)


def test_minilm_viewer_for_the_docs(minilm: Any, tmp_path: Path, open_page: Any) -> None:
    """The embedded MiniLM on a 50-token text (n > d_v = 32): the head grid's fractions
    differ per head, and the screenshots docs/img/ copies are taken here."""
    from identifiable.viewer.build import build_viewer
    from identifiable.viewer.encoding import null_fraction

    html = build_viewer(minilm, TEXT, layer=2, head=3, rows=[9], certify=True, interval_seconds=8)
    loaded = open_page(atomic_write_text(tmp_path / "minilm.html", html))
    page = loaded.page
    (data,) = read_viewer_data(html)
    tr = minilm.trace(TEXT)
    from identifiable.attention import effective_attention

    eff = effective_attention(tr)
    want = null_fraction(tr.attentions, eff.effective)
    texts = page.locator("table.idf-grid td").all_inner_texts()
    assert texts == [fraction(float(v)) for v in want.flatten()]
    assert len(set(texts)) > 20  # the grid carries information (it read "n − d_v" before)
    n = data["n"]
    assert f"n − d_v = {n - 32}" in page.inner_text(P("null-dims-note"))
    assert page.locator(P("interval-panel") + " table tr[data-key]").count() == n
    assert loaded.console_errors == [] and loaded.requests == []
    from helpers.browser import ARTIFACTS

    ARTIFACTS.mkdir(exist_ok=True)
    # the head grid and the first row of maps; the row table's first 16 keys
    shoot(page, ".idf-top", P("figure-null"), ARTIFACTS / "viewer-minilm-top.png")
    rows = P("interval-panel") + " table tr[data-key] >> nth=15"
    shoot(page, P("interval-panel"), rows, ARTIFACTS / "viewer-minilm-rows.png")
    # the matplotlib figure of the same head, on the same colormap
    eff.plot(layer=2, head=3).savefig(ARTIFACTS / "plot-minilm-effective.png", dpi=72)
