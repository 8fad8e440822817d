"""The credible band in the viewer's row table: computed in Python with the page (the
uniform posterior over the valid rows, `attention_posterior`), drawn inside the certified
interval, its note shown as text, and skipped with a sentence when the time budget is short."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from identifiable.attention import attention_posterior
from identifiable.store.files import atomic_write_text
from identifiable.utils.threads import one_thread
from identifiable.viewer.build import POSTERIOR_SAMPLES, viewer_html_for_trace, with_posterior
from identifiable.viewer.encoding import IntervalRow, interval_json
from identifiable.viewer.page import read_viewer_data, viewer_html
from viewer.test_viewer_browser import HOSTILE, P, assert_clean, synthetic_args

TEXT = "the cat sat on the mat. the dog sat on the log, and the bird sat."  # n = 21 > d_v + 1


def test_the_page_carries_the_posterior_band_of_the_rows_asked_for(tiny_model: Any) -> None:
    trace = tiny_model("bert").trace(TEXT)
    html = viewer_html_for_trace(trace, layer=1, head=2, rows=[5], max_rows=2, interval_seconds=60)
    (data,) = read_viewer_data(html)
    entry = data["intervals"]["1,2,5"]
    lo, hi = np.array(entry["lo"]), np.array(entry["hi"])
    c_lo, c_hi = np.array(entry["cred_lo"]), np.array(entry["cred_hi"])
    assert (lo <= c_lo).all() and (c_lo <= c_hi).all() and (c_hi <= hi).all()
    assert (c_hi - c_lo < hi - lo).any()  # a band, not the interval again
    with one_thread():  # as the page computes it: seed 0, one thread
        post = attention_posterior(trace, 1, 2, [5], samples=POSTERIOR_SAMPLES, time_budget=60)
    np.testing.assert_allclose(c_lo, post.credible_lower[0, 0].numpy(), atol=6e-5)
    np.testing.assert_allclose(c_hi, post.credible_upper[0, 0].numpy(), atol=6e-5)
    assert (
        f"P(the raw top key stays on top) = {float(post.p_top_stays[0, 0]):.2f}"
        in (entry["posterior_note"])
    )
    assert "Credible bands (uniform posterior" in data["interval_note"]
    others = [v for k, v in data["intervals"].items() if k != "1,2,5"]
    assert others and all(v["cred_lo"] is None for v in others)  # only the rows asked for


def test_a_budget_too_small_skips_the_band_with_a_sentence(tiny_model: Any) -> None:
    trace = tiny_model("bert").trace(TEXT)
    a = trace.attentions[1, 2, 5].double().numpy()
    row = IntervalRow(1, 2, 5, a, np.zeros_like(a), np.ones_like(a), None)
    out, told = with_posterior(trace, [row], [5], 1e-6)
    assert out == [row] and told.startswith(" Credible bands not computed: ")
    entry = interval_json(row)
    assert entry["cred_lo"] is None and entry["cred_hi"] is None


@pytest.mark.browser
def test_the_row_table_draws_the_band_inside_the_interval(tmp_path: Path, open_page: Any) -> None:
    args = synthetic_args()
    (iv,) = args["intervals"]
    span = iv.hi - iv.lo
    band = IntervalRow(*[getattr(iv, f) for f in ("layer", "head", "row", "weights", "lo", "hi")],
                       iv.witness, credible_lo=iv.lo + 0.2 * span, credible_hi=iv.lo + 0.6 * span,
                       posterior_note="<script>alert(1)</script> split-R̂ 1.002")  # fmt: skip
    doc = viewer_html(**args | {"intervals": [band], "row": 3})
    loaded = open_page(atomic_write_text(tmp_path / "viewer.html", doc))
    page = loaded.page
    panel = page.inner_text(P("interval-panel"))
    assert "credible 95%" in panel and "95% credible band (uniform posterior)" in panel
    assert "<script>alert(1)</script> split-R̂ 1.002" in panel  # the note, as text
    table = P("interval-panel") + " table"
    assert page.locator(table + " .idf-cred").count() == len(HOSTILE)
    boxes = page.evaluate(
        """(sel) => [...document.querySelectorAll(sel + ' .idf-bar')].map((b) => {
             const s = b.querySelector('.idf-span').getBoundingClientRect();
             const c = b.querySelector('.idf-cred').getBoundingClientRect();
             return [s.left, s.right, c.left, c.right];
           })""",
        table,
    )
    for s_left, s_right, c_left, c_right in boxes:
        assert s_left - 0.5 <= c_left < c_right <= s_right + 0.5
        assert c_right - c_left < 0.5 * (s_right - s_left)  # 40 % of the interval
    cells = page.locator(table + " td.idf-cred-cell").all_inner_texts()
    assert len(cells) == len(HOSTILE) and all(" … " in c for c in cells)
    assert_clean(loaded)
