"""The attention viewer for one text: runs the model and the attention analysis, then
renders the page with `identifiable.report.viewer.viewer_html`.

This sits on the top floor with `cli/`: it computes (trace, effective attention,
intervals and witnesses) and hands plain tensors to the report floor, which only renders.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from identifiable.errors import IdentifiableError
from identifiable.report.viewer import (
    DEFAULT_INTERVAL_SECONDS,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_ROWS,
    _ranges,
    viewer_html,
)
from identifiable.report.viewer_data import IntervalRow, MixingMaps, choose_rows, spread_order

if TYPE_CHECKING:
    from identifiable.models.trace import Trace


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
    mixing: Sequence[str] = (),
) -> str:
    """Trace `text` with `model` and build the viewer page for it.

    mixing: context-mixing methods (`identifiable.mixing.method_names()`) whose per-layer
    maps the page offers in place of raw, effective and null attention.
    """
    maps = mixing_maps(model, text, mixing)
    trace: Trace = model.trace(text)
    return viewer_html_for_trace(
        trace,
        layer=layer,
        head=head,
        rows=rows,
        max_rows=max_rows,
        variant=variant,
        max_bytes=max_bytes,
        mixing=maps,
    )


def mixing_maps(
    model: Any, text: str | tuple[str, str], methods: Sequence[str]
) -> list[MixingMaps]:
    """Each method's `global_map` (rolled out where the method defines it) for the viewer.

    Unknown names fail in one line before any method runs."""
    from identifiable.mixing import context_mixing, get_method

    names = list(dict.fromkeys(methods))
    for name in names:
        get_method(name)
    out = []
    for name in names:
        res = context_mixing(model, text, name)
        if res.rolled is not None:
            caption = "rolled out from the input to the chosen layer; rows: receiving token"
        elif name in ("grad-input", "erasure", "hta"):
            caption = "from input token j to token i at the chosen layer's output"
        else:
            caption = "the chosen layer alone; rows: receiving token"
        out.append(MixingMaps(name, res.global_map, caption))
    return out


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
    mixing: Sequence[MixingMaps] = (),
) -> str:
    """The viewer page for a trace.

    The page opens on `layer`, `head` and, when `rows` are given, on the first of them, with
    its intervals shown. The head grid is shaded by `head_distance`.

    Intervals and witnesses (one LP per key and bound, so costly for long texts) are
    computed for `rows` of the chosen head, or for up to `max_rows` rows spread over the
    text, in an order that keeps them spread, until `interval_seconds` have passed
    (at least one row is always done). The page lists the rows covered.
    mixing: per-layer maps of context-mixing methods (`mixing_maps`), selectable in the page.
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
        f"Intervals were precomputed for layer {layer + 1} (of 1..{trace.n_layers}), head "
        f"{head}, rows {_ranges(done)}"
        + (f" (stopped after {interval_seconds:g} s)" if len(done) < len(chosen) else "")
        + ". For another head or row run: identifiable view TEXT --layer L --head H --rows I,J"
        f" (L in 1..{trace.n_layers} as printed, H and rows from 0)"
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
        row=int(rows[0]) if rows else None,
        head_distance=head_distance(trace.attentions, result.effective),
        is_causal=trace.is_causal,
        model_name=trace.model_name,
        variant=variant,
        max_bytes=max_bytes,
        interval_note=note,
        mixing=mixing,
    )


def head_distance(raw: torch.Tensor, effective: torch.Tensor) -> torch.Tensor:
    """`[L, H]` float64 ‖A − A_eff‖_F / ‖A‖_F per head, from raw, effective `[L, H, n, n]`.

    0 where the head's attention is identifiable (effective = raw); it grows with the share
    of the attention pattern that lies in the null space, so the viewer's head grid shades
    heads by it. One layer at a time in float64, to bound memory on long texts.
    """
    out = torch.empty(raw.shape[:2], dtype=torch.float64)
    for layer in range(raw.shape[0]):
        a = raw[layer].double().flatten(-2)
        diff = a - effective[layer].double().flatten(-2)
        out[layer] = diff.norm(dim=-1) / a.norm(dim=-1).clamp_min(1e-300)
    return out


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
