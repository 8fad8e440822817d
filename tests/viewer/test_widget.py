"""The notebook widget (extra `widget`): the viewer page in a sandboxed frame whose layer and
head follow the widget's traitlets both ways. In headless Chromium a host page runs the
widget's own ES module with a minimal fake anywidget model (get/set/on/save_changes)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from identifiable.errors import IdentifiableError
from identifiable.store.files import atomic_write_text
from identifiable.viewer.page import viewer_html

anywidget = pytest.importorskip(
    "anywidget",
    reason="anywidget is the optional extra `widget` (pip install identifiable[widget])",
)
from identifiable.viewer import widget as idw  # noqa: E402

URL = re.compile(r"https?:|//[a-z0-9.-]+\.[a-z]{2,}/", re.I)


def _page(layer: int = 1, head: int = 2) -> str:
    gen = torch.Generator().manual_seed(0)
    tokens = ["[CLS]", "the", "<b>cat</b>", "sat", "[SEP]"]
    n = len(tokens)
    raw = torch.softmax(2 * torch.randn(3, 4, n, n, generator=gen), -1)
    eff = raw + 0.05 * torch.randn(raw.shape, generator=gen)
    return viewer_html(
        tokens=tokens, raw=raw, effective=eff, null_dims=torch.arange(12).reshape(3, 4),
        head_dim=4, layer=layer, head=head, model_name="synthetic",
    )  # fmt: skip


def test_the_widget_has_no_url_and_checks_its_traitlets() -> None:
    w = idw.viewer_widget(page_html=_page())
    assert isinstance(w, anywidget.AnyWidget) and isinstance(w, idw.ViewerWidget)
    assert (w.layer, w.head) == (1, 2)  # the page's start
    state = w.get_state()
    assert {"_esm", "_page", "layer", "head", "height"} <= set(state)
    for text in (idw.ESM, idw.BRIDGE, w._page):
        assert not URL.search(text), URL.search(text)
    assert f"<script>{idw.BRIDGE}</script></body>" in w._page
    w.layer, w.head = 2, 3
    with pytest.raises(IdentifiableError, match=r"layer must be in 0\.\.2"):
        w.layer = 3
    with pytest.raises(IdentifiableError, match=r"head must be in 0\.\.3"):
        w.head = -1
    with pytest.raises(IdentifiableError, match="complete viewer page"):
        idw.viewer_widget(page_html="<p>not a page</p>")
    with pytest.raises(IdentifiableError, match="not both"):
        idw.viewer_widget()


HOST = """<!doctype html><html><body><div id="out"></div><script type="module">
const esm = %(esm)s;
const state = %(state)s;
const handlers = {};
window.saved = [];
const model = {
  get: (k) => state[k],
  set: (k, v) => { const old = state[k]; state[k] = v; if (old !== v) (handlers["change:" + k] || []).forEach((f) => f()); },
  on: (ev, f) => { (handlers[ev] = handlers[ev] || []).push(f); },
  save_changes: () => { window.saved.push({ layer: state.layer, head: state.head }); },
};
window.fakeModel = model;
const url = URL.createObjectURL(new Blob([esm], { type: "text/javascript" }));
const mod = await import(url);
mod.default.render({ model, el: document.getElementById("out") });
document.body.dataset.host = "1";
</script></body></html>"""


def _js(value: Any) -> str:
    """A JSON literal safe inside an inline <script> (the page holds </script>)."""
    return json.dumps(value).replace("</", "<\\/").replace("\u2028", "\\u2028")


def _host(tmp_path: Path, w: Any) -> Path:
    state = {"_page": w._page, "layer": w.layer, "head": w.head, "height": 700}
    doc = HOST % {"esm": _js(w._esm), "state": _js(state)}
    return atomic_write_text(tmp_path / "host.html", doc)


@pytest.mark.browser
def test_the_widget_renders_the_viewer_and_layer_and_head_sync_both_ways(
    tmp_path: Path, open_page: Any
) -> None:
    w = idw.viewer_widget(page_html=_page(layer=1, head=2))
    w.layer = 2  # set before display: the model's value wins when the page loads
    loaded = open_page(_host(tmp_path, w), wait_ready=False)
    page = loaded.page
    page.wait_for_function("() => document.body.dataset.host === '1'", timeout=15_000)
    frame = page.frame_locator("iframe.idf-viewer-frame")
    frame.locator("body[data-ready='1']").wait_for(timeout=15_000)
    layer_sel = frame.locator("select[data-part='layer']")
    head_sel = frame.locator("select[data-part='head']")
    status = frame.locator("[data-part='head-status']")
    page.wait_for_function("() => true")
    frame.locator("canvas[data-part='map-raw']").wait_for(timeout=15_000)
    # the sandbox is kept: the frame's page is not reachable from the host
    assert page.evaluate("() => document.querySelector('iframe').getAttribute('sandbox')") == (
        "allow-scripts"
    )
    assert page.evaluate("() => document.querySelector('iframe').contentDocument") is None
    _until(lambda: layer_sel.input_value() == "2")
    _until(lambda: status.inner_text().startswith("layer 2, head 2"))
    # Python → page: the model's layer changes (as a traitlet change arrives)
    page.evaluate("() => window.fakeModel.set('layer', 0)")
    _until(lambda: layer_sel.input_value() == "0")
    _until(lambda: status.inner_text().startswith("layer 0, head 2"))
    # page → Python: the viewer's own selector, then its head grid
    head_sel.select_option("3")
    _until(lambda: page.evaluate("() => window.fakeModel.get('head')") == 3)
    assert page.evaluate("() => window.saved.at(-1)") == {"layer": 0, "head": 3}
    frame.locator("td[data-layer='1'][data-head='1']").click()
    _until(lambda: page.evaluate("() => window.saved.at(-1)") == {"layer": 1, "head": 1})
    assert page.evaluate("() => window.fakeModel.get('layer')") == 1
    assert loaded.console_errors == [] and loaded.dialogs == []
    assert loaded.requests == [], "the widget tried to use the network"
    loaded.screenshot("widget-viewer.png")


def _until(check: Any, timeout: float = 10.0) -> None:
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.05)
    assert check()
