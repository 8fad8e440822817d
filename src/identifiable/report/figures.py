"""Matplotlib figures of the reproduction report, one function per paper figure.

Each takes our tidy tables (columns named in its docstring; layers 0-based as on every surface) and
the paper's reference values, and returns a Figure with our run on the left and
the paper's BERT-base values on the right, labelled as such. Every plot against
sequence length marks the head width d_v, where non-identifiability starts.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only; never open a window

from typing import Any

import numpy as np
import pandas as pd
from matplotlib import pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from identifiable.report.paper import PAPER_LABEL, paper_head_dim, paper_reference

TARGET_COLOURS = {"CLS": "#1f5fa8", "SEP": "#d1495b", "PUNCT": "#2a9d4b"}
PROBE_STYLES = {
    ("mlp", "cos"): ("#1f5fa8", "-"),
    ("linear", "cos"): ("#2a9d4b", "-"),
    ("naive", "cos"): ("#8a6d00", "-"),
    ("mlp", "l2"): ("#1f5fa8", "--"),
    ("linear", "l2"): ("#2a9d4b", "--"),
    ("naive", "l2"): ("#8a6d00", "--"),
}
PAPER_PROBE_KEYS = {
    ("mlp", "cos"): "mlp_cos",
    ("linear", "cos"): "lin_cos",
    ("naive", "cos"): "naive_cos",
    ("mlp", "l2"): "mlp_l2",
    ("linear", "l2"): "lin_l2",
    ("naive", "l2"): "naive_l2",
}
GROUPS = ["1", "2", "3", "4-5", "6-10", "11+"]


def _figure(ncols: int, width: float = 5.2, height: float = 3.6) -> tuple[Figure, list[Axes]]:
    plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False})
    fig, axes = plt.subplots(
        1, ncols, figsize=(width * ncols, height), squeeze=False, layout="constrained"
    )
    return fig, list(axes[0])


def close(fig: Figure) -> None:
    plt.close(fig)


def mark_head_width(ax: Axes, head_dim: int, *, who: str = "") -> None:
    """Vertical line at n = d_v: beyond it attention is not identifiable."""
    ax.axvline(head_dim, color="#444", lw=1, ls=":")
    ax.annotate(
        f"{who}head width d_v = {head_dim}\nnon-identifiable beyond",
        xy=(head_dim, 1.0),
        xycoords=("data", "axes fraction"),
        xytext=(4, -4),
        textcoords="offset points",
        va="top",
        fontsize=7.5,
        color="#333",
    )


def _paper_title(ax: Axes, what: str) -> None:
    ax.set_title(f"{what}\n{PAPER_LABEL}", fontsize=9)


def _layer_axis(ax: Axes, n_layers: int) -> None:
    ax.set_xticks(range(n_layers))
    ax.set_xlabel("layer")


def fig1a_pearson(by_length: pd.DataFrame, head_dim: int, model: str) -> Figure:
    """Pearson r(raw, effective) per sequence against length.

    by_length: columns length, pearson_r, null_dim_mean (mean dim LN(T) over heads/layers).
    """
    fig, (ax, ax_null, ax_paper) = _figure(3, width=4.4)
    ax.scatter(by_length["length"], by_length["pearson_r"], s=8, alpha=0.6, color="#1f5fa8")
    ax.set(
        xlabel="sequence length n (tokens)",
        ylabel="Pearson r (raw, effective)",
        title=f"our run: {model}",
    )
    mark_head_width(ax, head_dim)
    ax_null.scatter(
        by_length["length"],
        by_length["null_dim_mean"],
        s=8,
        alpha=0.6,
        color="#d1495b",
        label="measured",
    )
    lengths = np.arange(1, int(max(by_length["length"].max(), head_dim + 1)) + 1)
    ax_null.plot(
        lengths,
        np.maximum(lengths - head_dim, 0),
        color="#444",
        lw=1,
        label="lower bound max(0, n − d_v)",
    )
    ax_null.set(
        xlabel="sequence length n (tokens)",
        ylabel="mean dim LN(T) per head",
        title="null-space dimension",
    )
    ax_null.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(0.0, 0.85))
    mark_head_width(ax_null, head_dim)
    pts = np.array(paper_reference()["fig1a_pearson_raw_vs_effective_by_length"]["points"])
    ax_paper.plot(pts[:, 0], pts[:, 1], "o-", ms=3, color="#777")
    ax_paper.set(xlabel="sequence length n (tokens)", ylabel="Pearson r")
    _paper_title(ax_paper, "Fig. 1a")
    mark_head_width(ax_paper, paper_head_dim(), who="BERT-base ")
    return fig


def fig1bc_targets(to_tokens: pd.DataFrame, kind: str, n_layers: int, model: str) -> Figure:
    """Average attention to [CLS]/[SEP]/punctuation per layer: dots per head, line per layer mean.

    to_tokens: columns layer, head, kind ('raw'|'effective'), target ('CLS'|'SEP'|'PUNCT'), value.
    """
    fig, (ax, ax_paper) = _figure(2)
    sub = to_tokens[to_tokens["kind"] == kind]
    offsets = {"CLS": -0.2, "SEP": 0.0, "PUNCT": 0.2}
    for target, colour in TARGET_COLOURS.items():
        t = sub[sub["target"] == target]
        if t.empty:
            continue
        ax.scatter(t["layer"] + offsets[target], t["value"], s=7, alpha=0.45, color=colour)
        means = t.groupby("layer")["value"].mean()
        ax.plot(means.index, means.to_numpy(), "-", color=colour, label=_target_label(target))
    label = "raw attention" if kind == "raw" else "effective attention (not a distribution)"
    ax.set(ylabel=f"average {label}", title=f"our run: {model}")
    ax.axhline(0, color="#bbb", lw=0.6)
    _layer_axis(ax, n_layers)
    ax.legend(fontsize=7.5)
    key = (
        "fig1b_raw_attention_layer_mean"
        if kind == "raw"
        else "fig1c_effective_attention_layer_mean"
    )
    ref = paper_reference()[key]
    for target, colour in TARGET_COLOURS.items():
        ys = ref[target]
        ax_paper.plot(range(len(ys)), ys, "o-", ms=3, color=colour, label=_target_label(target))
    _layer_axis(ax_paper, len(ref["CLS"]))
    ax_paper.set(ylabel=f"layer mean of {label}")
    _paper_title(ax_paper, "Fig. 1b" if kind == "raw" else "Fig. 1c")
    ax_paper.legend(fontsize=7.5)
    return fig


def _target_label(target: str) -> str:
    return {"CLS": "[CLS] / first token", "SEP": "[SEP] / last token", "PUNCT": "'.' or ','"}[
        target
    ]


def fig2a_identifiability(rates: pd.DataFrame, n_layers: int, model: str) -> Figure:
    """Token identifiability rate per layer for each probe and objective, with 95% intervals.

    rates: columns layer, probe, objective, rate, ci_low, ci_high (probe 'shuffled' = control),
    optionally converged and fit_failure (marked: see `_mark_fits`).
    """
    fig, (ax, ax_paper) = _figure(2)
    for (probe, objective), (colour, ls) in PROBE_STYLES.items():
        t = rates[(rates["probe"] == probe) & (rates["objective"] == objective)].sort_values(
            "layer"
        )
        if t.empty:
            continue
        ax.plot(
            t["layer"], t["rate"], ls, color=colour, marker="o", ms=3, label=f"{probe}, {objective}"
        )
        ax.fill_between(t["layer"], t["ci_low"], t["ci_high"], color=colour, alpha=0.12, lw=0)
        _mark_fits(ax, t, colour)
    control = rates[rates["probe"] == "shuffled"].groupby("layer")["rate"].mean()
    if not control.empty:
        ax.plot(
            control.index, control.to_numpy(), ":", color="#999", label="shuffled-target control"
        )
    ax.set(ylabel="identifiability rate", ylim=(-0.02, 1.02), title=f"our run: {model}")
    _layer_axis(ax, n_layers)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))  # the fit marks once each
    ax.legend(unique.values(), unique.keys(), fontsize=7, ncol=2)
    ref = paper_reference()["fig2a_identifiability_rate_by_layer"]
    for key_pair, key in PAPER_PROBE_KEYS.items():
        colour, ls = PROBE_STYLES[key_pair]
        ys = ref[key]
        ax_paper.plot(range(len(ys)), ys, ls, color=colour, marker="o", ms=3, label=key)
    _layer_axis(ax_paper, len(ref["mlp_cos"]))
    ax_paper.set(ylabel="identifiability rate", ylim=(-0.02, 1.02))
    _paper_title(ax_paper, "Fig. 2a")
    ax_paper.legend(fontsize=7, ncol=2)
    return fig


def _mark_fits(ax: Axes, t: pd.DataFrame, colour: str) -> None:
    """Cross: a fit stopped by its cap while still improving; open circle: an MLP below the
    naive probe (a fitting failure). The verdicts leave both out."""
    if "converged" in t:
        bad = t[~t["converged"].astype(bool)]
        ax.scatter(
            bad["layer"],
            bad["rate"],
            marker="x",
            s=60,
            color=colour,
            zorder=5,
            label="unfinished fit (capped while improving)" if len(bad) else None,
        )
    if "fit_failure" in t:
        bad = t[t["fit_failure"].astype(bool)]
        ax.scatter(
            bad["layer"],
            bad["rate"],
            marker="o",
            s=70,
            facecolors="none",
            edgecolors=colour,
            zorder=5,
            label="fitting failure (MLP below naive)" if len(bad) else None,
        )


def fig2b_cross_layer(cross: pd.DataFrame, n_layers: int, model: str) -> Figure:
    """Linear cosine probe trained on one layer, tested on every layer; one panel per regime.

    cross: columns train_layer, test_layer, rate, and optionally regime (one heat map each,
    side by side, so the sensitivity to the fitting regime is visible).
    """
    if "regime" not in cross:
        cross = cross.assign(regime="converged")
    regimes = list(dict.fromkeys(cross["regime"]))
    fig, axes = _figure(len(regimes) + 1, width=4.6)
    im = None
    for ax, regime in zip(axes, regimes, strict=False):
        t = cross[cross["regime"] == regime]
        grid = t.pivot(index="train_layer", columns="test_layer", values="rate").sort_index()
        im = ax.imshow(
            grid.to_numpy(),
            vmin=0,
            vmax=1,
            cmap="viridis",
            origin="lower",
            aspect="auto",
            extent=(0.5, grid.shape[1] + 0.5, 0.5, grid.shape[0] + 0.5),
        )
        for (i, j), v in np.ndenumerate(grid.to_numpy()):
            ax.text(
                j + 1,
                i + 1,
                f"{v:.2f}",
                ha="center",
                va="center",
                fontsize=6,
                color="white" if v < 0.6 else "black",
            )
        ax.set(
            xlabel="tested on layer",
            ylabel="trained on layer",
            title=f"our run: {model}\nprobe fitted: {regime}",
        )
        ax.set_xticks(grid.columns.to_list())
        ax.set_yticks(grid.index.to_list())
    if im is not None:
        fig.colorbar(im, ax=axes[len(regimes) - 1], label="identifiability rate")
    ax_paper = axes[-1]
    ref = paper_reference()["fig2b_lin_cos_trained_on_layer_tested_on_all"]
    for key, ys in ref.items():
        ax_paper.plot(range(len(ys)), ys, "o-", ms=3, label=f"trained on layer {int(key[1:]) - 1}")
    _layer_axis(ax_paper, len(next(iter(ref.values()))))
    ax_paper.set(xlabel="tested on layer", ylabel="identifiability rate")
    _paper_title(ax_paper, "Fig. 2b")
    ax_paper.legend(fontsize=7)
    return fig


def _errorbar(ax: Axes, x: Any, y: Any, lo: Any, hi: Any, **kw: Any) -> None:
    y, lo, hi = (np.asarray(v, dtype=float) for v in (y, lo, hi))
    ax.errorbar(x, y, yerr=np.vstack([y - lo, hi - y]).clip(min=0), capsize=2, **kw)


def fig3a_own(summary: pd.DataFrame, n_layers: int, model: str) -> Figure:
    """Own-input contribution per layer: median and quartiles over tokens (percent), each with
    its 95 % bootstrap interval over sequences.

    summary: columns layer, q1, median, q3 and their _lo / _hi.
    """
    fig, (ax, ax_paper) = _figure(2)
    x = summary["layer"].to_numpy()
    ax.fill_between(
        x,
        summary["q1"],
        summary["q3"],
        color="#1f5fa8",
        alpha=0.12,
        lw=0,
        label="quartiles of tokens",
    )
    _errorbar(
        ax,
        x,
        summary["median"],
        summary["median_lo"],
        summary["median_hi"],
        fmt="o-",
        ms=3,
        color="#1f5fa8",
        label="median (95% CI over sequences)",
    )
    for q in ("q1", "q3"):
        _errorbar(
            ax,
            x,
            summary[q],
            summary[f"{q}_lo"],
            summary[f"{q}_hi"],
            fmt="_",
            ms=6,
            color="#1f5fa8",
            alpha=0.6,
        )
    ax.set(ylabel="contribution of the token's own input (%)", title=f"our run: {model}")
    _layer_axis(ax, n_layers)
    ax.legend(fontsize=7)
    ys = paper_reference()["fig3a_own_token_contribution_median_percent"]
    ax_paper.plot(range(len(ys)), ys, "o-", ms=3, color="#777", label="median")
    _layer_axis(ax_paper, len(ys))
    ax_paper.set(ylabel="median own contribution (%)")
    _paper_title(ax_paper, "Fig. 3a")
    return fig


def fig3b_not_top(summary: pd.DataFrame, model: str) -> Figure:
    """Percent of tokens whose own input is not their largest contributor (P̃), per layer,
    with 95 % bootstrap intervals over sequences.

    summary: columns layer, p_tilde, p_tilde_lo, p_tilde_hi.
    """
    fig, (ax, ax_paper) = _figure(2)
    y = summary["p_tilde"].to_numpy(dtype=float)
    err = np.vstack([y - summary["p_tilde_lo"], summary["p_tilde_hi"] - y]).clip(min=0)
    ax.bar(summary["layer"], y, color="#1f5fa8", yerr=err, capsize=3, ecolor="#333")
    ax.set(
        ylabel="tokens whose own input is not the top contributor (%)", title=f"our run: {model}"
    )
    _layer_axis(ax, len(summary))
    ys = paper_reference()["fig3b_percent_tokens_own_input_not_top_contributor"]
    ax_paper.bar(range(len(ys)), ys, color="#999")
    _layer_axis(ax_paper, len(ys))
    ax_paper.set(ylabel="percent of tokens")
    _paper_title(ax_paper, "Fig. 3b")
    return fig


def fig4a_groups(groups: pd.DataFrame, n_layers: int, model: str) -> Figure:
    """Contribution of neighbours by distance group per layer, with 95 % bootstrap bands.

    groups: columns layer, group (one of GROUPS), percent, and optionally percent_lo / _hi.
    """
    fig, (ax, ax_paper) = _figure(2)
    cmap = plt.get_cmap("viridis")
    for k, group in enumerate(GROUPS):
        t = groups[groups["group"] == group].sort_values("layer")
        colour = cmap(k / (len(GROUPS) - 1))
        ax.plot(t["layer"], t["percent"], "o-", ms=3, color=colour, label=f"{group} away")
        if "percent_lo" in t:
            ax.fill_between(
                t["layer"], t["percent_lo"], t["percent_hi"], color=colour, alpha=0.15, lw=0
            )
    ax.set(
        ylabel="relative contribution (%)", title=f"our run: {model}\n(normalisation: see the text)"
    )
    _layer_axis(ax, n_layers)
    ax.legend(fontsize=7, ncol=2)
    ref = paper_reference()["fig4a_relative_contribution_percent_by_neighbour_distance"]
    for k, group in enumerate(GROUPS):
        ys = ref[group]
        ax_paper.plot(
            range(len(ys)), ys, "o-", ms=3, color=cmap(k / (len(GROUPS) - 1)), label=group
        )
    _layer_axis(ax_paper, len(ref["1"]))
    ax_paper.set(ylabel="relative contribution (%)")
    _paper_title(ax_paper, "Fig. 4a (normalisation not stated)")
    return fig


def fig4b_positions(positions: pd.DataFrame, layers: list[int], model: str) -> Figure:
    """Total contribution per relative position, normalised to a maximum of 1 per layer,
    with 95 % bootstrap bands.

    positions: columns layer, offset, total, and optionally total_lo / total_hi.
    """
    fig, (ax,) = _figure(1, width=7.0)
    cmap = plt.get_cmap("viridis")
    for k, layer in enumerate(layers):
        t = positions[positions["layer"] == layer].sort_values("offset")
        colour = cmap(k / max(1, len(layers) - 1))
        ax.plot(t["offset"], t["total"], "-", lw=1.2, color=colour, label=f"layer {layer}")
        if "total_lo" in t:
            ax.fill_between(
                t["offset"], t["total_lo"], t["total_hi"], color=colour, alpha=0.15, lw=0
            )
    ax.set(
        xlabel="relative position of the contributing input (j − i)",
        ylabel="total contribution (max = 1)",
        title=f"our run: {model}\n(the paper shows BERT-base's layers 0, 5 and 11, without values to compare)",
    )
    ax.legend(fontsize=7.5)
    return fig
