"""Report section "Beyond the paper: how uncertain is attention?".

Renders the tables of the posterior stage (experiments/posterior.py): the posterior over the
valid attention rows of sampled query rows (uniform prior) against their certified
intervals, beside the paper's A_eff and the constrained row; one figure and two verdicts
read off the tables. Rows the stage flagged (R̂ > 1.01, too few effective samples, stopped)
are drawn and listed as flagged and left out of the verdicts, with a count. Computes no
science; imports only pandas, matplotlib and report helpers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from identifiable.report.section import Section
from identifiable.report.verdicts import (
    NOT_TESTED,
    Verdict,
    binomial_interval,
    judged,
    median_interval,
    one_test,
    outcome,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TITLE = "8. Beyond the paper: how uncertain is attention?"
HALF = 0.5  # "well inside the worst case": a credible band under half the certified interval
MOST = 0.5  # "in most rows"
FLAGGED = "#d1495b"
FLAG_WORDS = "flagged (R̂ > 1.01, ESS short or stopped)"


def split(rows: pd.DataFrame) -> tuple[pd.DataFrame, int, int]:
    """The rows a verdict may use (a null space and a sound posterior), and the counts left
    out: flagged rows with a null space, and points (no null space: the posterior is the
    raw row)."""
    live = rows[rows["null_dim"] > 0]
    flagged = live["flagged"].astype(bool)
    return live[~flagged], int(flagged.sum()), int((rows["null_dim"] == 0).sum())


def _left_out(flagged: int, points: int) -> str:
    return (
        f"{flagged} flagged row{'s' * (flagged != 1)} left out; {points} row"
        f"{'s' * (points != 1)} without a null space"
    )


def claim_band_inside(rows: pd.DataFrame) -> Verdict:
    """Supported when the 95 % credible band of a row's widest weight is under HALF of its
    certified interval in the typical row: the median of width_ratio (credible_max /
    certified_max) over the sound rows with a null space has its exact distribution-free
    95 % interval (`median_interval`, rows taken as independent) below HALF; not supported
    when that interval lies at or above HALF; not settled when it straddles. The worst
    case then overstates how far a typical valid row moves."""
    used, flagged, points = split(rows)
    ratio = used["width_ratio"].dropna()
    if ratio.empty:
        return Verdict(
            "posterior_band",
            NOT_TESTED,
            "Not tested: no sampled row with a null space has a sound posterior "
            f"({_left_out(flagged, points)}).",
            {"rows": 0, "flagged": flagged, "points": points},
        )
    med = float(ratio.median())
    lo, hi = median_interval(ratio)
    ok = True if hi < HALF else False if lo >= HALF else None
    status = one_test(ok)
    sentence = (
        f"over {len(ratio)} rows with a null space and a sound posterior ("
        f"{_left_out(flagged, points)}), the 95% credible band of a row's widest weight spans "
        f"a median {med:.3f} of its certified interval (exact 95% interval {lo:.3f} … "
        f"{hi:.3f}; test: below {HALF})"
        + outcome(
            ok,
            ": most valid rows lie well inside the worst case, so the certified intervals "
            "overstate how far attention typically moves.",
            ": valid rows spread over half of the certified interval or more, so the worst "
            "case is a fair guide to the typical uncertainty.",
        )
    )
    numbers = {
        "median_ratio": med,
        "median_ratio_lo": lo,
        "median_ratio_hi": hi,
        "rows": len(ratio),
        "flagged": flagged,
        "points": points,
    }
    return judged("posterior_band", status, sentence, numbers)


def claim_top_key_settled(rows: pd.DataFrame) -> Verdict:
    """Supported when the raw top key is settled (P(it stays on top) ≥ 0.95 under the
    uniform posterior, the stage's `settled`) in most sound rows with a null space: the
    exact binomial 95 % interval of the unsettled share lies below MOST; not supported when
    it lies above; not settled when it straddles. The sentence sets beside it how often the
    paper's A_eff and the constrained row put their largest weight on another key."""
    used, flagged, points = split(rows)
    if used.empty:
        return Verdict(
            "posterior_top",
            NOT_TESTED,
            "Not tested: no sampled row with a null space has a sound posterior "
            f"({_left_out(flagged, points)}).",
            {"rows": 0, "flagged": flagged, "points": points},
        )
    n, k = len(used), int((~used["settled"].astype(bool)).sum())
    lo, hi = binomial_interval(k, n)
    ok = True if hi < MOST else False if lo > MOST else None
    status = one_test(ok)
    eff = float((used["top_effective"] != used["top_key"]).mean())
    con = float((used["top_constrained"] != used["top_key"]).mean())
    sentence = (
        f"in {k} of {n} rows with a null space and a sound posterior ({k / n:.1%}, exact "
        f"binomial 95% interval {lo:.3f} … {hi:.3f}; test: below one half; "
        f"{_left_out(flagged, points)}) the raw top key stays on top with a probability "
        f"below 0.95 when every valid row is equally likely; the paper's A_eff puts its "
        f"largest weight on another key in {eff:.1%} of these rows, the constrained row in "
        f"{con:.1%}"
        + outcome(
            ok,
            ": where the weights are not identifiable, the top key mostly still is.",
            ": in most rows the data cannot say which key the head attends to most.",
        )
    )
    numbers = {
        "unsettled": k / n,
        "unsettled_lo": lo,
        "unsettled_hi": hi,
        "rows": n,
        "effective_moves_top": eff,
        "constrained_moves_top": con,
        "flagged": flagged,
        "points": points,
    }
    return judged("posterior_top", status, sentence, numbers)


def verdicts(rows: pd.DataFrame) -> list[Verdict]:
    return [claim_band_inside(rows), claim_top_key_settled(rows)]


def uncertainty_figure(rows: pd.DataFrame, by_layer: pd.DataFrame, model: str) -> Figure:
    """Left: credible band against certified interval (the widest weight of each row);
    middle: both against sequence length; right: per layer, the share of rows whose top key
    is not settled beside the shares whose top key A_eff and the constrained row move.
    Flagged rows are drawn as red crosses and left out of the means and shares."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 3.9), layout="constrained")
    ax_cert, ax_len, ax_top = fig.subplots(1, 3)
    live = rows[rows["null_dim"] > 0]
    bad = live["flagged"].astype(bool)
    sound, flagged = live[~bad], live[bad]
    ax_cert.scatter(
        sound["certified_max"],
        sound["credible_max"],
        s=9,
        color="C0",
        alpha=0.6,
        label="row (sound)",
    )
    _flagged(ax_cert, flagged["certified_max"], flagged["credible_max"])
    top = float(live["certified_max"].max()) if len(live) else 1.0
    ax_cert.plot([0, top], [0, top], color="#444", lw=1, label="band = certified interval")
    ax_cert.plot([0, top], [0, HALF * top], ":", color="#444", lw=1, label="half of it")
    ax_cert.set(xlabel="certified interval, widest weight", ylabel="95% credible band")
    ax_len.scatter(
        sound["length"],
        sound["certified_max"],
        s=9,
        color="#999",
        alpha=0.6,
        label="certified interval",
    )
    ax_len.scatter(
        sound["length"], sound["credible_max"], s=9, color="C0", alpha=0.6, label="credible band"
    )
    _flagged(ax_len, flagged["length"], flagged["credible_max"])
    means = sound.groupby("length")[["certified_max", "credible_max"]].mean()
    ax_len.plot(means.index, means["certified_max"], "-", color="#666", lw=1)
    ax_len.plot(means.index, means["credible_max"], "-", color="C0", lw=1)
    ax_len.set(xlabel="sequence length n", ylabel="widest weight: width")
    layers = by_layer["layer"]
    ax_top.bar(
        layers,
        by_layer["unsettled"],
        color="C0",
        alpha=0.7,
        label="top key not settled (P(stays) < 0.95)",
    )
    ax_top.plot(
        layers,
        by_layer["effective_moves_top"],
        "s--",
        ms=4,
        color="C3",
        label="paper A_eff: another top key",
    )
    ax_top.plot(
        layers,
        by_layer["constrained_moves_top"],
        "^:",
        ms=4,
        color="C2",
        label="constrained row: another top key",
    )
    ax_top.set(xlabel="layer", ylabel="share of sound rows", ylim=(0, 1))
    for ax in (ax_cert, ax_len, ax_top):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{model}: the posterior over valid attention rows against the worst case")
    return fig


def _flagged(ax: Any, x: pd.Series, y: pd.Series) -> None:
    if len(x):
        ax.scatter(x, y, s=22, marker="x", color=FLAGGED, label=FLAG_WORDS)


def flagged_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The flagged rows, each with its diagnostics and flags in words."""
    cols = ["seq", "layer", "head", "query", "null_dim", "ess", "rhat", "draws", "flag_text"]
    return rows[rows["flagged"].astype(bool)][cols].reset_index(drop=True)


def section(tables: dict[str, pd.DataFrame], info: Any, fig: Any) -> Section:
    """The posterior section; `fig(stem, figure, caption)` writes a figure."""
    rows, by_layer = tables["posterior_rows"], tables["posterior_by_layer"]
    n_seq = int(rows["seq"].nunique()) if len(rows) else 0
    lengths = f"{int(rows['length'].min())}–{int(rows['length'].max())}" if n_seq else "—"
    _, flagged, points = split(rows)
    caption = (
        f"Attention posterior. {len(rows)} sampled rows of {n_seq} sequences of {lengths} "
        f"tokens (every head of every layer; uniform prior, 4 chains); {flagged} flagged rows "
        f"(red crosses), {points} without a null space."
    )
    return Section(
        "posterior",
        TITLE,
        "Certified intervals are worst cases: the lowest and highest weight any attention row "
        "with the same head output can give a key. Taking every such row as equally likely "
        "(a uniform posterior over them) says how far a typical valid row moves, and how "
        "likely the raw row's top key is to stay on top.",
        "Left: the 95% credible band of each row's widest weight against its certified "
        "interval (the line: equal; dotted: half). Middle: both against sequence length. "
        "Right: per layer, the share of rows whose top key is not settled (P(it stays on "
        "top) < 0.95) beside the shares of rows where the paper's effective attention and "
        "the constrained effective attention put their largest weight on another key. "
        "Rows whose chains did not converge (split-R̂ > 1.01) or fell short of their "
        "effective samples are flagged: drawn as red crosses, listed below and left out of "
        "the verdicts. Definitions: docs/posterior.md.",
        [fig("posterior_uncertainty", uncertainty_figure(rows, by_layer, info.name), caption)],
        verdicts(rows),
        [("posterior_by_layer", by_layer), ("posterior_flagged", flagged_table(rows))],
    )
