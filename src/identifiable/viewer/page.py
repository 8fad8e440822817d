"""The offline attention viewer: one self-contained HTML page for one text (or, for an
image model, one image: a patch grid replaces the token strip, see `PatchGrid`).

`viewer_html` turns plain tensors into the page (testable without a model);
`identifiable.viewer.build.build_viewer` runs a model and the attention analysis and calls it
(report/ renders only, so it imports nothing above it).
What is stored and why the page stays small is explained in `viewer_encoding`.

Three forms of the same viewer:

* `viewer_html`: a complete page with its own Content-Security-Policy (for a file);
* `viewer_iframe(page)`: that page inside a sandboxed `<iframe srcdoc>`, for notebooks and
  other hosts. The frame keeps the page's CSP and styles to itself; this is the form to use
  wherever the host's CSS or CSP is not ours;
* `viewer_fragment`: the viewer as a `<div>` with scoped styles and an inline script, for a
  host page that allows inline scripts. Every element id carries a prefix unique to the
  instance and every CSS rule is scoped to the viewer's root, so several viewers can
  share one page without touching each other or the host.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Sequence
from typing import Any

from identifiable.errors import IdentifiableError
from identifiable.report.html import (
    Markup,
    h,
    inline_style,
    json_for_script,
    png_img,
    script_code,
)
from identifiable.report.html import page as html_page
from identifiable.report.html import raw as raw_markup
from identifiable.results.colormap import SCALE_RULE, page_colormap
from identifiable.utils.checks import count, expect
from identifiable.viewer.encoding import (
    IDENTIFIABLE_BELOW,
    CertifiedHead,
    PatchGrid,
    encode_certified,
    encode_heads,
    encode_mixing,
    interval_json,
    null_fraction,
)
from identifiable.viewer.options import (
    DEFAULT_INTERVAL_SECONDS,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_ROWS,
    ViewerOptions,
    ViewerPage,
)

__all__ = [
    "DEFAULT_INTERVAL_SECONDS",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_ROWS",
    "ViewerOptions",
    "ViewerPage",
    "identifiable_note",
    "read_viewer_data",
    "viewer_fragment",
    "viewer_html",
    "viewer_iframe",
]

NOT_A_DISTRIBUTION = (
    "Effective attention is not a probability distribution: its entries can be negative "
    "and its rows need not sum to 1. It is the part of the attention that changes the "
    "head's output; null attention is the part that does not."
)


def identifiable_note(threshold: float) -> str:
    """What the page's identifiable marks mean, and why the threshold (stated on the page)."""
    return (
        f"Identifiable (green ✓): every valid attention row (non-negative, summing to 1) that "
        f"gives this head the same output gives the weight a value within {threshold:g} of the "
        f"raw one: its interval width upper − lower is below {threshold:g}. "
        + (
            "Why 0.01: it is one percentage point of attention mass, the precision at which "
            "attention weights are read (two decimals), and about 2.5 steps of the 256-level "
            "colour scale of the maps, so rows that differ by less look alike here. "
            if threshold == IDENTIFIABLE_BELOW
            else f"(The default is {IDENTIFIABLE_BELOW:g}, one percentage point of attention "
            "mass.) "
        )
        + "The marks come from the exact bounds, not from the rounded values on the page."
    )


def viewer_html(page: ViewerPage | None = None, /, **fields: Any) -> str:
    """Build the viewer page (a complete HTML document with its own CSP).

    Give a `ViewerPage`, or its fields as keywords, with any `ViewerOptions` field among
    them: `viewer_html(tokens=..., raw=..., effective=..., null_dims=..., head_dim=...,
    layer=2, head=1, row=5)`.
    """
    title, root = _viewer_root(ViewerPage.of(page, fields), standalone=True)
    return html_page(title, root, styles=["viewer.css"], scripts=["viewer.js"])


def viewer_fragment(**kwargs: Any) -> str:
    """The viewer as an HTML fragment for a host page: a root `<div>`, its scoped styles
    and its inline script. Takes the arguments of `viewer_html`.

    The fragment has no CSP of its own (a `<meta>` CSP only works in a document's head) and
    needs a host that runs inline scripts; `viewer_iframe(viewer_html(...))` needs neither.
    Each call gets ids with a fresh prefix, so the same data may be shown twice on one page.
    """
    _, root = _viewer_root(ViewerPage.of(None, kwargs), standalone=False)
    code = script_code(["viewer.js"])
    return str(inline_style("viewer.css") + root + raw_markup(f"<script>{code}</script>"))


