"""docs/tutorial.ipynb runs top to bottom, and its outputs render offline in Chromium.

The notebook is executed with nbclient in a fresh kernel (the project's own Python). Its
outputs are put on one page the way Jupyter shows them (HTML as is, images as data URIs);
headless Chromium opens that page with every request routed through a guard, so the test
fails on any request that would leave the page, and checks that both viewer frames draw.
"""

from __future__ import annotations

import html
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from identifiable.store.files import atomic_write_text

pytestmark = [pytest.mark.integration, pytest.mark.browser]

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "tutorial.ipynb"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
LOCAL = ("file:", "about:", "data:", "blob:")
CANVAS_STATS = """(c) => {
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  const colours = new Set();
  for (let k = 0; k < d.length; k += 4 * 97) colours.add(d[k] + ',' + d[k + 1] + ',' + d[k + 2]);
  return colours.size;
}"""


@pytest.fixture(scope="module")
def executed() -> tuple[Any, float]:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    start = time.perf_counter()
    NotebookClient(
        nb,
        timeout=240,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    ).execute()
    return nb, time.perf_counter() - start


def _outputs(nb: Any) -> list[dict]:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def test_the_tutorial_runs_and_shows_the_effect(executed) -> None:
    nb, seconds = executed
    outs = _outputs(nb)
    assert not [o for o in outs if o.output_type == "error"]
    text = "".join(
        o.get("text", "") for o in outs if o.output_type == "stream" and o.name == "stdout"
    )
    n, width = map(int, re.search(r"(\d+) tokens; head width (\d+)", text).groups())
    assert n > width == 32  # longer than the head width: null spaces are not empty
    assert int(re.search(r"dim LN\(T\) of layer 0, head 0: (\d+)", text).group(1)) > 0
    assert "moved " in text  # the witness exists
    plain = [o.data.get("text/plain", "") for o in outs if "data" in o]
    assert any(p.startswith("Model('minilm', family='bert', layers=6, heads=12") for p in plain)
    assert any(p.startswith("EffectiveAttention(model='minilm', n_tokens=") for p in plain)
    assert sum("image/png" in o.get("data", {}) for o in outs) >= 2  # two figures drawn
    tables = [o.data["text/html"] for o in outs if "data" in o and "text/html" in o.data]
    assert any("query_token" in t and "key_token" in t for t in tables)  # to_pandas
    assert sum("<iframe" in t for t in tables) == 2
    stderr = "".join(
        o.get("text", "") for o in outs if o.output_type == "stream" and o.name == "stderr"
    )
    assert "Traceback" not in stderr
    print(f"tutorial executed in {seconds:.1f} s", file=sys.stderr)


def _host_page(nb: Any) -> str:
    parts = []
    for o in _outputs(nb):
        data = o.get("data", {})
        if "text/html" in data:
            parts.append(f"<div class='output'>{data['text/html']}</div>")
        elif "image/png" in data:
            parts.append(
                f"<img alt='figure' src='data:image/png;base64,{data['image/png'].strip()}'>"
            )
        elif o.output_type == "stream":
            parts.append(f"<pre>{html.escape(o.text)}</pre>")
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>tutorial</title>"
        "</head><body>" + "\n".join(parts) + "</body></html>"
    )


def test_the_outputs_render_offline_with_two_viewers(executed, browser, tmp_path: Path) -> None:
    nb, _ = executed
    path = atomic_write_text(tmp_path / "tutorial.html", _host_page(nb))
    ctx = browser.new_context(viewport={"width": 1300, "height": 900})
    try:
        page = ctx.new_page()
        requests: list[str] = []
        left: list[str] = []
        errors: list[str] = []

        def route(r: Any) -> None:
            url = r.request.url
            requests.append(url)
            if url.startswith(LOCAL):
                r.continue_()
            else:
                left.append(url)
                r.abort()

        ctx.route("**/*", route)
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
        page.goto(path.as_uri())
        frames = page.locator("iframe.idf-viewer-frame")
        assert frames.count() == 2
        for k in range(2):
            fl = page.frame_locator("iframe.idf-viewer-frame").nth(k)
            fl.locator("body[data-ready='1']").wait_for(timeout=30_000)
        children = [f for f in page.frames if f != page.main_frame]
        assert len(children) == 2
        for frame in children:
            for kind in ("raw", "effective", "null"):
                canvas = frame.locator(f"[data-part='map-{kind}']")
                assert canvas.evaluate(CANVAS_STATS) > 3, f"{kind} map blank in a viewer"
        # the first viewer opens on its preselected row (rows=[row] in the notebook)
        first = page.frame_locator("iframe.idf-viewer-frame").nth(0)
        assert "query 8" in first.locator("[data-part='interval-panel']").inner_text()
        assert page.locator("img[alt='figure']").count() >= 2
        assert page.evaluate(
            "() => [...document.images].every((i) => i.complete && i.naturalWidth > 0)"
        )
        assert requests and requests[0].startswith("file:")
        assert left == [], f"requests left the page: {left}"
        assert errors == []
        ARTIFACTS.mkdir(exist_ok=True)
        for k in range(2):
            frames.nth(k).screenshot(path=str(ARTIFACTS / f"tutorial-viewer-{k + 1}.png"))
    finally:
        ctx.close()


def test_the_request_guard_can_fail(browser, tmp_path: Path) -> None:
    """A page that reaches out is caught by the same guard."""
    path = atomic_write_text(
        tmp_path / "leak.html", "<!DOCTYPE html><img src='http://203.0.113.9/x.png' alt=''>"
    )
    ctx = browser.new_context()
    try:
        left: list[str] = []

        def route(r: Any) -> None:
            if r.request.url.startswith(LOCAL):
                r.continue_()
            else:
                left.append(r.request.url)
                r.abort()

        ctx.route("**/*", route)
        page = ctx.new_page()
        page.goto(path.as_uri())
        page.wait_for_load_state("load")
        assert left == ["http://203.0.113.9/x.png"]
    finally:
        ctx.close()
