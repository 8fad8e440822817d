"""The fine-tuning sweep report: renders the tables of `experiments.sweep` (computes nothing)."""

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

TITLE = "Null-space-aware fine-tuning: what the penalty bought and what it cost"


def pareto_figure(pareto: pd.DataFrame, null_goal: float, cosine_goal: float) -> Figure:
    """Median null fraction (x) against held-out embedding cosine (y), one point per model."""
    fig, ax = plt.subplots(figsize=(5.6, 4.0), layout="constrained")
    base = pareto.iloc[0]
    ax.axhline(cosine_goal, color="#888", ls=":", lw=1)
    ax.axvline(null_goal * base["null_median"], color="#888", ls=":", lw=1)
    ax.plot(pareto["null_median"], pareto["cosine_mean"], "o-", color="#1f5fa8")
    for _, r in pareto.iterrows():
        ax.annotate(
            str(r["model"]),
            (r["null_median"], r["cosine_mean"]),
            fontsize=8,
            xytext=(4, 4),
            textcoords="offset points",
        )
    ax.set_xlabel("median null fraction, n > d_v (held-out pairs)")
    ax.set_ylabel("embedding cosine to the original (held-out)")
    ax.set_title("goal: left of the vertical line and above the horizontal one", fontsize=9)
    return fig


def layers_figure(by_layer: pd.DataFrame) -> Figure:
    fig, ax = plt.subplots(figsize=(5.6, 3.6), layout="constrained")
    for model, grp in by_layer.groupby("model", sort=False):
        ax.plot(grp["layer"], grp["median"], "o-", label=str(model))
    ax.set_xlabel("layer")
    ax.set_ylabel("median null fraction (n > d_v)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    return fig


def loss_figure(log: pd.DataFrame) -> Figure:
    """Convergence of every run: the total loss, fidelity and the penalty term per step."""
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.4), layout="constrained")
    for w, grp in log.groupby("penalty"):
        axes[0].plot(grp["step"], grp["fidelity"], label=f"w = {w:g}")
        axes[1].plot(grp["step"], grp["null_fraction"], label=f"w = {w:g}")
    axes[0].set_yscale("log")
    axes[0].set_title("fidelity loss (training batches)", fontsize=9)
    axes[1].set_title("null fraction (training batches)", fontsize=9)
    for ax in axes:
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    return fig


def write_sweep_report(
    out: Path, tables: dict[str, pd.DataFrame], meta: dict[str, Any]
) -> list[Path]:
    """Tables (CSV, Parquet), figures (PNG, SVG) and index.html (last) into `out`."""
    files = write_tables(tables, out / "tables")
    figs = [
        (
            "pareto",
            pareto_figure(tables["pareto"], meta["null_goal"], meta["cosine_goal"]),
            "Each point is a model on the held-out texts; dotted lines: the goal (half the "
            "original's median null fraction, cosine 0.98).",
        ),
        (
            "null_by_layer",
            layers_figure(tables["null_by_layer"]),
            "Median over heads and held-out sequences longer than d_v of the mean row null fraction.",
        ),
        (
            "training_loss",
            loss_figure(tables["training_log"]),
            "Convergence record of every run (per step, on its training batch).",
        ),
    ]
    shown = []
    for stem, fig, caption in figs:
        png, paths = write_figure(fig, out / "figures" / stem)
        plt.close(fig)
        files += paths
        shown.append(h("figure", png_img(png, stem, data_figure=stem), h("figcaption", caption)))
    body = [
        h("header", h("h1", TITLE), h("p", meta["summary"], class_="meta")),
        h(
            "section",
            h("h2", "Result"),
            h("p", meta["verdict"], class_="verdict"),
            table_html(tables["pareto"], max_rows=50),
        ),
        h("section", h("h2", "Figures"), shown),
        h("section", h("h2", "Per layer"), table_html(tables["null_by_layer"], max_rows=200)),
        h(
            "section",
            h("h2", "Fig. 2 at the last layer"),
            table_html(tables["tokens"], max_rows=60),
        ),
        h("section", h("h2", "Method"), h("p", meta["method"])),
    ]
    files.append(
        atomic_write_text(out / "index.html", page(TITLE, body, styles=["base.css", "report.css"]))
    )
    return files
