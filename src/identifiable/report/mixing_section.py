"""Report section "Which account of mixing tracks the gradients?": figure and computed claim.

Both read only the summary table of the mixing experiment, columns: layer (0-based),
method, reference ("hta" or "erasure"), mean, ci_low, ci_high, n_sequences (mean
row-wise Spearman ρ over sequences with its bootstrap 95 % interval).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only; never open a window

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import pyplot as plt
from matplotlib.figure import Figure

from identifiable.report.claims import NOT_SUPPORTED, NOT_TESTED, PARTLY, SUPPORTED
from identifiable.report.section import Section
from identifiable.report.verdicts import Verdict, settle

SUMMARY_COLUMNS = ("layer", "method", "reference", "mean", "ci_low", "ci_high", "n_sequences")
RAW = "attention"
REFERENCE_TITLES = {"hta": "vs Hidden Token Attribution", "erasure": "vs erasure"}


def _check(summary: pd.DataFrame) -> None:
    missing = [c for c in SUMMARY_COLUMNS if c not in summary.columns]
    if missing:
        raise ValueError(f"mixing summary lacks columns {', '.join(missing)}")


def mixing_figure(summary: pd.DataFrame) -> Figure:
    """One panel per reference: mean row-wise Spearman ρ per layer, one line per method,
    shaded with its bootstrap 95 % interval; raw attention drawn dashed in black."""
    _check(summary)
    refs = [r for r in REFERENCE_TITLES if r in set(summary["reference"])] or sorted(
        set(summary["reference"])
    )
    fig, axes = plt.subplots(1, max(1, len(refs)), figsize=(5.2 * max(1, len(refs)), 3.8))
    axes = np.atleast_1d(axes)
    methods = sorted(set(summary["method"]))
    colours = plt.get_cmap("tab10")
    for ax, ref in zip(axes, refs, strict=False):
        part = summary[summary["reference"] == ref]
        for k, method in enumerate(methods):
            rows = part[part["method"] == method].sort_values("layer")
            if rows.empty:
                continue
            colour = "black" if method == RAW else colours(k % 10)
            style = "--" if method == RAW else "-"
            ax.plot(rows["layer"], rows["mean"], style, color=colour, label=method, marker="o")
            ax.fill_between(
                rows["layer"], rows["ci_low"], rows["ci_high"], color=colour, alpha=0.12
            )
        ax.set_title(REFERENCE_TITLES.get(ref, f"vs {ref}"))
        ax.set_xlabel("layer")
        ax.set_ylabel("mean row-wise Spearman ρ")
        ax.axhline(0, color="#999", lw=0.8)
        ax.grid(alpha=0.3)
    labelled: dict[str, object] = {}
    for ax in axes:  # every method once, also those drawn on one panel only
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            labelled.setdefault(label, handle)
    axes[-1].legend(list(labelled.values()), list(labelled), fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def _layers_rule(ok: Sequence[bool]) -> str:
    return SUPPORTED if all(ok) else PARTLY if any(ok) else NOT_SUPPORTED


def mixing_claim(summary: pd.DataFrame, reference: str = "hta") -> tuple[str, str]:
    """Does some account of mixing track `reference` better than raw attention?

    Test, per layer: the best method other than raw attention (highest mean ρ averaged over
    layers) beats raw attention in a layer when its 95 % interval lies wholly above
    attention's, loses when it lies wholly below, and is open when they overlap.
    Supported: it beats it in every layer; partly supported: in some layers; not supported:
    in none; not settled when open layers decide it. Not tested: raw attention or any other
    method is missing for the reference.
    Returns (verdict, sentence quoting the numbers).
    """
    _check(summary)
    part = summary[(summary["reference"] == reference) & summary["mean"].notna()]
    raw = part[part["method"] == RAW].set_index("layer")
    others = part[part["method"] != RAW]
    if raw.empty or others.empty:
        return NOT_TESTED, (
            f"Not tested: the table has no raw-attention or no other method compared with {reference}."
        )
    ranking = others.groupby("method")["mean"].mean().sort_values(ascending=False)
    best = str(ranking.index[0])
    rows = others[others["method"] == best].set_index("layer")
    layers = sorted(set(rows.index) & set(raw.index))
    if not layers:
        return NOT_TESTED, f"Not tested: {best} and raw attention share no layer."
    outcomes = [
        True
        if rows.loc[layer, "ci_low"] > raw.loc[layer, "ci_high"]
        else False
        if rows.loc[layer, "ci_high"] < raw.loc[layer, "ci_low"]
        else None
        for layer in layers
    ]
    status = settle(_layers_rule, outcomes)
    n_seq = int(part["n_sequences"].max())
    sentence = (
        f"{status.capitalize()}: against {reference}, {best} tracks best (mean ρ "
        f"{ranking.iloc[0]:.2f} over layers, raw attention {raw.loc[layers, 'mean'].mean():.2f}); "
        f"its 95% bootstrap interval lies above raw attention's in {outcomes.count(True)} of "
        f"{len(layers)} layers, below it in {outcomes.count(False)}, and overlaps it in "
        f"{outcomes.count(None)} ({n_seq} sequences)."
    )
    return status, sentence


def unavailable_note(unavailable: pd.DataFrame | None) -> str:
    """A sentence naming the methods that could not run on this model, and why ('' if none)."""
    if unavailable is None or unavailable.empty:
        return ""
    parts = [f"{r.method} ({r.reason})" for r in unavailable.itertuples()]
    return " Not computed on this model: " + "; ".join(parts) + "."


def section(tables: dict[str, pd.DataFrame], fig: Any) -> Section:
    """The context-mixing section; `fig(stem, figure, caption)` writes a figure."""
    summary = tables["mixing_summary"]
    corr = tables["mixing_correlations"]
    n_seq = corr["seq"].nunique() if len(corr) else 0
    lengths = (
        f"{int(corr['length'].min())}–{int(corr['length'].max())} tokens" if len(corr) else "—"
    )
    verdicts = []
    for reference in ("hta", "erasure"):
        status, sentence = mixing_claim(summary, reference)
        verdicts.append(Verdict(f"mixing_{reference}", status, sentence))
    return Section(
        "mixing",
        "6. Beyond the paper: which account of mixing tracks the gradients?",
        "Raw attention is not a faithful account of how tokens mix. Measures that also follow "
        "the values, the residual and the layer norms (norm-based, GlobEnc, ALTI, value "
        "zeroing) should track Hidden Token Attribution and erasure better than raw attention "
        "or its rollout.",
        "Per layer, the row-by-row Spearman correlation of each method's map with HTA (left) "
        "and with erasure (right), averaged over rows and then over sequences; bands are 95% "
        "bootstrap intervals over sequences. Rolled-out methods are compared through their "
        "rollout; attention and norm are single-layer maps. Definitions: docs/mixing.md."
        + unavailable_note(tables.get("mixing_unavailable")),
        [
            fig(
                "mixing_correlations",
                mixing_figure(summary),
                f"Context mixing vs HTA and erasure. {n_seq} sequences of {lengths}; HTA "
                "by the estimator or exactly as the Methods section states; flow left out "
                "(one max-flow problem per pair of tokens).",
            )
        ],
        verdicts,
        [("mixing_summary", summary)],
    )