def viewer_iframe(page_html: str, *, height: int = 1000, title: str = "Attention viewer") -> str:
    """`page_html` (a complete page such as `viewer_html` returns) inside a sandboxed iframe.

    The page goes into `srcdoc`, attribute-escaped, so the frame needs no file and no network.
    `sandbox="allow-scripts"` lets the viewer's own script run but gives the frame an opaque
    origin: it cannot read the host page, its cookies or its storage, and the page's CSP
    `<meta>` applies inside the frame. Use this form in notebooks (`IPython.display.HTML`).
    height: the frame's height in CSS pixels (the page scrolls inside it).
    """
    expect(page_html, str, "page_html", "a complete HTML page, such as viewer_html returns")
    expect(title, str, "title", "the frame's title")
    count(height, "height")
    if not page_html.lstrip().lower().startswith("<!doctype html"):
        raise IdentifiableError(
            "viewer_iframe takes a complete HTML page, such as viewer_html returns"
        )
    return str(
        h(
            "iframe",
            srcdoc=page_html,
            sandbox="allow-scripts",
            title=title,
            referrerpolicy="no-referrer",
            style=f"width: 100%; height: {int(height)}px; border: 1px solid #d7dce2;",
            class_="idf-viewer-frame",
        )
    )


def read_viewer_data(html: str) -> list[dict[str, Any]]:
    """The data islands of every viewer in `html` (a page, fragment or host page), in order.

    For tests and benchmarks: what the page's script reads. An iframe's page is inside an
    escaped attribute and is not found here; pass the page itself.
    """
    return [
        json.loads(m.group(1))
        for m in re.finditer(
            r'<script type="application/json" class="idf-viewer-data" id="[^"]*">(.*?)</script>',
            html,
            re.S,
        )
    ]


_instances = itertools.count(1)


def _check_page(p: ViewerPage) -> None:
    """Shapes and options that disagree: one line naming them."""
    raw, o = p.raw, p.options
    n_layers, n_heads, n = int(raw.shape[0]), int(raw.shape[1]), int(raw.shape[2])
    if raw.shape != p.effective.shape or raw.shape[2] != raw.shape[3] or len(p.tokens) != n:
        raise IdentifiableError(
            f"shapes disagree: raw {tuple(raw.shape)}, effective {tuple(p.effective.shape)}, "
            f"{len(p.tokens)} tokens"
        )
    if tuple(p.null_dims.shape) != (n_layers, n_heads):
        raise IdentifiableError(
            f"null_dims must be [L, H] = [{n_layers}, {n_heads}], got {tuple(p.null_dims.shape)}"
        )
    if p.head_distance is not None and tuple(p.head_distance.shape) != (n_layers, n_heads):
        raise IdentifiableError(
            f"head_distance must be [L, H] = [{n_layers}, {n_heads}], "
            f"got {tuple(p.head_distance.shape)}"
        )
    row = o.rows[0] if o.rows else None
    if row is not None and not 0 <= row < n:
        raise IdentifiableError(f"row {row} is out of range: valid rows are 0..{n - 1}")
    names = [m.name for m in p.mixing]
    if len(set(names)) != len(names):
        raise IdentifiableError(f"mixing methods must have distinct names, got {names}")
    for m in p.mixing:
        if tuple(m.maps.shape) != (n_layers, n, n):
            raise IdentifiableError(
                f"mixing maps of {m.name!r} must be [L, n, n] = [{n_layers}, {n}, {n}], "
                f"got {tuple(m.maps.shape)}"
            )
    if p.certified is not None:
        _check_certified(p.certified, n_layers, n_heads, n)
    if p.patches is not None:
        _check_patches(p.patches, n)


