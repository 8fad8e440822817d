"""Viewers embedded in a host page: two iframes, two inline fragments, no leaks either way.

Every request the browser makes is routed through a guard that records it and aborts
anything that is not the local file itself, so a page that tried to reach the network
would fail here even if the request never got an answer.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from identifiable.report.html import asset
from identifiable.store.files import atomic_write_text
from identifiable.viewer.page import (
    read_viewer_data,
    viewer_fragment,
    viewer_html,
    viewer_iframe,
)
from viewer.test_viewer_browser import CANVAS_STATS, HOSTILE, P, synthetic_args

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"

HOST_HEAD = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>host</title></head>
<body>
<h1 id="host-title">A notebook</h1>
<table id="host-table"><tr><td>host cell</td></tr></table>
<p id="host-text">Text of the host page.</p>
"""
HOST_TAIL = "\n</body></html>\n"

# What a host page looks like without any viewer: the viewer must not change it.
HOST_STYLE = """() => {
  const pick = (id, props) => {
    const s = getComputedStyle(document.getElementById(id));
    return props.map((p) => s.getPropertyValue(p));
  };
  const body = getComputedStyle(document.body);
  return {
    body: [body.margin, body.fontFamily, body.fontSize, body.backgroundColor, body.maxWidth],
    h1: pick("host-title", ["font-size", "margin-top", "border-bottom-style"]),
    table: pick("host-table", ["border-collapse", "font-size", "margin-top"]),
    td: getComputedStyle(document.querySelector("#host-table td")).getPropertyValue("border-top-style"),
    text: pick("host-text", ["color", "font-size", "box-sizing"]),
  };
}"""


@dataclass
class Guarded:
    page: Any
    blocked: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)


@pytest.fixture
def guarded(browser: Any) -> Iterator[Any]:
    """`guarded(path)` opens a file with every non-local request recorded and aborted."""
    contexts = []

    def _open(path: Path) -> Guarded:
        ctx = browser.new_context(viewport={"width": 1300, "height": 900})
        contexts.append(ctx)
        page = ctx.new_page()
        g = Guarded(page)

        def route(r: Any) -> None:
            url = r.request.url
            if url.startswith(("file:", "data:", "blob:", "about:")):
                r.continue_()
            else:
                g.blocked.append(url)
                r.abort()

        ctx.route("**/*", route)
        page.on(
            "requestfailed", lambda r: g.blocked.append(r.url) if r.url not in g.blocked else None
        )
        page.on("console", lambda m: g.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: g.errors.append(f"uncaught: {e}"))

        def on_dialog(d: Any) -> None:
            g.dialogs.append(d.message)
            d.dismiss()

        page.on("dialog", on_dialog)
        page.goto(path.resolve().as_uri())
        return g

    yield _open
    for ctx in contexts:
        ctx.close()


def host_page(tmp_path: Path, name: str, *parts: str) -> Path:
    return atomic_write_text(tmp_path / name, HOST_HEAD + "\n".join(parts) + HOST_TAIL)


def two_datasets() -> tuple[dict[str, Any], dict[str, Any]]:
    first = synthetic_args(model_name="first model", row=3)
    second = synthetic_args(model_name="second model", seed=1, layer=0, head=0)
    second["tokens"] = [f"tok{i}" for i in range(len(HOSTILE))]
    return first, second


def test_the_guard_catches_a_request(tmp_path: Path, guarded: Any) -> None:
    # The network check must be able to fail: a host page that fetches is caught.
    leak = '<img src="http://203.0.113.7/pixel.png" alt="">'
    g = guarded(host_page(tmp_path, "leak.html", leak))
    g.page.wait_for_load_state("load")
    assert g.blocked == ["http://203.0.113.7/pixel.png"]


def test_two_iframes_on_one_page_both_render(tmp_path: Path, guarded: Any) -> None:
    first, second = two_datasets()
    frames_html = [viewer_iframe(viewer_html(**first)), viewer_iframe(viewer_html(**second))]
    g = guarded(host_page(tmp_path, "iframes.html", *frames_html))
    page = g.page
    before = page.evaluate(HOST_STYLE)
    assert page.locator("iframe[sandbox='allow-scripts']").count() == 2
    frames = [page.frame_locator("iframe").nth(k) for k in range(2)]
    for fl in frames:
        fl.locator("body[data-ready='1']").wait_for(timeout=15_000)
    titles = [fl.locator("h1").inner_text() for fl in frames]
    assert titles == ["Attention viewer: first model", "Attention viewer: second model"]
    children = [f for f in page.frames if f != page.main_frame]
    assert len(children) == 2
    for frame in children:
        # each frame carries the page's own CSP and draws its own maps
        assert frame.locator("meta[http-equiv='Content-Security-Policy']").count() == 1
        for kind in ("raw", "effective", "null"):
            assert frame.evaluate(CANVAS_STATS, P(f"map-{kind}")) > 3, f"{kind} blank in a frame"
    # the first viewer opens on its preselected row; the second has none
    assert "query 3" in frames[0].locator(P("interval-panel")).inner_text()
    assert "Click a query token" in frames[1].locator(P("interval-panel")).inner_text()
    # the frames are independent: a click in the second leaves the first alone
    frames[1].locator(".idf-tokens span[data-index='5']").click()
    assert "query 5 “tok5”" in frames[1].locator(P("interval-panel")).inner_text()
    assert "query 3" in frames[0].locator(P("interval-panel")).inner_text()
    # the sandbox gives the frames an opaque origin: they cannot reach the host document
    assert (
        children[0].evaluate(
            "() => { try { return !!parent.document; } catch (e) { return 'blocked'; } }"
        )
        == "blocked"
    )
    assert page.evaluate(HOST_STYLE) == before
    assert g.blocked == [] and g.errors == [] and g.dialogs == []
    ARTIFACTS.mkdir(exist_ok=True)
    # one picture per frame: Chromium does not paint an off-screen frame into a full-page shot
    for k in range(2):
        page.locator("iframe").nth(k).screenshot(path=str(ARTIFACTS / f"viewer-iframe-{k + 1}.png"))


