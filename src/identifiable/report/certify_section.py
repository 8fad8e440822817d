"""Report section "Beyond the paper: how far can attention really move?".

Renders the tables of the certify stage (experiments/certify.py): one figure and
verdicts computed from the tables. Computes no science; imports only pandas,
matplotlib and report helpers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from identifiable.report.claims import NOT_TESTED, Verdict
from identifiable.report.verdicts import binomial_interval, median_interval, one_test, side

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TITLE = "Beyond the paper: how far can attention really move?"
NARROW = 0.1  # a median widest interval below this counts as "attention is pinned"


def movement_figure(rows: pd.DataFrame, model: str) -> Figure:
    """Interval width and movable mass against sequence length and layer, beside the
    paper-variant effective attention's L1 movement on the same rows."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 3.8), layout="constrained")
    ax_len, ax_layer = fig.subplots(1, 2)
    live = rows[rows["null_dim"] > 0]
    by_len = live.groupby("length")[
        ["width_max", "width_mean", "movable_mass", "l1_effective"]
    ].mean()
    by_layer = live.groupby("layer")[
        ["width_max", "width_mean", "movable_mass", "l1_effective"]
    ].mean()
    styles = {
        "width_max": ("widest interval", "C0", "-"),
        "width_mean": ("mean interval width", "C0", ":"),
        "movable_mass": ("movable mass (bound on ½‖ã − a‖₁)", "C2", "-"),
        "l1_effective": ("paper A_eff: ‖A_eff − A‖₁", "C3", "--"),
    }
    for ax, table, xlabel in ((ax_len, by_len, "sequence length n"), (ax_layer, by_layer, "layer")):
        for col, (label, color, ls) in styles.items():
            ax.plot(table.index, table[col], ls, color=color, marker="o", ms=3, label=label)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    ax_len.set_ylabel("mass / weight")
    ax_len.legend(fontsize=8)
    fig.suptitle(f"{model}: how far valid attention can move vs the paper's effective attention")
    return fig