def _page_data(p: ViewerPage, image: Markup | None) -> dict[str, Any]:
    """The JSON island the page's script reads: everything it draws, encoded to fit
    `max_bytes` (less the image's bytes): mixing maps first, certified rows, then heads."""
    o, raw, causal = p.options, p.raw, p.is_causal
    n_layers, n_heads, n = int(raw.shape[0]), int(raw.shape[1]), int(raw.shape[2])
    threshold = float(p.certified.threshold) if p.certified is not None else IDENTIFIABLE_BELOW
    max_bytes = o.max_bytes - len(image or "")
    mixing_data, mixing_bytes = encode_mixing(p.mixing, max_bytes=max_bytes // 3, causal=causal)
    certified_data, certified_bytes = encode_certified(
        p.certified, max_bytes=(max_bytes - mixing_bytes) // 3
    )
    heads, omitted = encode_heads(
        raw,
        p.effective,
        layer=o.layer,
        head=o.head,
        max_bytes=max_bytes - mixing_bytes - certified_bytes,
        causal=causal,
    )
    # The head grid shows each head's null fraction: given, or computed from the maps here.
    distance = p.head_distance if p.head_distance is not None else null_fraction(raw, p.effective)
    return {
        "model": p.model_name,
        "tokens": [str(t) for t in p.tokens],
        "n": n,
        "layers": n_layers,
        "heads": n_heads,
        "head_dim": int(p.head_dim),
        "causal": bool(causal),
        "variant": o.variant,
        "start": [int(o.layer), int(o.head)],
        "start_row": int(o.rows[0]) if o.rows else None,
        "null_dims": [[int(v) for v in r] for r in p.null_dims.tolist()],
        "distance": [[round(float(v), 6) for v in r] for r in distance.tolist()],
        "matrices": heads,
        "omitted": [list(q) for q in omitted],
        "intervals": {
            f"{r.layer},{r.head},{r.row}": interval_json(r, threshold=threshold)
            for r in p.intervals
        },
        "threshold": threshold,
        "interval_note": p.interval_note,
        "mixing": mixing_data,
        "certified": certified_data,
        "patches": None if p.patches is None else _patches_json(p.patches),
        "colormap": page_colormap(),
    }


def _patches_json(patches: PatchGrid) -> dict[str, Any]:
    return {
        "rows": int(patches.rows),
        "cols": int(patches.cols),
        "cells": [int(k) for k in patches.patches],
        "special": [int(k) for k in patches.special],
        "image": patches.image_png is not None,
    }


def _viewer_root(p: ViewerPage, *, standalone: bool) -> tuple[str, Markup]:
    """(title, the page's root `<div>`) for `p`."""
    _check_page(p)
    image = None
    if p.patches is not None and p.patches.image_png is not None:
        image = png_img(p.patches.image_png, "")
    data = _page_data(p, image)
    # Ids: derived from the content (a page is byte-for-byte reproducible); a fragment adds
    # a per-process counter so that two fragments of the same data still differ.
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode("utf-8")).hexdigest()[:10]
    uid = f"idv-{digest}" if standalone else f"idv-{digest}-{next(_instances)}"
    title = f"Attention viewer: {p.model_name}" if p.model_name else "Attention viewer"
    root = h(
        "div",
        _header(title, data),
        _controls(),
        h(
            "div",
            _overview(),
            _heatmaps(p.certified),
            class_="idf-top",
        ),
        h(
            "section",
            h("h2", "Tokens"),
            h("p", "Click a token to choose it as the query row.", class_="idf-note"),
            h("div", class_="idf-tokens", data_part="tokens"),
        )
        if p.patches is None
        else _patch_section(p.patches, p.tokens, image),
        h(
            "section",
            h("h2", "Attention intervals and witness for the chosen row"),
            h(
                "div",
                h("p", "Click a query token to see its intervals.", class_="idf-note"),
                data_part="interval-panel",
            ),
        ),
        Markup(
            f'<script type="application/json" class="idf-viewer-data" id="{uid}-data">'
            f"{json_for_script(data)}</script>"
        ),
        class_="idf-viewer",
        id=uid,
        data_standalone="1" if standalone else None,
    )
    return title, root


def _header(title: str, data: dict[str, Any]) -> Any:
    n, head_dim = data["n"], data["head_dim"]
    return h(
        "header",
        h("h1", title),
        h(
            "p",
            f"{n} tokens · {data['layers']} layers × {data['heads']} heads · head width "
            f"d_v = {head_dim} (attention is not identifiable once a head sees more than "
            f"{head_dim} tokens) · effective-attention variant: {data['variant']}",
            class_="idf-meta",
        ),
        h("p", NOT_A_DISTRIBUTION, class_="idf-warning", data_part="not-distribution"),
    )


