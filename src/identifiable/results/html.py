"""`Result._repr_html_`: a headline number, a small inline picture and the arrays' table.

The headline says what the result means (`HEADLINES`, by class name: effective attention's
mean null fraction and n against rank(T), HTA's own-token share at the last layer, a
mixing method's locality, intervals' identifiable share). The picture is an inline SVG
(no script, no network) of one map: the class's default `plot` panel, or for effective
attention the per-head null fractions, drawn with `identifiable.results.colormap` (signed maps:
its diverging colours and per-panel scale; a null-fraction grid: white to teal).
Every piece of text is escaped (markupsafe). Imported by `Result._repr_html_` only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from markupsafe import Markup

from identifiable.results.colormap import colour, panel_scale

PICTURE_CELLS = 24  # a map is drawn as at most 24 × 24 blocks (block means)
PICTURE_PX = 120
IDENTIFIABLE_BELOW = 0.01  # the width below which a weight is identifiable (as the viewer)
TEAL = (14, 92, 99)

__all__ = [
    "HEADLINES",
    "headline",
    "headline_html",
    "locality",
    "null_fractions",
    "picture",
    "stats",
    "svg_map",
]


def _np(value: Any) -> np.ndarray:
    """A tensor or array as numpy (bfloat16 and float16 as float32, which numpy holds).
    Not `results._to_numpy`: importing `results` here would make an import cycle."""
    if hasattr(value, "detach"):
        t = value.detach().cpu()
        return (t.float() if t.dtype.is_floating_point and t.element_size() < 4 else t).numpy()
    return np.asarray(value)


def null_fractions(res: Any) -> np.ndarray:
    """`[L, H]` ‖A − A_eff‖_F / ‖A‖_F per head of an EffectiveAttention result."""
    raw = _np(res.raw).astype(np.float64)
    eff = _np(res.effective).astype(np.float64)
    diff = np.linalg.norm((raw - eff).reshape(*raw.shape[:2], -1), axis=-1)
    return diff / np.maximum(np.linalg.norm(raw.reshape(*raw.shape[:2], -1), axis=-1), 1e-300)


def _effective(res: Any) -> list[str]:
    frac = null_fractions(res)
    layer, head = np.unravel_index(int(np.argmax(frac)), frac.shape)
    dims = _np(res.null_space.dim)[..., -1]
    n = int(res.raw.shape[-1])
    rank = n - int(dims.min())
    return [
        f"mean null fraction ‖A − A_eff‖_F / ‖A‖_F = {frac.mean():.3f} over {frac.size} heads "
        f"(largest {frac.max():.3f}: layer {_label(res, 'layers', layer)}, head "
        f"{_label(res, 'heads', head)})",
        f"n = {n} tokens against rank(T) ≤ d_v: rank {rank}, so dim LN(T) = {int(dims.max())}"
        + (" (attention is identifiable)" if int(dims.max()) == 0 else " (not identifiable)"),
    ]


def _label(res: Any, attr: str, k: Any) -> int:
    given = getattr(res, attr, None)
    return int(given[int(k)]) if given else int(k)


def _hta(res: Any) -> list[str]:
    contributions = _np(res.contributions)
    last = contributions[-1].astype(np.float64)
    own = float(np.diagonal(last).mean())
    return [
        f"own-token share at the last layer (layer {len(contributions) - 1}): mean c_ii = "
        f"{own:.3f} (uniform would be {1 / last.shape[-1]:.3f})"
    ]


def locality(maps: np.ndarray) -> float:
    """Mean share of each token's |mixing| that comes from itself and its ±1 neighbours,
    `maps` `[n, n]` (rows: receiving tokens)."""
    m = np.abs(np.asarray(maps, dtype=np.float64))
    i, j = np.indices(m.shape)
    near = np.where(np.abs(i - j) <= 1, m, 0.0).sum(-1)
    total = m.sum(-1)
    ok = total > 0
    return float((near[ok] / total[ok]).mean()) if ok.any() else 0.0


def _mixing(res: Any) -> list[str]:
    last = _np(res.layerwise)[-1]
    return [
        f"method {res.method}; locality at the last layer: {locality(last):.3f} of each "
        f"token's mixing comes from itself and its ±1 neighbours"
    ]


def _intervals(res: Any) -> list[str]:
    width = _np(res.upper).astype(np.float64) - _np(res.lower).astype(np.float64)
    keys = _np(res.keys) if hasattr(res, "keys") and not callable(res.keys) else None
    seen = (
        np.ones(width.shape, bool) if keys is None else np.broadcast_to(keys[:, None], width.shape)
    )
    ident = (width < IDENTIFIABLE_BELOW) & seen
    return [
        f"identifiable weights (interval width < {IDENTIFIABLE_BELOW:g}): {int(ident.sum())} of "
        f"{int(seen.sum())} ({ident.sum() / max(1, seen.sum()):.1%}); widest {width.max():.3f}"
    ]


def _null_space(res: Any) -> list[str]:
    dims = _np(res.dim)[..., -1]
    return [
        f"dim LN(T) {int(dims.min())}–{int(dims.max())}; identifiable heads (dim 0): "
        f"{int((dims == 0).sum())} of {dims.size}"
    ]


def _scan(res: Any) -> list[str]:
    frac = _np(res.null_fraction).astype(np.float64).mean(0)
    gap = (_np(res.sink_raw) - _np(res.sink_effective)).astype(np.float64).mean(0)
    layer, head = np.unravel_index(int(np.argmax(frac)), frac.shape)
    g_layer, g_head = np.unravel_index(int(np.argmax(gap)), gap.shape)
    n = _np(res.n)[:, 0, 0]
    return [
        f"{len(n)} texts of {int(n.min())}–{int(n.max())} tokens; mean null fraction "
        f"{frac.mean():.3f} over {frac.size} heads (largest {frac.max():.3f}: layer "
        f"{_label(res, 'layers', layer)}, head {_label(res, 'heads', head)})",
        f"attention to key {res.sink} that does not reach the output: up to {gap.max():.3f} "
        f"of each row (layer {_label(res, 'layers', g_layer)}, head "
        f"{_label(res, 'heads', g_head)}; raw minus effective, mean over texts)",
    ]


HEADLINES: dict[str, Callable[[Any], list[str]]] = {
    "EffectiveAttention": _effective,
    "HTAResult": _hta,
    "MixingResult": _mixing,
    "AttentionIntervals": _intervals,
    "IntervalMap": _intervals,
    "NullSpace": _null_space,
    "ScanResult": _scan,
}


def headline(res: Any) -> list[str]:
    """The headline lines of `res` (empty for a class without one)."""
    fn = HEADLINES.get(type(res).__name__)
    return fn(res) if fn is not None else []


def _blocks(values: np.ndarray, cells: int = PICTURE_CELLS) -> np.ndarray:
    """`values` `[a, b]` as at most cells × cells block means."""
    a, b = values.shape
    fa, fb = -(-a // cells), -(-b // cells)
    pad = np.full((-(-a // fa) * fa, -(-b // fb) * fb), np.nan)
    pad[:a, :b] = values
    blocks = pad.reshape(pad.shape[0] // fa, fa, pad.shape[1] // fb, fb)
    return np.nanmean(blocks, axis=(1, 3))


def svg_map(values: Any, *, signed: bool, caption: str, skip_first_key: bool = True) -> Markup:
    """An inline SVG of a 2-D map: diverging colours on ±s (signed) or white to teal on
    [0, max]; `caption` (escaped) under it, with the scale."""
    v = _blocks(np.asarray(values, dtype=np.float64))
    rows, cols = v.shape
    cw, ch = PICTURE_PX / cols, PICTURE_PX / rows
    if signed:
        s = panel_scale(values, skip_first_key=skip_first_key)
        rgb = lambda x: colour(x, s)  # noqa: E731
        scale = f"±{s:.3g}"
    else:
        top = float(np.nanmax(v)) or 1.0
        rgb = lambda x: tuple(round(255 + (c - 255) * min(1.0, x / top)) for c in TEAL)  # noqa: E731
        scale = f"0 … {top:.3g}"
    rects = [
        Markup(
            '<rect x="{:.2f}" y="{:.2f}" width="{:.2f}" height="{:.2f}" fill="rgb({})"/>'
        ).format(j * cw, i * ch, cw + 0.05, ch + 0.05, ",".join(map(str, rgb(float(v[i, j])))))
        for i in range(rows)
        for j in range(cols)
        if np.isfinite(v[i, j])
    ]
    return Markup(
        '<figure class="idf-result-picture" style="margin:0.3em 0"><svg xmlns="http://www.w3.org/2000/svg"'
        ' width="{0}" height="{0}" viewBox="0 0 {0} {0}" role="img" aria-label="{1}">{2}</svg>'
        "<figcaption><small>{1} ({3})</small></figcaption></figure>"
    ).format(PICTURE_PX, caption, Markup("").join(rects), scale)


def picture(res: Any) -> Markup:
    """The result's small picture, or nothing when it has no 2-D map to draw."""
    if type(res).__name__ == "EffectiveAttention":
        frac = null_fractions(res)
        return svg_map(
            frac, signed=False, caption="null fraction per head: layers down, heads across"
        )
    if type(res).__name__ == "ScanResult":
        frac = _np(res.null_fraction).astype(np.float64).mean(0)
        return svg_map(
            frac, signed=False, caption="mean null fraction per head: layers down, heads across"
        )
    spec = dict(res._plot)
    if spec.get("kind") in ("interval", "bars") or res._tables:
        return Markup("")
    names = [n for n in spec.get("fields", ()) if res._raw_value(n, compute=False) is not None]
    if not names:
        return Markup("")
    name, dims = names[0], res._dims[names[0]]
    if len(dims) < 2:
        return Markup("")
    arr = _np(res._raw_value(name))
    index = []
    chosen = []
    for axis, d in enumerate(dims[:-2]):
        k = int(spec.get(d, 0)) % arr.shape[axis]
        index.append(k)
        chosen.append(f"{d} {_label(res, d + 's', k) if d in ('layer', 'head') else k}")
    values = arr[tuple(index)].astype(np.float64)
    caption = (
        f"{name}"
        + (f", {', '.join(chosen)}" if chosen else "")
        + f": {dims[-2]} down, {dims[-1]} across"
    )
    return svg_map(values, signed=True, caption=caption, skip_first_key=dims[-1] == "key")


def stats(name: str, value: Any) -> tuple[str, str] | None:
    """(min, max) text of an array, or None where they mean nothing (token ids, masks)."""
    if name.endswith("_ids") or name in ("input_ids", "special", "keys"):
        return None
    arr = _np(value)
    if arr.size == 0 or arr.dtype == bool or not np.issubdtype(arr.dtype, np.number):
        return None
    return f"{arr.min():.4g}", f"{arr.max():.4g}"


def headline_html(res: Any) -> Markup:
    lines = headline(res)
    if not lines:
        return Markup("")
    items = Markup("").join(Markup("<li>{}</li>").format(x) for x in lines)
    return Markup('<ul class="idf-result-headline" style="margin:0.3em 0">{}</ul>').format(items)
