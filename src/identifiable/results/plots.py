"""The figures of `Result.plot` (matplotlib, imported when a figure is drawn): heatmaps,
bars, interval plots and per-layer lines of a result's arrays and tables.

Imported by `Result.plot` only (this module imports numpy at once, and matplotlib when
a figure is made); it never imports `identifiable.results`, which imports it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from identifiable.errors import IdentifiableError

MAX_TICK_LABELS = 48

if TYPE_CHECKING:  # pragma: no cover - types only
    from matplotlib.figure import Figure


def _tick_text(token: str) -> str:
    # matplotlib reads $…$ as mathematics; a token is plain text
    return token.replace("$", r"\$")


def _ticks(ax: Any, axis: str, labels: list[str] | None, coord: np.ndarray) -> None:
    n = len(coord)
    step = max(1, -(-n // MAX_TICK_LABELS))
    pos = list(range(0, n, step))
    text = [_tick_text(labels[p]) if labels else str(int(coord[p])) for p in pos]
    if axis == "x":
        ax.set_xticks(pos, text, rotation=90 if labels else 0, fontsize=7 if labels else 8)
    else:
        ax.set_yticks(pos, text, fontsize=7 if labels else 8)


def _figure(**kwargs: Any) -> Figure:
    """A new figure that Jupyter shows as an image when it is a cell's value.

    Made through pyplot (which installs Jupyter's figure formatter) and closed at once, so
    it is not drawn a second time at the end of the cell and holds no GUI window.
    """
    import matplotlib.pyplot as plt

    fig = plt.figure(**kwargs)
    plt.close(fig)
    return fig


def heatmaps(res: Any, panels: list, title: str) -> Figure:
    """Panels side by side, each on the shared diverging colormap with its own scale ±s
    (`identifiable.results.colormap.panel_scale`: the rule is in each colour bar's label)."""
    from identifiable.results.colormap import matplotlib_cmap, panel_scale

    cmap = matplotlib_cmap()
    fig = _figure(figsize=(4.6 * len(panels) + 0.6, 4.8), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (name, arr, dims, coords) in zip(axes, panels, strict=True):
        values = np.asarray(arr, dtype=float)
        ydim, xdim = dims
        # key 0 ([CLS] / BOS) takes most attention; the scale is read past it
        s = panel_scale(values, skip_first_key=xdim == "key")
        image = ax.imshow(
            values, cmap=cmap, vmin=-s, vmax=s, aspect="auto", interpolation="nearest"
        )
        _ticks(ax, "y", res._labels(ydim, list(coords[ydim])), coords[ydim])
        _ticks(ax, "x", res._labels(xdim, list(coords[xdim])), coords[xdim])
        ax.set_ylabel(ydim)
        ax.set_xlabel(xdim)
        ax.set_title(name)
        bar = fig.colorbar(image, ax=ax, shrink=0.85, location="bottom", pad=0.02)
        bar.set_label(f"±s, s = {s:.3g}: {_scale_rule(xdim == 'key')}", fontsize=7)
    fig.suptitle(_figure_title(res, title))
    return fig


def _scale_rule(skip_first_key: bool) -> str:
    where = " outside key 0" if skip_first_key else ""
    return f"99th pct of |value|{where}"


def _figure_title(res: Any, where: str) -> str:
    bits = [type(res).__name__]
    if res._model:
        bits.append(res._model)
    if where:
        bits.append(where)
    return " — ".join(bits)


def bars(res: Any, panels: list, title: str) -> Figure:
    import numpy as np

    fig = _figure(figsize=(max(6.0, 0.25 * len(panels[0][1]) + 2), 3.8), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / len(panels)
    for k, (name, arr, _, _) in enumerate(panels):
        x = np.arange(len(arr)) + (k - (len(panels) - 1) / 2) * width
        ax.bar(x, np.asarray(arr, dtype=float), width=width, label=name)
    dim, coords = panels[0][2][0], panels[0][3][panels[0][2][0]]
    _ticks(ax, "x", res._labels(dim, list(coords)), coords)
    ax.set_xlabel(dim)
    ax.set_ylabel("weight")
    ax.axhline(0, color="0.6", linewidth=0.6)
    ax.legend(fontsize=8)
    fig.suptitle(_figure_title(res, title))
    return fig


def interval_plot(res: Any, names: list[str], chosen: dict[str, Any], title: str) -> Figure:
    """Per key: the interval [lower, upper] of weights with the same head output, and the
    raw weight as a dot (fields: lower, upper, raw)."""
    import numpy as np

    lower, dims, coords = res._select(names[0], chosen)
    upper, _, _ = res._select(names[1], chosen)
    point = res._select(names[2], chosen)[0] if len(names) > 2 else None
    dim = dims[-1]
    x = np.arange(len(lower))
    fig = _figure(figsize=(max(6.0, 0.25 * len(x) + 2), 3.8), layout="constrained")
    ax = fig.subplots()
    ax.vlines(x, lower, upper, color="tab:blue", linewidth=4, alpha=0.6, label="interval")
    if point is not None:
        ax.plot(x, point, "o", color="black", markersize=3, label=names[2])
    _ticks(ax, "x", res._labels(dim, list(coords[dim])), coords[dim])
    ax.set_xlabel(dim)
    # the axis fits the row (its least to greatest value, padded 4%), as the viewer's row
    # table does: on 0..1 a 0.05-wide interval would be a few pixels
    drawn = np.concatenate(
        [np.ravel(lower), np.ravel(upper)] + ([np.ravel(point)] if point is not None else [])
    )
    lo, hi = float(np.nanmin(drawn)), float(np.nanmax(drawn))
    pad = max(0.04 * (hi - lo), (0.01 - (hi - lo)) / 2 if hi - lo < 0.01 else 0.0)
    ax.set_ylim(lo - pad, hi + pad)
    ax.set_ylabel("attention weight (axis fitted to the row)")
    ax.legend(fontsize=8)
    fig.suptitle(_figure_title(res, title))
    return fig


def layer_lines(res: Any, name: str, sel: dict[str, Any]) -> Figure:
    """A per-layer table: one line per group (the table's index columns other than layer),
    `rate` against `layer`, with the [ci_low, ci_high] band and the chance level when the
    table has them."""

    value = sel.pop("value", "rate")
    table = res.to_pandas(name, **sel)
    keys = [k for k in res._tables[name] if k in table.columns and k != "layer"]
    if "layer" not in table.columns or value not in table.columns:
        raise IdentifiableError(f"plot: table {name!r} has no layer/{value} columns to draw")
    fig = _figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.subplots()
    groups = table.groupby(keys, sort=True) if keys else [((), table)]
    for key, part in groups:
        part = part.sort_values("layer")
        label = " ".join(map(str, key if isinstance(key, tuple) else (key,))) or value
        (line,) = ax.plot(part["layer"], part[value], marker="o", markersize=3, label=label)
        if {"ci_low", "ci_high"} <= set(part.columns):
            ax.fill_between(
                part["layer"],
                part["ci_low"],
                part["ci_high"],
                color=line.get_color(),
                alpha=0.15,
                linewidth=0,
            )
    if "chance" in table.columns:
        ax.axhline(float(table["chance"].max()), color="0.5", linestyle="--", label="chance")
    ax.set_xlabel("layer")
    ax.set_ylabel(value)
    ax.legend(fontsize=8)
    fig.suptitle(_figure_title(res, name))
    return fig