def _overview() -> Any:
    grid_note = (
        "Each cell: the head's null fraction for this text, ‖A − A_eff‖_F / ‖A‖_F, the share "
        "of its attention that does not change the head's output (0 = none; shade: white 0 "
        "to dark, the largest here)."
    )
    return h(
        "section",
        h("h2", "Heads: null fraction ‖A − A_eff‖ / ‖A‖"),
        h(
            "p",
            grid_note + " Click a cell to show that head; italic cells are stored as "
            "coarse previews to keep the page small.",
            class_="idf-note",
        ),
        h("table", class_="idf-grid", data_part="null-grid"),
        h("p", class_="idf-note", data_part="grid-legend"),
        h("p", class_="idf-note", data_part="null-dims-note"),
        class_="idf-overview",
    )


def _heatmaps(certified: CertifiedHead | None) -> Any:
    return h(
        "section",
        h(
            "div",
            _map("raw", "Raw attention A"),
            _map("effective", "Effective attention A_eff"),
            _map("null", "Null attention A − A_eff"),
            _map("constrained", "Constrained attention C (a distribution)"),
            _map("width", "Interval width upper − lower; green: identifiable"),
            _map("mixing", "Context mixing", hidden=True),
            class_="idf-maps",
        ),
        _colour_bar(),
        _certify_notes(certified),
        h(
            "p",
            "Rows are query tokens, columns key tokens. Hover over a cell for its values "
            "and tokens; click a row to choose that query token.",
            class_="idf-note",
            data_part="axis-note",
        ),
        h("div", "\u00a0", class_="idf-readout", data_part="hover"),
        class_="idf-heatmaps",
    )


def _controls() -> Any:
    return h(
        "section",
        h("label", "Map ", h("select", data_part="show")),
        h("label", "Layer ", h("select", data_part="layer")),
        h("label", "Head ", h("select", data_part="head")),
        h("span", class_="idf-note", data_part="head-status"),
        class_="idf-controls",
    )


def _map(kind: str, caption: str, hidden: bool = False) -> Any:
    return h(
        "figure",
        h(
            "div",
            h("div", class_="idf-yaxis", data_part=f"yaxis-{kind}", aria_label="query tokens"),
            h("canvas", width="300", height="300", data_kind=kind, data_part=f"map-{kind}"),
            h("div", class_="idf-xaxis", data_part=f"xaxis-{kind}", aria_label="key tokens"),
            class_="idf-plot",
        ),
        h(
            "figcaption",
            h("span", caption, data_part=f"caption-{kind}"),
            h("span", class_="idf-scale", data_part=f"scale-{kind}"),
        ),
        class_="idf-map",
        data_part=f"figure-{kind}",
        hidden=hidden or None,
    )


def _colour_bar() -> Any:
    return h(
        "div",
        h("span", class_="idf-cb-lo", data_part="colourbar-lo"),
        h("canvas", width="256", height="12", data_part="colourbar"),
        h("span", class_="idf-cb-hi", data_part="colourbar-hi"),
        h(
            "span",
            f"Colour scale of the attention and mixing maps: {SCALE_RULE} (s is in each "
            "map's caption). Interval widths: white 0 to purple, the widest.",
            class_="idf-note",
            data_part="scale-rule",
        ),
        class_="idf-colourbar",
        data_part="colourbar-box",
    )


CONSTRAINED_NOTE = (
    "Constrained attention C is the valid attention row (non-negative, summing to 1) with the "
    "same head output that is closest to uniform, i.e. of least norm; it is also the valid "
    "row closest to the effective attention A_eff. Unlike A_eff it is a distribution. "
    "Intervals: the least and greatest weight each key can take over all valid rows with "
    "the same output."
)


def _certify_notes(certified: CertifiedHead | None) -> Any:
    threshold = certified.threshold if certified is not None else IDENTIFIABLE_BELOW
    return h(
        "div",
        h("p", CONSTRAINED_NOTE, class_="idf-note", data_part="constrained-note"),
        h("p", identifiable_note(threshold), class_="idf-note", data_part="threshold-note"),
        h("p", class_="idf-note", data_part="coverage-note"),
        class_="idf-certify-notes",
    )


PATCH_NOTE = (
    "Click a patch or a special token to choose it as the query; every key cell is then "
    "shaded by the chosen map's weight from that query (its row of the map) at the layer and "
    "head shown. Hover over a cell for its value."
)


