"""The one diverging colormap of every signed map (matplotlib figures and the viewer), and
the rule that sets each panel's scale.

Colours: ColorBrewer's RdBu, reversed: blue below 0, a neutral light grey at 0, red above
0; 9 stops, evenly spaced over −scale … +scale and interpolated linearly in RGB. Python
(`colour`, `matplotlib_cmap`) and the viewer's script (which receives `STOPS` in the page's
data, see `page_colormap`) compute the same colour for the same value.

Scale (`panel_scale`): each panel has its own symmetric scale ±s, with s the 99th percentile
of |value| over the panel's visible cells outside the first key column (the [CLS] / BOS
column, which soaks up most attention and would otherwise wash the rest of the panel out);
values beyond ±s are drawn at the end colours. If that percentile is 0, s is the largest
|value| of the whole panel, and 1 if the panel is all zeros.

Sits on the lowest floor (numpy, imported lazily; matplotlib only in `matplotlib_cmap`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - types only
    from matplotlib.colors import Colormap

__all__ = [
    "NEUTRAL",
    "PERCENTILE",
    "SCALE_RULE",
    "STOPS",
    "colour",
    "matplotlib_cmap",
    "page_colormap",
    "panel_scale",
]

# RdBu reversed (ColorBrewer, 9 classes): −scale … 0 … +scale
STOPS: tuple[tuple[int, int, int], ...] = (
    (33, 102, 172),
    (67, 147, 195),
    (146, 197, 222),
    (209, 229, 240),
    (247, 247, 247),
    (253, 219, 199),
    (244, 165, 130),
    (214, 96, 77),
    (178, 24, 43),
)
NEUTRAL = STOPS[len(STOPS) // 2]
PERCENTILE = 99.0

SCALE_RULE = (
    "each panel its own scale ±s: s = the 99th percentile of |value| outside the first key "
    "column ([CLS]/BOS); blue below 0, grey at 0, red above 0; beyond ±s at the end colours"
)


def colour(value: float, scale: float) -> tuple[int, int, int]:
    """The RGB colour (0..255 each) of `value` on the scale ±`scale` (> 0).

    The same arithmetic as viewer.js `divergingColour`: t = clamp(value / scale, −1, 1),
    position (t + 1) / 2 · (stops − 1), linear between the two stops around it, rounded
    half up.
    """
    t = max(-1.0, min(1.0, value / scale)) if scale > 0 else 0.0
    if math.isnan(t):
        t = 0.0
    pos = (t + 1) / 2 * (len(STOPS) - 1)
    k = min(len(STOPS) - 2, math.floor(pos))
    f = pos - k
    a, b = STOPS[k], STOPS[k + 1]
    r, g, bl = (math.floor(x + (y - x) * f + 0.5) for x, y in zip(a, b, strict=True))
    return r, g, bl


def panel_scale(values: Any, *, visible: Any = None, skip_first_key: bool = True) -> float:
    """s for one `[n, n_k]` panel (see the module docstring).

    values: the panel (array-like, rows are queries, columns keys). visible: a bool mask of
    the same shape (False: a masked cell, e.g. a key after a causal query), or None.
    skip_first_key: leave out key column 0 (the default; False for maps without one).
    The percentile is numpy's default (linear between order statistics), as in viewer.js.
    """
    import numpy as np

    v = np.abs(np.asarray(values, dtype=np.float64))
    keep = np.isfinite(v)
    if visible is not None:
        keep &= np.asarray(visible, dtype=bool)
    inner = keep.copy()
    if skip_first_key and v.ndim == 2 and v.shape[1] > 1:
        inner[:, 0] = False
    s = float(np.percentile(v[inner], PERCENTILE)) if inner.any() else 0.0
    if s <= 0:
        s = float(v[keep].max()) if keep.any() else 0.0
    return s if s > 0 else 1.0


def matplotlib_cmap(n: int = 256) -> Colormap:
    """The colormap as a matplotlib `LinearSegmentedColormap` named "identifiable"
    (draw with vmin = −s, vmax = +s)."""
    from matplotlib.colors import LinearSegmentedColormap

    return LinearSegmentedColormap.from_list(
        "identifiable", [tuple(c / 255 for c in s) for s in STOPS], N=n
    )


def page_colormap() -> dict[str, Any]:
    """What the viewer's page data carries: the stops, the percentile and the rule's text."""
    return {"stops": [list(s) for s in STOPS], "percentile": PERCENTILE, "rule": SCALE_RULE}
