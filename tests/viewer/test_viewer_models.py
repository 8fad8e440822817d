"""The viewer on real (tiny) models: encoders, decoders and grouped-query attention; and its CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from playwright.sync_api import expect

from identifiable.attention import effective_attention
from identifiable.errors import IdentifiableError
from identifiable.viewer.build import viewer_html_for_trace
from identifiable.viewer.encoding import decode_head
from identifiable.viewer.page import read_viewer_data

TEXT = (
    "The river rose after the storm, and the old bridge closed.",
    "Trains stopped; people walked home.",
)


def page_data(html: str) -> dict[str, Any]:
    islands = read_viewer_data(html)
    assert len(islands) == 1, "data island missing"
    return islands[0]


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama"])
def test_page_data_matches_the_analysis(tiny_model: Any, arch: str) -> None:
    trace = tiny_model(arch).trace(TEXT)
    html = viewer_html_for_trace(trace, layer=1, head=2, max_rows=3, interval_seconds=60)
    data = page_data(html)
    n = trace.n_tokens
    assert data["tokens"] == trace.tokens and data["causal"] == trace.is_causal
    eff = effective_attention(trace)
    assert data["null_dims"] == eff.null_space.dim[..., -1].tolist()
    assert len(data["matrices"]) == trace.n_layers * trace.n_heads
    assert all(e["f"] == 1 for e in data["matrices"].values())  # tiny: all at full resolution
    for key in ("1,2", "0,3"):
        layer, head = map(int, key.split(","))
        raw, effective = decode_head(data["matrices"][key], n)
        assert (
            np.abs(raw - trace.attentions[layer, head].double().numpy()).max()
            <= data["matrices"][key]["raw"][1] / 2 + 1e-9
        )
        assert (
            np.abs(effective - eff.effective[layer, head].numpy()).max()
            <= data["matrices"][key]["eff"][1] / 2 + 1e-9
        )
    assert len(data["intervals"]) == 3
    assert data["start_row"] is None  # no --rows: nothing preselected
    # the head grid's shade: ‖A − A_eff‖_F / ‖A‖_F per head, against numpy
    a_np = trace.attentions.double().numpy()
    e_np = eff.effective.double().numpy()
    expected = np.linalg.norm(a_np - e_np, axis=(2, 3)) / np.linalg.norm(a_np, axis=(2, 3))
    assert np.allclose(data["distance"], expected, atol=1e-6)
    dims = np.array(data["null_dims"])
    # identifiable heads have A_eff = A; the others differ, and not all by the same amount
    assert np.all(expected[dims == 0] < 1e-9)
    assert (dims > 0).any() and np.all(expected[dims > 0] > 1e-6)
    assert np.ptp(expected[dims > 0]) > 1e-3
    for key, iv in data["intervals"].items():
        layer, head, row = map(int, key.split(","))
        assert (layer, head) == (1, 2)
        lo, hi, a = (np.array(iv[k]) for k in ("lo", "hi", "weights"))
        assert np.all(lo <= a + 1e-4) and np.all(a <= hi + 1e-4)
        if trace.is_causal:
            assert np.all(hi[row + 1 :] == 0)
        if iv["witness"] is not None:
            w = np.array(iv["witness"])
            assert abs(w.sum() - 1) < 1e-3 and np.all(w >= lo - 1e-4) and np.all(w <= hi + 1e-4)


def test_bad_choices_are_clear_errors(tiny_model: Any) -> None:
    trace = tiny_model("bert").trace("A short text.")
    with pytest.raises(IdentifiableError, match="valid layers"):
        viewer_html_for_trace(trace, layer=7)
    with pytest.raises(IdentifiableError, match="valid rows"):
        viewer_html_for_trace(trace, rows=[99])
    with pytest.raises(IdentifiableError, match="variant"):
        viewer_html_for_trace(trace, variant="softmax")


@pytest.mark.browser
def test_causal_model_page_in_browser(tiny_model: Any, tmp_path: Path, open_page: Any) -> None:
    trace = tiny_model("llama").trace(TEXT)
    path = tmp_path / "llama.html"
    path.write_text(
        viewer_html_for_trace(trace, layer=0, head=1, rows=[4], interval_seconds=60), "utf-8"
    )
    assert page_data(path.read_text("utf-8"))["start_row"] == 4
    loaded = open_page(path)
    page = loaded.page
    # --rows 4: the row is shown on load, without a click
    assert "query 4" in page.inner_text("[data-part='interval-panel']")
    assert page.locator(".idf-tokens span.idf-selected").get_attribute("data-index") == "4"
    rows = page.locator("[data-part='interval-panel'] table tr")
    assert rows.count() == 1 + 5  # header + the 5 keys row 4 can see
    # every row of the head has its bands (the interval map), not only the rows asked for
    page.click(".idf-tokens span[data-index='6']")
    expect(page.locator("[data-part='interval-panel'] h3")).to_contain_text("query 6 ")
    assert rows.count() == 1 + 7  # header + the 7 keys row 6 can see
    assert loaded.console_errors == [] and loaded.dialogs == [] and loaded.requests == []
    # without --certify, rows have no intervals and the panel says so
    path.write_text(viewer_html_for_trace(trace, layer=0, head=1, certify=False), "utf-8")
    loaded = open_page(path)
    loaded.page.click(".idf-tokens span[data-index='6']")
    panel = loaded.page.inner_text("[data-part='interval-panel']")
    assert "not precomputed" in panel and "--no-certify" in panel
    assert loaded.console_errors == [] and loaded.dialogs == [] and loaded.requests == []