def test_two_inline_viewers_on_one_page_both_render_and_leave_the_host_alone(
    tmp_path: Path, guarded: Any
) -> None:
    first, second = two_datasets()
    plain = guarded(host_page(tmp_path, "plain.html"))
    host_alone = plain.page.evaluate(HOST_STYLE)
    # the same data twice as well: ids must still differ
    fragments = [viewer_fragment(**first), viewer_fragment(**second), viewer_fragment(**first)]
    g = guarded(host_page(tmp_path, "inline.html", *fragments))
    page = g.page
    roots = page.locator(".idf-viewer")
    assert roots.count() == 3
    page.wait_for_selector(".idf-viewer:nth-of-type(1)[data-ready='1']", timeout=15_000)
    for k in range(3):
        roots.nth(k).and_(page.locator("[data-ready='1']")).wait_for(timeout=15_000)
    ids = page.evaluate("() => [...document.querySelectorAll('[id]')].map((e) => e.id)")
    assert len(ids) == len(set(ids)), "duplicate element ids"
    for k in range(3):
        root = roots.nth(k)
        for kind in ("raw", "effective", "null"):
            sel = f".idf-viewer:nth-of-type({k + 1}) {P(f'map-{kind}')}"
            assert page.evaluate(CANVAS_STATS, sel) > 3, f"viewer {k}: {kind} blank"
        assert root.locator("table.idf-grid td").count() == 12
        assert root.locator(".idf-tokens span").count() == len(HOSTILE)
    assert roots.nth(1).locator(".idf-tokens span").all_inner_texts()[0] == "tok0"
    assert roots.nth(0).locator(".idf-tokens span").all_inner_texts()[1] == HOSTILE[1]
    # preselected row shown at once in the first and third, not in the second
    assert "query 3" in roots.nth(0).locator(P("interval-panel")).inner_text()
    assert "query 3" in roots.nth(2).locator(P("interval-panel")).inner_text()
    # a click in one viewer changes only that viewer
    roots.nth(1).locator(".idf-tokens span[data-index='6']").click()
    assert "query 6 “tok6”" in roots.nth(1).locator(P("interval-panel")).inner_text()
    assert "query 3" in roots.nth(0).locator(P("interval-panel")).inner_text()
    roots.nth(2).locator(P("layer")).select_option(index=2)  # layer 3
    roots.nth(2).locator("table.idf-grid td.idf-current[data-layer='2'][data-head='2']").wait_for()
    current = roots.nth(0).locator("table.idf-grid td.idf-current")
    assert (current.get_attribute("data-layer"), current.get_attribute("data-head")) == ("1", "2")
    # the host page keeps its own look: no global rule of ours reaches it
    assert page.evaluate(HOST_STYLE) == host_alone
    assert page.evaluate("() => document.body.dataset.ready") is None
    assert g.blocked == [] and g.errors == [] and g.dialogs == []
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "viewer-two-inline.png"), full_page=True)


# ---- without a browser ---------------------------------------------------------------


def _selectors(css: str) -> list[str]:
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    return [s.strip() for block in re.findall(r"([^{}]+)\{", css) for s in block.split(",")]


def test_every_viewer_css_rule_is_scoped_to_the_viewer_root() -> None:
    selectors = _selectors(asset("viewer.css"))
    assert len(selectors) > 30
    unscoped = [s for s in selectors if not s.startswith(".idf-viewer")]
    assert unscoped == []
    # the check itself can fail: the report's base stylesheet is global on purpose
    assert any(not s.startswith(".idf-viewer") for s in _selectors(asset("base.css")))


def test_iframe_escapes_the_page_into_srcdoc() -> None:
    page = viewer_html(**synthetic_args())
    frame = viewer_iframe(page, height=700)
    match = re.fullmatch(r'<iframe srcdoc="([^"]*)" sandbox="allow-scripts" [^>]*></iframe>', frame)
    assert match, frame[:200]
    srcdoc = match.group(1)
    assert "<" not in srcdoc and ">" not in srcdoc and "'" not in srcdoc
    assert html.unescape(srcdoc) == page
    assert "height: 700px" in frame
    with pytest.raises(ValueError, match="complete HTML page"):
        viewer_iframe(viewer_fragment(**synthetic_args()))


def test_ids_are_unique_per_instance_and_pages_are_reproducible() -> None:
    args = synthetic_args()
    a, b = viewer_fragment(**args), viewer_fragment(**args)
    ids_a = set(re.findall(r' id="([^"]+)"', a))
    ids_b = set(re.findall(r' id="([^"]+)"', b))
    assert ids_a and not ids_a & ids_b
    assert viewer_html(**args) == viewer_html(**args)  # a page is byte-for-byte reproducible
    page_ids = re.findall(r' id="([^"]+)"', viewer_html(**args))
    assert len(page_ids) == len(set(page_ids)) == 2  # the root and its data island
    other = viewer_html(**synthetic_args(seed=3))
    assert set(re.findall(r' id="([^"]+)"', other)).isdisjoint(page_ids)
    assert [d["model"] for d in read_viewer_data(a + b)] == [args["model_name"]] * 2


def test_bad_preselected_row_and_distance_shape_are_refused() -> None:
    with pytest.raises(ValueError, match="row 8 is out of range"):
        viewer_html(**synthetic_args(row=8))
    with pytest.raises(ValueError, match="head_distance"):
        viewer_html(**synthetic_args(head_distance=torch.zeros(2, 4)))
