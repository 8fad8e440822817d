"""The comparison report: renders the tables of `experiments.compare` (computes nothing)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib import pyplot as plt
from matplotlib.figure import Figure

from identifiable.report.files import write_figure, write_tables
from identifiable.report.html import h, page, png_img, table_html
from identifiable.store.files import atomic_write_text

TITLE = "Models side by side on the same texts"


def curves_figure(curve: pd.DataFrame) -> Figure:
    """One panel per metric: value against relative depth (layer / L), one line per model."""
    metrics = list(dict.fromkeys(curve["metric"]))
    cols = min(3, max(1, len(metrics)))
    rows = (len(metrics) + cols - 1) // cols
    fig, axes = plt.subplots(
        rows, cols, figsize=(4.2 * cols, 3.2 * rows), layout="constrained", squeeze=False
    )
    for ax, metric in zip(axes.flat, metrics, strict=False):
        for model, grp in curve[curve["metric"] == metric].groupby("model", sort=False):
            ax.plot(grp["relative_depth"], grp["value"], "o-", label=str(model), ms=3)
        ax.set_title(metric, fontsize=8)
        ax.set_xlabel("relative depth (layer / L)", fontsize=8)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.set_visible(False)
    return fig


def write_compare_report(
    out: Path, tables: dict[str, pd.DataFrame], meta: dict[str, Any]
) -> list[Path]:
    """Tables, the figure and index.html (last) into `out`."""
    files = write_tables(tables, out / "tables")
    fig = curves_figure(tables["curves"])
    png, paths = write_figure(fig, out / "figures" / "curves")
    plt.close(fig)
    files += paths
    links = [
        h(
            "li",
            h("a", f"{label}: full reproduction report", href=f"models/{label}/index.html"),
            f" — {desc}",
        )
        for label, desc in meta["models"].items()
    ]
    body = [
        h("header", h("h1", TITLE), h("p", meta["summary"], class_="meta")),
        h(
            "section",
            h("h2", "Verdicts"),
            h("p", meta["verdict_note"]),
            table_html(tables["verdicts"], max_rows=50),
        ),
        h(
            "section",
            h("h2", "Figures by relative depth"),
            h(
                "figure",
                png_img(png, "curves", data_figure="curves"),
                h(
                    "figcaption",
                    "Each model's per-layer values at layer / L, so that models of "
                    "different depths line up.",
                ),
            ),
        ),
        h(
            "section",
            h("h2", f"Differences from {meta['reference']}"),
            h("p", "Each layer against the reference's layer at the nearest relative depth."),
            table_html(tables["differences"], max_rows=200),
        ),
        h(
            "section",
            h("h2", "Texts and token counts"),
            h("p", meta["texts"]),
            table_html(tables["token_counts"], max_rows=20),
        ),
        h("section", h("h2", "Models"), h("ul", links)),
    ]
    files.append(
        atomic_write_text(out / "index.html", page(TITLE, body, styles=["base.css", "report.css"]))
    )
    return files