def main_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per layer: rows, mean null dim, widest and mean interval, movable mass and both L1s."""
    cols = ["null_dim", "width_max", "width_mean", "movable_mass", "l1_effective", "l1_constrained"]
    out = rows.groupby("layer")[cols].mean()
    out.insert(0, "rows", rows.groupby("layer").size())
    return out.reset_index()


def claim_pinned(rows: pd.DataFrame) -> Verdict:
    """Supported when rows with a null space (dim LN([T,1]) > 0) have a median widest
    interval below NARROW, its exact distribution-free 95 % interval (`median_interval`,
    rows taken as independent) lying below it: the simplex pins attention far more than the
    null space suggests. Not supported when the interval lies at or above NARROW; not
    settled when it straddles."""
    live = rows[rows["null_dim"] > 0]
    if live.empty:
        return Verdict("certify_pinned", NOT_TESTED, "Not tested: no sampled row has a null space.")
    med_dim, med_w, mean_w = (
        live["null_dim"].median(),
        live["width_max"].median(),
        live["width_mean"].mean(),
    )
    lo, hi = median_interval(live["width_max"])
    ok = side(lo, hi, NARROW, below=True) if hi != NARROW else None
    status = one_test(ok)
    numbers = {
        "median_null_dim": float(med_dim),
        "median_width_max": float(med_w),
        "median_width_max_lo": lo,
        "median_width_max_hi": hi,
        "mean_width": float(mean_w),
        "rows": len(live),
    }
    sentence = (
        f"{status.capitalize()}: over {len(live)} rows with a null space (median dim LN([T,1]) = "
        f"{med_dim:.0f}), the median widest interval is {med_w:.3f} (exact 95% interval {lo:.3f} … "
        f"{hi:.3f}; test: below {NARROW}) and the mean interval width {mean_w:.4f}: "
        + (
            "valid attention rows can barely move, so attention is far more identifiable than "
            "the null-space dimension suggests."
            if ok
            else f"the widest intervals are not below {NARROW}, so the simplex does not pin attention here."
            if ok is False
            else "the sample cannot tell whether attention is pinned."
        )
    )
    return Verdict("certify_pinned", status, sentence, numbers)


def claim_effective_overshoots(rows: pd.DataFrame) -> Verdict:
    """Supported when in most rows with a null space the paper's A_eff is farther from the
    raw row (L1) than any valid row can be: ‖A_eff − A‖₁ > 2 · movable mass, since every
    valid ã has ½‖ã − a‖₁ ≤ movable mass. "Most" on an exact binomial 95 % interval: above
    one half (supported), below it (not supported), or straddling it (not settled)."""
    live = rows[rows["null_dim"] > 0]
    if live.empty:
        return Verdict(
            "certify_overshoot", NOT_TESTED, "Not tested: no sampled row has a null space."
        )
    k = int((live["l1_effective"] > 2 * live["movable_mass"]).sum())
    frac = k / len(live)
    lo, hi = binomial_interval(k, len(live))
    ok = True if lo > 0.5 else False if hi < 0.5 else None
    status = one_test(ok)
    numbers = {
        "fraction": frac,
        "fraction_lo": lo,
        "fraction_hi": hi,
        "rows_overshooting": k,
        "median_l1_effective": float(live["l1_effective"].median()),
        "median_movable_mass": float(live["movable_mass"].median()),
        "rows": len(live),
    }
    sentence = (
        f"{status.capitalize()}: in {k} of {len(live)} rows ({frac:.1%}, exact binomial 95% interval "
        f"{lo:.3f} … {hi:.3f}; test: the interval above one half) the paper's effective attention "
        f"moves further from raw attention (median L1 {numbers['median_l1_effective']:.3f}) than any "
        f"valid attention row could (median movable mass {numbers['median_movable_mass']:.3f}, L1 at "
        "most twice that)"
        + (
            ": its movement is mostly outside the set of attention rows."
            if ok
            else ": in most rows it stays within reach of valid rows."
            if ok is False
            else ": the sample cannot tell whether that holds in most rows."
        )
    )
    return Verdict("certify_overshoot", status, sentence, numbers)


def claim_constrained_is_closer(rows: pd.DataFrame) -> Verdict:
    """Supported when the constrained effective attention moves less (L1) than the paper
    variant on rows with a null space: the exact distribution-free 95 % interval of the
    median paired difference (constrained − paper) lies below zero; not supported when it
    lies at or above zero; not settled when it straddles."""
    live = rows[rows["null_dim"] > 0]
    if live.empty:
        return Verdict(
            "certify_constrained", NOT_TESTED, "Not tested: no sampled row has a null space."
        )
    med_c, med_e = float(live["l1_constrained"].median()), float(live["l1_effective"].median())
    lo, hi = median_interval(live["l1_constrained"] - live["l1_effective"])
    ok = True if hi < 0 else False if lo >= 0 else None
    status = one_test(ok)
    sentence = (
        f"{status.capitalize()}: the constrained effective attention (a distribution with the same "
        f"output) moves a median L1 of {med_c:.3f} from raw attention, against {med_e:.3f} for the "
        f"paper variant (median paired difference, exact 95% interval {lo:+.3f} … {hi:+.3f}; test: "
        "below zero)"
        + (
            "."
            if ok
            else ": the constraint does not reduce the movement here."
            if ok is False
            else ": the sample cannot tell."
        )
    )
    return Verdict(
        "certify_constrained",
        status,
        sentence,
        {
            "median_l1_constrained": med_c,
            "median_l1_effective": med_e,
            "median_difference_lo": lo,
            "median_difference_hi": hi,
        },
    )


def verdicts(rows: pd.DataFrame) -> list[Verdict]:
    return [claim_pinned(rows), claim_effective_overshoots(rows), claim_constrained_is_closer(rows)]
