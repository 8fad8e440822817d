"""The attention viewer as an interactive notebook widget (anywidget), with no CDN.

`viewer_widget(model, text)` builds the self-contained viewer page (`build_viewer`, the
same page `identifiable view` writes) and shows it in a sandboxed `<iframe srcdoc>`
(`sandbox="allow-scripts"`: an opaque origin, the page's own Content-Security-Policy,
no network). The widget's `layer` and `head` traitlets follow the page both ways: set
`w.layer = 3` in Python and the page shows layer 3; choose a head in the page (its
selectors or its head grid) and `w.head` changes.

How the two talk without touching the viewer's script: a small bridge script is added to
the page (its hash joins the page's CSP `script-src`, so nothing else may run). It finds
the viewer's layer and head selectors (`select[data-part=layer|head]`), sets them and
sends them their `change` event when the host asks, and posts the page's layer and head
to the host whenever they change. The host side is the widget's ES module (`ESM`):
it talks to the frame by `postMessage`, and only to its own frame's window.
Layers and heads are numbered from 0, as everywhere in identifiable.
Install with the extra `pip install identifiable[widget]` (anywidget, ipywidgets).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from typing import Any

from identifiable.errors import IdentifiableError
from identifiable.utils.checks import count, expect
from identifiable.viewer.page import read_viewer_data

__all__ = ["BRIDGE", "ESM", "bridged_page", "viewer_widget"]  # and ViewerWidget, built on use

# Inside the page: the viewer's selectors ↔ messages to and from the host (parent window).
BRIDGE = """(() => {
  const root = document.querySelector(".idf-viewer");
  if (!root) return;
  const part = (p) => root.querySelector('select[data-part="' + p + '"]');
  let last = "", started = false;  // nothing is posted before the viewer is ready
  function post(ready) {
    if (!ready && !started) return;
    started = true;
    const ls = part("layer"), hs = part("head");
    if (!ls || !hs || ls.value === "" || hs.value === "") return;
    const msg = { idfViewer: 1, layer: +ls.value, head: +hs.value, ready: !!ready };
    const key = msg.layer + "," + msg.head;
    if (!ready && key === last) return;
    last = key;
    window.parent.postMessage(msg, "*");
  }
  window.addEventListener("message", (e) => {
    const m = e.data;
    if (e.source !== window.parent || !m || m.idfSet !== 1) return;
    for (const k of ["layer", "head"]) {
      const s = part(k);
      if (s && Number.isInteger(m[k]) && s.value !== String(m[k])) {
        s.value = String(m[k]);
        s.dispatchEvent(new Event("change", { bubbles: true }));
      }
    }
  });
  // the viewer's own choices (its selectors, its head grid) change the status line
  new MutationObserver(() => post(false)).observe(root, { subtree: true, childList: true, characterData: true });
  document.addEventListener("change", () => post(false));
  const ready = () => { if (document.body.dataset.ready === "1") post(true); else setTimeout(ready, 50); };
  ready();
})();"""

# The host side, the widget's ES module: one sandboxed frame per view.
ESM = """function render({ model, el }) {
  const frame = document.createElement("iframe");
  frame.setAttribute("sandbox", "allow-scripts");
  frame.setAttribute("referrerpolicy", "no-referrer");
  frame.setAttribute("title", "Attention viewer");
  frame.className = "idf-viewer-frame";
  frame.style.width = "100%";
  frame.style.border = "1px solid #d7dce2";
  const size = () => { frame.style.height = model.get("height") + "px"; };
  size();
  frame.srcdoc = model.get("_page");
  el.appendChild(frame);
  const send = () => {
    if (frame.contentWindow) {
      frame.contentWindow.postMessage({ idfSet: 1, layer: model.get("layer"), head: model.get("head") }, "*");
    }
  };
  function onMessage(e) {
    const m = e.data;
    if (e.source !== frame.contentWindow || !m || m.idfViewer !== 1) return;
    if (m.ready) { send(); return; }  // the model's values win when the page has just loaded
    if (m.layer !== model.get("layer") || m.head !== model.get("head")) {
      model.set("layer", m.layer);
      model.set("head", m.head);
      model.save_changes();
    }
  }
  window.addEventListener("message", onMessage);
  model.on("change:layer", send);
  model.on("change:head", send);
  model.on("change:height", size);
  model.on("change:_page", () => { frame.srcdoc = model.get("_page"); });
  return () => window.removeEventListener("message", onMessage);
}
export default { render };
"""

_SCRIPT_SRC = re.compile(r"(script-src )(&#x27;sha256-[A-Za-z0-9+/=]+&#x27;)")


def bridged_page(page_html: str) -> str:
    """`page_html` (a complete viewer page, as `viewer_html` or `build_viewer` return) with
    the bridge script added and allowed by the page's CSP (by its SHA-256 hash)."""
    if not page_html.lstrip().lower().startswith("<!doctype html") or "</body>" not in page_html:
        raise IdentifiableError(
            "the viewer widget takes a complete viewer page, such as build_viewer or "
            "viewer_html returns"
        )
    if not read_viewer_data(page_html):
        raise IdentifiableError("the page holds no viewer; build it with build_viewer(model, text)")
    digest = base64.b64encode(hashlib.sha256(BRIDGE.encode("utf-8")).digest()).decode("ascii")
    page, count = _SCRIPT_SRC.subn(rf"\1\2 &#x27;sha256-{digest}&#x27;", page_html, count=1)
    if count != 1:
        raise IdentifiableError(
            "the viewer page has no hash-based script-src in its Content-Security-Policy; "
            "the widget cannot add its bridge (report this as a bug)"
        )
    head, _, tail = page.rpartition("</body>")
    return f"{head}<script>{BRIDGE}</script></body>{tail}"