def _patch_section(patches: PatchGrid, tokens: Sequence[str], image: Markup | None) -> Any:
    """The patch grid that replaces the token strip for an image model: the special tokens as
    cells of their own, then rows × cols patch cells (each labelled by its token, which names
    its grid position) over the image when there is one. The script shades the cells."""

    def cell(k: int, cls: str, **pos: int) -> Any:
        label = str(tokens[k])
        return h(
            "button",
            label if cls == "idf-special" else None,
            type="button",
            class_=f"idf-patch-cell {cls}",
            data_index=str(k),
            data_label=label,
            title=f"{label} (token {k})",
            aria_label=label,
            **{f"data_{key}": str(v) for key, v in pos.items()},
        )

    grid = [
        cell(k, "idf-patch", row=p // patches.cols, col=p % patches.cols)
        for p, k in enumerate(patches.patches)
    ]
    return h(
        "section",
        h("h2", f"Image patches: {patches.rows} × {patches.cols} grid"),
        h("p", PATCH_NOTE, class_="idf-note", data_part="patch-note"),
        h("label", "Shade by ", h("select", data_part="patch-map"), class_="idf-patch-control"),
        h(
            "div",
            h(
                "div",
                [cell(k, "idf-special") for k in patches.special],
                class_="idf-patch-special",
                data_part="patch-special",
            ),
            h(
                "figure",
                h(
                    "div",
                    image,
                    h("div", grid, class_="idf-patch-grid", data_part="patch-grid"),
                    class_="idf-patch-stage" + (" idf-with-image" if image else ""),
                    style=f"--idf-rows: {int(patches.rows)}; --idf-cols: {int(patches.cols)};",
                ),
                h(
                    "figcaption",
                    patches.image_note
                    if image is not None
                    else "No image was given: the grid alone (pass the image to draw it under "
                    "the grid).",
                    data_part="patch-image-note",
                ),
                class_="idf-patch-figure",
            ),
            class_="idf-patch-box",
        ),
        h(
            "div",
            h("span", class_="idf-cb-lo", data_part="patch-colourbar-lo"),
            h("canvas", width="256", height="12", data_part="patch-colourbar"),
            h("span", class_="idf-cb-hi", data_part="patch-colourbar-hi"),
            class_="idf-colourbar idf-patch-colourbar",
        ),
        h("p", class_="idf-note", data_part="patch-legend"),
        h("div", "\u00a0", class_="idf-readout", data_part="patch-readout"),
        class_="idf-patches",
        data_part="patch-section",
    )


def _check_patches(p: PatchGrid, n: int) -> None:
    cells = [*p.patches, *p.special]
    if p.rows < 1 or p.cols < 1 or len(p.patches) != p.rows * p.cols:
        raise IdentifiableError(
            f"the patch grid must list rows × cols = {p.rows} × {p.cols} patch tokens, "
            f"got {len(p.patches)}"
        )
    if sorted(int(k) for k in cells) != list(range(n)):
        raise IdentifiableError(
            f"the patch grid's patches and special tokens must be the {n} tokens, each once"
        )


def _check_certified(c: CertifiedHead, n_layers: int, n_heads: int, n: int) -> None:
    if not (0 <= c.layer < n_layers and 0 <= c.head < n_heads):
        raise IdentifiableError(
            f"certified head (layer {c.layer}, head {c.head}) is outside the model's "
            f"{n_layers} layers × {n_heads} heads"
        )
    r = int(c.rows.size)
    for name, arr in (
        ("raw", c.raw),
        ("lower", c.lower),
        ("upper", c.upper),
        ("keys", c.keys),
        ("constrained", c.constrained),
    ):
        if arr is not None and tuple(arr.shape) != (r, n):
            raise IdentifiableError(
                f"certified {name} must be [R, n] = [{r}, {n}], got {arr.shape}"
            )
    if c.constrained_rows is not None and tuple(c.constrained_rows.shape) != (r,):
        raise IdentifiableError(f"certified constrained_rows must be [R] = [{r}]")
    if r and (c.rows.min() < 0 or c.rows.max() >= n or len(set(c.rows.tolist())) != r):
        raise IdentifiableError(f"certified rows must be distinct rows in 0..{n - 1}")
    if not 0 < c.threshold < 1:
        raise IdentifiableError(f"the identifiable threshold must be in (0, 1), got {c.threshold}")


def _ranges(rows: Sequence[int]) -> str:
    if not rows:
        return "none"
    parts, start, prev = [], rows[0], rows[0]
    for r in [*rows[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}–{prev}")
        if r is not None:
            start = prev = r
    return ", ".join(parts)
