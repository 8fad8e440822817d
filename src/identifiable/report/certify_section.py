"""Report section "Beyond the paper: how far can attention really move?".

Renders the tables of the certify stage (experiments/certify.py): one figure and
verdicts computed from the tables. Computes no science; imports only pandas,
matplotlib and report helpers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from identifiable.report.claims import NOT_SUPPORTED, NOT_TESTED, SUPPORTED, Verdict

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
    interval below NARROW: the simplex pins attention far more than the null space suggests."""
    live = rows[rows["null_dim"] > 0]
    if live.empty:
        return Verdict("certify_pinned", NOT_TESTED, "Not tested: no sampled row has a null space.")
    med_dim, med_w, mean_w = (
        live["null_dim"].median(),
        live["width_max"].median(),
        live["width_mean"].mean(),
    )
    numbers = {"median_null_dim": float(med_dim), "median_width_max": float(med_w),
               "mean_width": float(mean_w), "rows": len(live)}  # fmt: skip
    ok = bool(med_w < NARROW)
    sentence = (
        f"Over {len(live)} rows with a null space (median dim LN([T,1]) = {med_dim:.0f}), the "
        f"median widest interval is {med_w:.3f} and the mean interval width {mean_w:.4f}: "
        + ("valid attention rows can barely move, so attention is far more identifiable than "
           "the null-space dimension suggests." if ok else
           f"the widest intervals are not below {NARROW}, so the simplex does not pin attention here.")
    )  # fmt: skip
    return Verdict("certify_pinned", SUPPORTED if ok else NOT_SUPPORTED, sentence, numbers)


def claim_effective_overshoots(rows: pd.DataFrame) -> Verdict:
    """Supported when in most rows with a null space the paper's A_eff is farther from the
    raw row (L1) than any valid row can be: ‖A_eff − A‖₁ > 2 · movable mass, since every
    valid ã has ½‖ã − a‖₁ ≤ movable mass."""
    live = rows[rows["null_dim"] > 0]
    if live.empty:
        return Verdict(
            "certify_overshoot", NOT_TESTED, "Not tested: no sampled row has a null space."
        )
    frac = float((live["l1_effective"] > 2 * live["movable_mass"]).mean())
    numbers = {"fraction": frac, "median_l1_effective": float(live["l1_effective"].median()),
               "median_movable_mass": float(live["movable_mass"].median()), "rows": len(live)}  # fmt: skip
    ok = frac > 0.5
    sentence = (
        f"In {frac:.0%} of {len(live)} rows the paper's effective attention moves further from raw "
        f"attention (median L1 {numbers['median_l1_effective']:.3f}) than any valid attention row "
        f"could (median movable mass {numbers['median_movable_mass']:.3f}, L1 at most twice that)"
        + (": its movement is mostly outside the set of attention rows." if ok else
           ": in most rows it stays within reach of valid rows.")
    )  # fmt: skip
    return Verdict("certify_overshoot", SUPPORTED if ok else NOT_SUPPORTED, sentence, numbers)


def claim_constrained_is_closer(rows: pd.DataFrame) -> Verdict:
    """Supported when the constrained effective attention moves less (L1, median) than the
    paper variant on rows with a null space."""
    live = rows[rows["null_dim"] > 0]
    if live.empty:
        return Verdict(
            "certify_constrained", NOT_TESTED, "Not tested: no sampled row has a null space."
        )
    med_c, med_e = float(live["l1_constrained"].median()), float(live["l1_effective"].median())
    ok = med_c < med_e
    sentence = (
        f"The constrained effective attention (a distribution with the same output) moves a median "
        f"L1 of {med_c:.3f} from raw attention, against {med_e:.3f} for the paper variant"
        + ("." if ok else ": the constraint does not reduce the movement here.")
    )
    return Verdict("certify_constrained", SUPPORTED if ok else NOT_SUPPORTED, sentence,
                   {"median_l1_constrained": med_c, "median_l1_effective": med_e})  # fmt: skip


def verdicts(rows: pd.DataFrame) -> list[Verdict]:
    return [claim_pinned(rows), claim_effective_overshoots(rows), claim_constrained_is_closer(rows)]