@functools.cache
def _widget_class() -> type:
    try:
        import anywidget
        import traitlets
    except ImportError:
        raise IdentifiableError(
            "the viewer widget needs anywidget: pip install identifiable[widget] (or use "
            "IPython.display.HTML(identifiable.viewer_iframe(page)), which needs nothing)"
        ) from None

    class ViewerWidget(anywidget.AnyWidget):  # type: ignore[misc]
        """The viewer in a notebook; `layer`, `head` (0-based) follow the page both ways."""

        _esm = traitlets.Unicode(ESM).tag(sync=True)
        _page = traitlets.Unicode("").tag(sync=True)
        layer = traitlets.Int(0).tag(sync=True)
        head = traitlets.Int(0).tag(sync=True)
        height = traitlets.Int(1000).tag(sync=True)

        def __init__(self, page_html: str, **kwargs: Any) -> None:
            data = read_viewer_data(page_html)
            page = bridged_page(page_html)
            self._sizes = _sizes(data[0])
            start = data[0].get("start") or [0, 0]
            kwargs.setdefault("layer", int(start[0]))
            kwargs.setdefault("head", int(start[1]))
            super().__init__(_page=page, **kwargs)

        @traitlets.validate("layer", "head")
        def _check(self, proposal: Any) -> int:
            name, value = proposal["trait"].name, int(proposal["value"])
            size = self._sizes[0 if name == "layer" else 1]
            if not 0 <= value < size:
                raise IdentifiableError(
                    f"{name} must be in 0..{size - 1} (the page has {size} {name}s), got {value}"
                )
            return value

    ViewerWidget.__qualname__ = "ViewerWidget"
    ViewerWidget.__module__ = __name__
    return ViewerWidget


def _sizes(data: dict[str, Any]) -> tuple[int, int]:
    """(layers, heads) of a viewer page's data island."""
    dims = data.get("null_dims") or [[0]]
    return len(dims), len(dims[0])


def __getattr__(name: str) -> Any:
    if name == "ViewerWidget":  # built on first use: anywidget is an optional extra
        return _widget_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def viewer_widget(
    model: Any = None,
    text: Any = None,
    *,
    page_html: str | None = None,
    height: int = 1000,
    **options: Any,
) -> Any:
    """The viewer of `text` through `model` as a notebook widget (`ViewerWidget`).

    Args:
        model: a loaded `Model`, as for `build_viewer`.
        text: a text or a pair, as for `build_viewer`.
        page_html: a viewer page you already built (`build_viewer`, `viewer_html`) instead.
        height: the frame's height in CSS pixels (a traitlet: change it later).
        options: `ViewerOptions` fields for `build_viewer` (layer=, head=, mixing=, …).
    Display it as the last expression of a cell; `w.layer`, `w.head` follow the page.
    """
    if (page_html is None) == (model is None):
        raise IdentifiableError(
            "viewer_widget takes a model and a text (viewer_widget(model, text)) or page_html= "
            "(a page from build_viewer or viewer_html), not both"
        )
    count(height, "height")
    if page_html is None:
        if text is None:
            raise IdentifiableError("viewer_widget(model, text) needs the text to show")
        from identifiable.viewer.build import build_viewer

        page_html = build_viewer(model, text, **options)
    expect(page_html, str, "page_html", "a viewer page (build_viewer, viewer_html)")
    return _widget_class()(page_html, height=height)
