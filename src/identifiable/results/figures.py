"""`plot()`: a labelled matplotlib Figure of a result (`identifiable.results.plots` draws)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from identifiable.errors import IdentifiableError
from identifiable.results.core import ResultCore, _position

if TYPE_CHECKING:  # pragma: no cover - types only
    from matplotlib.figure import Figure


class Figures(ResultCore):
    """`plot` of every result."""

    def plot(self, *fields: str, **sel: Any) -> Figure:
        """A labelled matplotlib `Figure` (not drawn on screen; Jupyter shows it).

        fields: arrays to draw side by side on one colour scale (default: the class's
            choice, e.g. raw, effective and null attention); sel: the coordinates of the
            dimensions not drawn (`layer=2, head=5`; defaults are the class's), `axes`: the
            two dimensions drawn. Token tick labels where they fit (every k-th otherwise).
        """
        from identifiable.results import plots

        spec = dict(self._plot)
        kind = sel.pop("kind", spec.pop("kind", None))
        if self._tables and kind in (None, "layer_lines"):
            return plots.layer_lines(self, fields[0] if fields else next(iter(self._tables)), sel)
        names = list(fields) or [
            n
            for n in (list(spec.pop("fields", ())) or self._default_fields()[:1])
            if self._raw_value(n) is not None  # e.g. a witness that does not exist
        ]
        if not names:
            raise IdentifiableError(f"{type(self).__name__} holds no arrays to plot")
        axes = tuple(sel.pop("axes", spec.pop("axes", ())))
        for name in names:
            self._check_field(name)
        dims = tuple(self._dims[names[0]])
        drawn = axes or (dims[-2:] if kind != "interval" and len(dims) >= 2 else dims[-1:])
        unknown = set(sel) - set(dims)
        if unknown:
            raise IdentifiableError(
                f"plot: {', '.join(sorted(unknown))} is not a dimension of {names[0]} "
                f"({', '.join(dims)})"
            )
        shape = self._raw_value(names[0]).shape
        chosen = {}
        for axis, d in enumerate(dims):
            if d not in drawn:  # the class's default, else the first coordinate
                coord = self._coord(d, shape[axis])
                chosen[d] = int(coord[_position(d, coord, sel.get(d, spec.get(d, coord[0])))])
        title = ", ".join(f"{d} {v}" for d, v in chosen.items())
        if kind == "interval":
            return plots.interval_plot(self, names, chosen, title)
        panels = []
        for name in names:
            arr, kept, coords = self._select(name, chosen)
            if tuple(kept) != tuple(d for d in dims if d in drawn):
                raise IdentifiableError(f"plot: cannot draw {name} over {list(drawn)}")
            if drawn != tuple(kept):  # the caller asked for the axes in the other order
                arr = arr.T
                kept = tuple(reversed(kept))
            panels.append((name, arr, kept, coords))
        if len(drawn) == 1:
            return plots.bars(self, panels, title)
        return plots.heatmaps(self, panels, title)
