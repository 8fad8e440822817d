"""`AttentionPosterior.plot`: one row on one axis (matplotlib, imported when drawn)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from identifiable.errors import IdentifiableError
from identifiable.results.plots import _figure, _figure_title, _ticks

if TYPE_CHECKING:  # pragma: no cover - types only
    from matplotlib.figure import Figure

MAX_KEYS = 48
CERTIFIED, CREDIBLE = "#9fbfe3", "#1f4e89"  # the viewer's interval colour, and a darker band


def _position(values: tuple[int, ...], wanted: Any, what: str) -> int:
    if wanted is None:
        return 0
    if int(wanted) not in values:
        shown = ", ".join(map(str, values[:12])) + (" …" if len(values) > 12 else "")
        raise IdentifiableError(f"{what} {wanted} is not in this result: choose one of {shown}")
    return values.index(int(wanted))


def row_figure(res: Any, head: Any = None, row: Any = None, max_keys: int = MAX_KEYS) -> Figure:
    """The certified interval and the credible band of every key of one row (the keys
    with the `max_keys` largest certified maxima, in key order), with the raw row, the
    paper's A_eff, the constrained row and the posterior mean; flags in the title."""
    h, r = _position(res.heads, head, "head"), _position(res.rows, row, "row")
    keys = np.flatnonzero(res.keys[r].numpy())
    upper = res.upper[h, r].numpy()
    if len(keys) > max_keys:
        keys = np.sort(keys[np.argsort(-upper[keys], kind="stable")[:max_keys]])
    x = np.arange(len(keys))

    def get(name: str) -> np.ndarray:
        return getattr(res, name)[h, r].numpy()[keys]

    fig = _figure(figsize=(max(6.5, 0.28 * len(x) + 2.5), 4.2), layout="constrained")
    ax = fig.subplots()
    ax.vlines(
        x, get("lower"), get("upper"), color=CERTIFIED, linewidth=9, label="certified interval"
    )
    ax.vlines(
        x,
        get("credible_lower"),
        get("credible_upper"),
        color=CREDIBLE,
        linewidth=4,
        label=f"{res.level:.0%} credible band",
    )
    marks = (
        ("raw", "o", "black", "raw a"),
        ("effective", "x", "#e08a00", "paper A_eff"),
        ("constrained", "D", "#7b4fc4", "constrained"),
        ("mean", "_", "white", "posterior mean"),
    )
    for name, marker, colour, label in marks:
        ax.plot(
            x,
            get(name),
            marker,
            color=colour,
            markersize=5 if marker != "_" else 9,
            markeredgecolor="black" if name == "mean" else colour,
            label=label,
        )
    labels = res._labels("key", list(keys))
    _ticks(ax, "x", labels, keys)
    ax.set_xlabel(
        "key"
        + (
            f" ({len(keys)} with the largest certified maxima)"
            if len(keys) < int(res.keys[r].sum())
            else ""
        )
    )
    ax.set_ylabel("attention weight")
    ax.axhline(0, color="0.7", linewidth=0.6)
    ax.legend(fontsize=7, ncol=3, loc="upper right")
    token = f" “{res.tokens[res.rows[r]]}”" if res.tokens else ""
    where = (
        f"layer {res.layer}, head {res.heads[h]}, row {res.rows[r]}{token}: dim P = "
        f"{int(res.dim[h, r])}, ESS {float(res.ess[h, r]):.0f}, R̂ {float(res.rhat[h, r]):.4f}, "
        f"prior {res.prior}"
    )
    fig.suptitle(_figure_title(res, where), fontsize=9)
    flags = res.flag_text(h, r)
    if flags:
        ax.set_title(f"flagged: {flags}", color="#b00020", fontsize=9)
    return fig
