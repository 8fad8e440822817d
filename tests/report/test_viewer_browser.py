"""The viewer page in headless Chromium: renders, reacts, and shows hostile tokens as text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from playwright.sync_api import expect

from identifiable.report.viewer import viewer_html
from identifiable.report.viewer_data import IntervalRow
from identifiable.store.files import atomic_write_text

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

CANVAS_STATS = """(id) => {
  const c = document.getElementById(id);
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  const colours = new Set();
  for (let k = 0; k < d.length; k += 4 * 97) colours.add(d[k] + ',' + d[k + 1] + ',' + d[k + 2]);
  return colours.size;
}"""


def synthetic_page(
    tmp_path: Path, *, max_bytes: int = 9_000_000, causal: bool = False, repeat: int = 1
) -> Path:
    gen = torch.Generator().manual_seed(0)
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
    doc = viewer_html(
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
    return atomic_write_text(tmp_path / "viewer.html", doc)


def assert_clean(loaded: Any) -> None:
    assert loaded.console_errors == []
    assert loaded.dialogs == [], "a script from the input ran"
    assert loaded.requests == [], "the page tried to use the network"


def test_viewer_renders_and_click_updates_interval_panel(tmp_path: Path, open_page: Any) -> None:
    loaded = open_page(synthetic_page(tmp_path))
    page = loaded.page
    for kind in ("raw", "effective", "null"):
        assert page.evaluate(CANVAS_STATS, f"map-{kind}") > 3, f"{kind} heatmap is blank"
    assert page.locator("#null-grid td").count() == 12
    assert page.locator("#null-grid td.current").inner_text() == "6"
    assert "not a probability distribution" in page.inner_text("#not-distribution")

    page.click("#tokens span[data-index='3']")
    panel = page.inner_text("#interval-panel")
    assert "query 3" in panel and "witness" in panel
    assert page.locator("#interval-panel table tr").count() == 1 + len(HOSTILE)
    page.click("#tokens span[data-index='5']")
    assert "not precomputed" in page.inner_text("#interval-panel")
    assert "precomputed for row 3 only" in page.inner_text("#interval-panel")

    page.hover("#map-raw", position={"x": 5, "y": 5})
    assert "query 0" in page.inner_text("#hover") and "raw" in page.inner_text("#hover")

    page.select_option("#layer", index=2)  # third layer: value "2", labelled "3"
    # selecting decodes the head's matrices asynchronously: wait for the grid to follow
    expect(page.locator("#null-grid td.current")).to_have_text("10", timeout=10_000)
    assert_clean(loaded)
    loaded.screenshot("viewer-synthetic.png")


def test_hostile_tokens_are_shown_literally_and_never_run(tmp_path: Path, open_page: Any) -> None:
    path = synthetic_page(tmp_path)
    source = path.read_text("utf-8")
    assert "<script>alert" not in source and "<img src=x" not in source
    loaded = open_page(path)
    page = loaded.page
    shown = page.locator("#tokens span").all_inner_texts()
    assert shown[1:5] == HOSTILE[1:5]
    assert page.locator("img").count() == 0
    assert "<b>synthetic</b>" in page.inner_text("h1")
    page.click("#tokens span[data-index='3']")
    assert "<script>alert(1)</script>" in page.inner_text("#interval-panel")
    assert_clean(loaded)


def test_heads_over_the_budget_say_how_to_see_them(tmp_path: Path, open_page: Any) -> None:
    loaded = open_page(synthetic_page(tmp_path, max_bytes=600_100))  # room for one head
    page = loaded.page
    assert page.locator("#null-grid td.absent").count() == 11
    page.locator("#null-grid td.absent").first.click()
    assert "not embedded" in page.inner_text("#head-status")
    assert "identifiable view" in page.inner_text("#head-status")
    assert_clean(loaded)


def test_long_text_heads_over_the_budget_get_previews(tmp_path: Path, open_page: Any) -> None:
    # 160 tokens: previews are 3×3 token blocks (ceil(160 / 64)); the budget holds the chosen head at full size.
    loaded = open_page(synthetic_page(tmp_path, max_bytes=1_000_000, causal=True, repeat=20))
    page = loaded.page
    assert "preview" not in page.inner_text("#head-status")
    page.locator("#null-grid td.absent").first.click()
    # selecting a head decodes its matrices asynchronously: wait for the status to follow
    expect(page.locator("#head-status")).to_contain_text("preview: means of", timeout=10_000)
    status = page.inner_text("#head-status")
    assert "preview: means of 3×3 token blocks" in status and "identifiable view" in status
    for kind in ("raw", "effective", "null"):
        assert page.evaluate(CANVAS_STATS, f"map-{kind}") > 3, f"{kind} preview is blank"
    page.hover("#map-raw", position={"x": 1, "y": 1})  # token 0 of 160 on a 260 px map
    assert "preview block: queries 0–2 → keys 0–2" in page.inner_text("#hover")
    assert_clean(loaded)


def test_causal_masked_cells_are_marked(tmp_path: Path, open_page: Any) -> None:
    loaded = open_page(synthetic_page(tmp_path, causal=True))
    page = loaded.page
    box = page.locator("#map-raw").bounding_box()
    page.mouse.move(box["x"] + box["width"] - 3, box["y"] + 3)  # top-right: key after query
    assert "masked" in page.inner_text("#hover")
    assert_clean(loaded)
