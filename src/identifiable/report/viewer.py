"""The offline attention viewer: one self-contained HTML page for one text.

`viewer_html` turns plain tensors into the page (testable without a model);
`identifiable.viewer.build_viewer` runs a model and the attention analysis and calls it
(report/ renders only, so it imports nothing above it).
What is stored and why the page stays small is explained in `viewer_data`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from identifiable.report.html import data_script, h, page
from identifiable.report.viewer_data import (
    IntervalRow,
    encode_heads,
    interval_json,
)

DEFAULT_MAX_BYTES = 9_000_000
DEFAULT_MAX_ROWS = 16
DEFAULT_INTERVAL_SECONDS = 30.0

NOT_A_DISTRIBUTION = (
    "Effective attention is not a probability distribution: its entries can be negative "
    "and its rows need not sum to 1. It is the part of the attention that changes the "
    "head's output; null attention is the part that does not."
)


def viewer_html(
    *,
    tokens: Sequence[str],
    raw: torch.Tensor,
    effective: torch.Tensor,
    null_dims: torch.Tensor,
    head_dim: int,
    intervals: Sequence[IntervalRow] = (),
    layer: int = 0,
    head: int = 0,
    is_causal: bool = False,
    model_name: str = "",
    variant: str = "paper",
    max_bytes: int = DEFAULT_MAX_BYTES,
    interval_note: str = "",
) -> str:
    """Build the viewer page.

    tokens: n strings (escaped in the page). raw, effective: `[L, H, n, n]`.
    null_dims: `[L, H]` ints, dim LN(T) per head (last row for causal heads).
    intervals: precomputed rows (any heads). layer, head: initially shown head.
    """
    n_layers, n_heads, n = int(raw.shape[0]), int(raw.shape[1]), int(raw.shape[2])
    if raw.shape != effective.shape or raw.shape[2] != raw.shape[3] or len(tokens) != n:
        raise ValueError(
            f"shapes disagree: raw {tuple(raw.shape)}, effective {tuple(effective.shape)}, {len(tokens)} tokens"
        )
    if tuple(null_dims.shape) != (n_layers, n_heads):
        raise ValueError(
            f"null_dims must be [L, H] = [{n_layers}, {n_heads}], got {tuple(null_dims.shape)}"
        )
    heads, omitted = encode_heads(
        raw, effective, layer=layer, head=head, max_bytes=max_bytes, causal=is_causal
    )
    data: dict[str, Any] = {
        "model": model_name,
        "tokens": [str(t) for t in tokens],
        "n": n,
        "layers": n_layers,
        "heads": n_heads,
        "head_dim": int(head_dim),
        "causal": bool(is_causal),
        "variant": variant,
        "start": [int(layer), int(head)],
        "null_dims": [[int(v) for v in row] for row in null_dims.tolist()],
        "matrices": heads,
        "omitted": [list(p) for p in omitted],
        "intervals": {f"{r.layer},{r.head},{r.row}": interval_json(r) for r in intervals},
        "interval_note": interval_note,
    }
    title = f"Attention viewer: {model_name}" if model_name else "Attention viewer"
    body = [
        h(
            "header",
            h("h1", title),
            h(
                "p",
                f"{n} tokens · {n_layers} layers × {n_heads} heads · head width d_v = {head_dim} "
                f"(attention is not identifiable once a head sees more than {head_dim} tokens) · "
                f"effective-attention variant: {variant}",
                class_="meta",
            ),
            h("p", NOT_A_DISTRIBUTION, class_="warning", id="not-distribution"),
        ),
        _controls(),
        h(
            "div",
            h(
                "section",
                h("h2", "Null-space dimension per head"),
                h(
                    "p",
                    "dim LN(T): how many independent directions attention can move without changing "
                    "the head's output (0 = identifiable). Click a cell to show that head; italic cells "
                    "are stored as coarse previews to keep the page small.",
                    class_="note",
                ),
                h("table", id="null-grid", class_="grid"),
                id="overview",
            ),
            h(
                "section",
                h(
                    "div",
                    _map("raw", "Raw attention A"),
                    _map("effective", "Effective attention A_eff"),
                    _map("null", "Null attention A − A_eff"),
                    class_="maps",
                ),
                h(
                    "p",
                    "Hover over a cell for its values; click a row to choose that query token.",
                    class_="note",
                ),
                h("div", "\u00a0", id="hover", class_="readout"),
                id="heatmaps",
            ),
            class_="top",
        ),
        h(
            "section",
            h("h2", "Tokens"),
            h("p", "Click a token to choose it as the query row.", class_="note"),
            h("div", id="tokens", class_="tokens"),
        ),
        h(
            "section",
            h("h2", "Attention intervals and witness for the chosen row"),
            h(
                "div",
                h("p", "Click a query token to see its intervals.", class_="note"),
                id="interval-panel",
            ),
            id="intervals",
        ),
        data_script("viewer-data", data),
    ]
    return page(title, body, styles=["base.css", "viewer.css"], scripts=["viewer.js"])


def _controls() -> Any:
    return h(
        "section",
        h("label", "Layer ", h("select", id="layer")),
        h("label", "Head ", h("select", id="head")),
        h("span", id="head-status", class_="note"),
        id="controls",
        class_="controls",
    )


def _map(kind: str, caption: str) -> Any:
    return h(
        "figure",
        h("canvas", id=f"map-{kind}", width="300", height="300", data_kind=kind),
        h("figcaption", caption),
        class_="map",
    )


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
