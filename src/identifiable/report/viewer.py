"""The offline attention viewer: one self-contained HTML page for one text.

`viewer_html` turns plain tensors into the page (testable without a model);
`build_viewer` runs a model and the attention analysis and calls it.
What is stored and why the page stays small is explained in `viewer_data`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from identifiable.errors import IdentifiableError
from identifiable.report.html import data_script, h, page
from identifiable.report.viewer_data import (
    IntervalRow,
    choose_rows,
    encode_heads,
    interval_json,
    spread_order,
)

if TYPE_CHECKING:
    from identifiable.models.trace import Trace

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


def build_viewer(
    model: Any,
    text: str | tuple[str, str],
    *,
    layer: int = 0,
    head: int = 0,
    rows: Sequence[int] | None = None,
    max_rows: int = DEFAULT_MAX_ROWS,
    variant: str = "paper",
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> str:
    """Trace `text` with `model` and build the viewer page for it."""
    trace: Trace = model.trace(text)
    return viewer_html_for_trace(
        trace,
        layer=layer,
        head=head,
        rows=rows,
        max_rows=max_rows,
        variant=variant,
        max_bytes=max_bytes,
    )


def viewer_html_for_trace(
    trace: Trace,
    *,
    layer: int = 0,
    head: int = 0,
    rows: Sequence[int] | None = None,
    max_rows: int = DEFAULT_MAX_ROWS,
    variant: str = "paper",
    max_bytes: int = DEFAULT_MAX_BYTES,
    interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
) -> str:
    """The viewer page for a trace.

    Intervals and witnesses (one LP per key and bound, so costly for long texts) are
    computed for `rows` of the chosen head, or for up to `max_rows` rows spread over the
    text, in an order that keeps them spread, until `interval_seconds` have passed
    (at least one row is always done). The page lists the rows covered.
    """
    from identifiable import attention

    if max_bytes < 1_000_000:
        raise IdentifiableError(
            f"the page size limit must be at least 1 MB, got {max_bytes / 1e6:.2f} MB"
        )
    trace.check_layer(layer)
    trace.check_head(head)
    for r in rows or ():
        trace.check_row(r)
    factors = attention.compute_head_factors(trace)
    result = attention.effective_attention(trace, variant=variant, factors=factors)  # type: ignore[arg-type]
    chosen = choose_rows(trace.n_tokens, rows, max_rows)
    deadline = time.perf_counter() + interval_seconds
    intervals: list[IntervalRow] = []
    for r in chosen if rows else spread_order(chosen):
        if intervals and time.perf_counter() > deadline:
            break
        intervals.append(_interval_row(trace, layer, head, r, factors))
    done = sorted(iv.row for iv in intervals)
    note = (
        f"Intervals were precomputed for layer {layer}, head {head}, rows {_ranges(done)}"
        + (f" (stopped after {interval_seconds:g} s)" if len(done) < len(chosen) else "")
        + ". For another head or row run: identifiable view TEXT --layer L --head H --rows I,J"
    )
    return viewer_html(
        tokens=trace.tokens,
        raw=trace.attentions,
        effective=result.effective,
        null_dims=_null_dims(result),
        head_dim=trace.head_dim,
        intervals=intervals,
        layer=layer,
        head=head,
        is_causal=trace.is_causal,
        model_name=trace.model_name,
        variant=variant,
        max_bytes=max_bytes,
        interval_note=note,
    )


def _null_dims(result: Any) -> torch.Tensor:
    """`[L, H]` null-space dimension per head for the variant shown (causal: the last row's)."""
    ns = result.null_space
    dims = ns.dim if result.variant == "paper" else ns.dim_stochastic
    return dims[..., -1]


def _interval_row(trace: Trace, layer: int, head: int, row: int, factors: Any) -> IntervalRow:
    from identifiable import attention

    iv = attention.attention_intervals(trace, layer, head, row, factors=factors)
    wit = attention.witness(trace, layer, head, row, factors=factors)
    note = "" if wit.exists else f"No witness: {wit.reason}."
    return IntervalRow(
        layer,
        head,
        row,
        iv.raw.numpy(),
        iv.lower.numpy(),
        iv.upper.numpy(),
        None if wit.weights is None else wit.weights.numpy(),
        note,
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
