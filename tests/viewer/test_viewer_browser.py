"""The viewer page in headless Chromium: renders, reacts, and shows hostile tokens as text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from playwright.sync_api import expect

from identifiable.results.colormap import STOPS
from identifiable.store.files import atomic_write_text
from identifiable.viewer.encoding import IntervalRow
from identifiable.viewer.page import viewer_html

pytestmark = pytest.mark.browser

HOSTILE = [
    "[CLS]",
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "'-alert(1)-'",
    "</script><script>alert(3)</script>",
    "&amp;",
    "\u2028",
    "[SEP]",
]


def P(name: str) -> str:
    """Selector of a viewer part (elements are found by data-part, not by page-wide ids)."""
    return f"[data-part='{name}']"


CANVAS_STATS = """(sel) => {
  const c = document.querySelector(sel);
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  const colours = new Set();
  for (let k = 0; k < d.length; k += 4 * 97) colours.add(d[k] + ',' + d[k + 1] + ',' + d[k + 2]);
  return colours.size;
}"""


def synthetic_page(
    tmp_path: Path,
    *,
    max_bytes: int = 9_000_000,
    causal: bool = False,
    repeat: int = 1,
    **extra: Any,
) -> Path:
    doc = viewer_html(**synthetic_args(max_bytes=max_bytes, causal=causal, repeat=repeat, **extra))
    return atomic_write_text(tmp_path / "viewer.html", doc)


def synthetic_args(
    *,
    max_bytes: int = 9_000_000,
    causal: bool = False,
    repeat: int = 1,
    seed: int = 0,
    **extra: Any,
) -> dict[str, Any]:
    """Arguments of `viewer_html` for 3 layers × 4 heads of random attention on HOSTILE tokens."""
    gen = torch.Generator().manual_seed(seed)
    tokens = HOSTILE * repeat
    n_layers, n_heads, n = 3, 4, len(tokens)
    raw = torch.softmax(2 * torch.randn(n_layers, n_heads, n, n, generator=gen), -1)
    if causal:
        raw = torch.softmax(
            2
            * torch.randn(n_layers, n_heads, n, n, generator=gen).masked_fill(
                torch.ones(n, n).triu(1).bool(), float("-inf")
            ),
            -1,
        )
    eff = raw + 0.05 * torch.randn(raw.shape, generator=gen)
    a = raw[1, 2, 3].numpy()
    rows = [IntervalRow(1, 2, 3, a, np.clip(a - 0.1, 0, 1), np.clip(a + 0.4, 0, 1), a[::-1].copy())]
    return (
        dict(
            tokens=tokens,
            raw=raw,
            effective=eff,
            null_dims=torch.arange(12).reshape(3, 4),
            head_dim=4,
            intervals=rows,
            layer=1,
            head=2,
            is_causal=causal,
            model_name="<b>synthetic</b>",
            max_bytes=max_bytes,
            interval_note="precomputed for row 3 only",
        )
        | extra
    )


def assert_clean(loaded: Any) -> None:
    assert loaded.console_errors == []
    assert loaded.dialogs == [], "a script from the input ran"
    assert loaded.requests == [], "the page tried to use the network"


def test_viewer_renders_and_click_updates_interval_panel(tmp_path: Path, open_page: Any) -> None:
    loaded = open_page(synthetic_page(tmp_path))
    page = loaded.page
    for kind in ("raw", "effective", "null"):
        assert page.evaluate(CANVAS_STATS, P(f"map-{kind}")) > 3, f"{kind} heatmap is blank"
    assert page.locator("table.idf-grid td").count() == 12
    current = page.locator("table.idf-grid td.idf-current")
    assert (current.get_attribute("data-layer"), current.get_attribute("data-head")) == ("1", "2")
    assert "not a probability distribution" in page.inner_text(P("not-distribution"))

    page.click(".idf-tokens span[data-index='3']")
    panel = page.inner_text(P("interval-panel"))
    assert "query 3" in panel and "witness" in panel
    assert page.locator(P("interval-panel") + " table tr").count() == 1 + len(HOSTILE)
    page.click(".idf-tokens span[data-index='5']")
    assert "not precomputed" in page.inner_text(P("interval-panel"))
    assert "precomputed for row 3 only" in page.inner_text(P("interval-panel"))

    page.hover(P("map-raw"), position={"x": 5, "y": 5})
    assert "query 0" in page.inner_text(P("hover")) and "raw" in page.inner_text(P("hover"))

    page.select_option(P("layer"), index=2)  # third layer: value "2", labelled "3"
    # selecting decodes the head's matrices asynchronously: wait for the grid to follow
    expect(page.locator("table.idf-grid td.idf-current")).to_have_attribute(
        "data-layer", "2", timeout=10_000
    )
    assert_clean(loaded)
    loaded.screenshot("viewer-synthetic.png")


def test_hostile_tokens_are_shown_literally_and_never_run(tmp_path: Path, open_page: Any) -> None:
    path = synthetic_page(tmp_path)
    source = path.read_text("utf-8")
    assert "<script>alert" not in source and "<img src=x" not in source
    loaded = open_page(path)
    page = loaded.page
    shown = page.locator(".idf-tokens span").all_inner_texts()
    assert shown[1:5] == HOSTILE[1:5]
    assert page.locator("img").count() == 0
    assert "<b>synthetic</b>" in page.inner_text("h1")
    page.click(".idf-tokens span[data-index='3']")
    assert "<script>alert(1)</script>" in page.inner_text(P("interval-panel"))
    assert_clean(loaded)


def test_heads_over_the_budget_say_how_to_see_them(tmp_path: Path, open_page: Any) -> None:
    loaded = open_page(synthetic_page(tmp_path, max_bytes=600_100))  # room for one head
    page = loaded.page
    assert page.locator("table.idf-grid td.idf-absent").count() == 11
    page.locator("table.idf-grid td.idf-absent").first.click()
    assert "not embedded" in page.inner_text(P("head-status"))
    assert "identifiable view" in page.inner_text(P("head-status"))
    assert_clean(loaded)


def test_long_text_heads_over_the_budget_get_previews(tmp_path: Path, open_page: Any) -> None:
    # 160 tokens: previews are 3×3 token blocks (ceil(160 / 64)); the budget holds the chosen head at full size.
    loaded = open_page(synthetic_page(tmp_path, max_bytes=1_000_000, causal=True, repeat=20))
    page = loaded.page
    assert "preview" not in page.inner_text(P("head-status"))
    page.locator("table.idf-grid td.idf-absent").first.click()
    # selecting a head decodes its matrices asynchronously: wait for the status to follow
    expect(page.locator(P("head-status"))).to_contain_text("preview: means of", timeout=10_000)
    status = page.inner_text(P("head-status"))
    assert "preview: means of 3×3 token blocks" in status and "identifiable view" in status
    for kind in ("raw", "effective", "null"):
        assert page.evaluate(CANVAS_STATS, P(f"map-{kind}")) > 3, f"{kind} preview is blank"
    page.hover(P("map-raw"), position={"x": 1, "y": 1})  # token 0 of 160 on a 260 px map
    assert "preview block: queries 0–2 → keys 0–2" in page.inner_text(P("hover"))
    assert_clean(loaded)


def test_causal_masked_cells_are_marked(tmp_path: Path, open_page: Any) -> None:
    loaded = open_page(synthetic_page(tmp_path, causal=True))
    page = loaded.page
    box = page.locator(P("map-raw")).bounding_box()
    page.mouse.move(box["x"] + box["width"] - 3, box["y"] + 3)  # top-right: key after query
    assert "masked" in page.inner_text(P("hover"))
    assert_clean(loaded)


AXIS_TICKS = (
    """(sel) => [...document.querySelectorAll(sel + ' span.idf-tick')].map((s) => s.textContent)"""
)


def test_axes_are_labelled_with_tokens_and_a_colour_bar_shows_the_scale(
    tmp_path: Path, open_page: Any
) -> None:
    loaded = open_page(synthetic_page(tmp_path))
    page = loaded.page
    for kind in ("raw", "effective", "null"):
        # 8 tokens on a 250 px map: every token fits, shown literally (hostile text as text)
        assert page.evaluate(AXIS_TICKS, P(f"yaxis-{kind}")) == HOSTILE
        assert page.evaluate(AXIS_TICKS, P(f"xaxis-{kind}")) == HOSTILE
    # ticks sit on their rows: label i is centred on row i of the canvas
    box = page.locator(P("map-raw")).bounding_box()
    tick = page.locator(P("yaxis-raw") + " span[data-index='5']").bounding_box()
    row_centre = box["y"] + (5 + 0.5) * box["height"] / len(HOSTILE)
    assert abs(tick["y"] + tick["height"] / 2 - row_centre) < 3
    assert page.evaluate(CANVAS_STATS, P("colourbar")) > 20, "colour bar is blank"
    status = page.inner_text(P("head-status"))
    scale = status.split("colour scales raw ±")[1].split(",")[0]
    assert abs(float(page.inner_text(P("scale-raw")).split("s = ")[1]) - float(scale)) < 6e-4
    assert page.inner_text(P("colourbar-hi")) == "+s"
    assert page.inner_text(P("colourbar-lo")) == "−s"
    # the colour bar's ends are the maps' extreme colours: blue at -s, red at +s
    ends = page.evaluate(
        """(sel) => { const c = document.querySelector(sel); const g = c.getContext('2d');
        return [g.getImageData(0, 6, 1, 1).data.slice(0, 3), g.getImageData(c.width - 1, 6, 1, 1).data.slice(0, 3)]
          .map((d) => Array.from(d)); }""",
        P("colourbar"),
    )
    assert ends == [list(STOPS[0]), list(STOPS[-1])]
    assert_clean(loaded)


def test_long_text_axes_label_every_kth_token_and_the_hovered_one(
    tmp_path: Path, open_page: Any
) -> None:
    loaded = open_page(synthetic_page(tmp_path, repeat=20))  # 160 tokens
    page = loaded.page
    ticks = page.evaluate(AXIS_TICKS, P("yaxis-raw"))
    stride = int(page.get_attribute(P("yaxis-raw"), "data-stride"))
    assert stride == 8  # ceil(11 px / (250 px / 160 tokens))
    assert ticks == [HOSTILE[i % 8] for i in range(0, 160, stride)]
    assert f"Every {stride}th token" in page.inner_text(P("axis-note"))
    box = page.locator(P("map-effective")).bounding_box()
    # about row 13 and key 42, which carry no tick: hovering labels them
    page.mouse.move(box["x"] + (42.5 / 160) * box["width"], box["y"] + (13.5 / 160) * box["height"])
    readout = page.inner_text(P("hover"))
    i = int(readout.split("query ")[1].split(" ")[0])
    j = int(readout.split("key ")[1].split(" ")[0])
    assert abs(i - 13) <= 1 and abs(j - 42) <= 1 and i % stride and j % stride
    assert page.inner_text(P("yaxis-effective") + " .idf-cursor") == HOSTILE[i % 8]
    assert page.inner_text(P("xaxis-effective") + " .idf-cursor") == HOSTILE[j % 8]
    assert_clean(loaded)


ORANGE_ROWS = """(sel) => {
  const c = document.querySelector(sel);
  const d = c.getContext('2d').getImageData(c.width / 2, 0, 1, c.height).data;
  const rows = [];
  for (let y = 0; y < c.height; y++) {
    if (d[4 * y] === 240 && d[4 * y + 1] === 165 && d[4 * y + 2] === 0) rows.push(y);
  }
  return rows;
}"""


def test_a_preselected_row_is_shown_on_load(tmp_path: Path, open_page: Any) -> None:
    loaded = open_page(synthetic_page(tmp_path, row=3))
    page = loaded.page
    # no click: the panel, the token and the maps already show row 3
    panel = page.inner_text(P("interval-panel"))
    assert "query 3" in panel and "witness" in panel
    assert page.locator(".idf-tokens span.idf-selected").get_attribute("data-index") == "3"
    cell = 300 / len(HOSTILE)
    for kind in ("raw", "effective", "null"):
        rows = page.evaluate(ORANGE_ROWS, P(f"map-{kind}"))
        assert rows and min(rows) >= 3 * cell - 2 and max(rows) <= 4 * cell + 2, rows
    assert_clean(loaded)


def test_without_a_preselected_row_nothing_is_highlighted(tmp_path: Path, open_page: Any) -> None:
    loaded = open_page(synthetic_page(tmp_path))
    page = loaded.page
    assert page.evaluate(ORANGE_ROWS, P("map-raw")) == []
    assert "Click a query token" in page.inner_text(P("interval-panel"))
    assert_clean(loaded)


GRID_COLOURS = """() => [...document.querySelectorAll('table.idf-grid td')]
  .map((td) => getComputedStyle(td).backgroundColor)"""


def test_head_grid_is_shaded_by_raw_effective_distance(tmp_path: Path, open_page: Any) -> None:
    # fabricated distances, deliberately not in null-dimension order
    distance = torch.tensor([[0.0, 0.9, 0.1, 0.5], [0.3, 0.3, 0.7, 0.2], [1.2, 0.0, 0.6, 0.4]])
    loaded = open_page(synthetic_page(tmp_path, head_distance=distance))
    page = loaded.page
    colours = page.evaluate(GRID_COLOURS)

    def darkness(css: str) -> int:
        return -sum(int(v) for v in css[css.index("(") + 1 : -1].split(",")[:3])

    flat = distance.flatten().tolist()
    # equal distances get equal shades; larger distances darker ones
    for a in range(12):
        for b in range(12):
            if flat[a] == flat[b]:
                assert colours[a] == colours[b]
            elif flat[a] < flat[b]:
                assert darkness(colours[a]) < darkness(colours[b])
    assert colours[0] == "rgb(255, 255, 255)"
    assert "0.9000" in page.get_attribute(
        "table.idf-grid td[data-layer='0'][data-head='1']", "title"
    )
    assert "1.200" in page.inner_text(P("grid-legend"))
    assert_clean(loaded)
    (tmp_path / "same").mkdir()
    loaded = open_page(synthetic_page(tmp_path / "same", head_distance=torch.full((3, 4), 0.4)))
    assert len(set(loaded.page.evaluate(GRID_COLOURS))) == 1  # nothing to tell apart: one shade
