"""Report section "Beyond the paper: decoders, causal rows and the attention sink".

Renders the attention stage's decoder tables (`experiments.attention.CausalRows`, causal
models only): Fig. 1 adapted to causal rows (null-space dimension and the row's share in the
null space against prefix length) and the sink table (raw against effective attention on
the first token, per layer), with one verdict computed from the tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from identifiable.report.section import Section
from identifiable.report.verdicts import (
    NOT_TESTED,
    Verdict,
    judged,
    median_interval,
    one_test,
    outcome,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TITLE = "9. Beyond the paper: decoders, causal rows and the attention sink"
SINK = 0.2  # a head whose mean raw attention on the first token reaches this is a sink head
MOST = 0.5  # "most of the sink": the null share of the sink heads' first-token mass


def sink_table(sinks: pd.DataFrame) -> pd.DataFrame:
    """Per layer: the means over heads (each head averaged over sequences) of raw and
    effective attention on the first token, their difference `null`, and the largest head's
    raw mass `raw_max`: the scan's sink table, pooled over the run's sequences; then the
    means of raw and effective over the rows with a null space only (NaN without any)."""
    cols = ["raw", "effective", "raw_null_rows", "effective_null_rows"]
    heads = sinks.groupby(["layer", "head"], as_index=False)[cols].mean()
    out = heads.groupby("layer").agg(
        raw=("raw", "mean"),
        effective=("effective", "mean"),
        raw_max=("raw", "max"),
        raw_null_rows=("raw_null_rows", "mean"),
        effective_null_rows=("effective_null_rows", "mean"),
    )
    out.insert(2, "null", out["raw"] - out["effective"])
    return out.reset_index()


def prefix_table(by_prefix: pd.DataFrame) -> pd.DataFrame:
    """Per prefix length: sequences, and the means over them of null_dim and null_fraction."""
    return (
        by_prefix.groupby("prefix")
        .agg(
            sequences=("seq", "nunique"),
            null_dim=("null_dim", "mean"),
            null_fraction=("null_fraction", "mean"),
        )
        .reset_index()
    )


def claim_sink_is_null(sinks: pd.DataFrame) -> Verdict:
    """Supported when, in the rows whose attention is not identifiable (dim LN(T≤i) > 0),
    most of the sink heads' attention on the first token lies in the null space. Sink
    heads: (layer, head) whose raw mass on the first token in those rows, averaged over
    sequences, is at least SINK. Per sequence, the null share Σ (raw − effective) / Σ raw
    over the sink heads; supported when the exact 95 % interval of its median over sequences
    (`median_interval`) lies above MOST, not supported when it lies at or below, not settled
    when it straddles. Not tested without such rows or without a sink head."""
    live = sinks[sinks["null_rows"] > 0]
    if live.empty:
        return Verdict(
            "decoder_sink",
            NOT_TESTED,
            "Not tested: no row has a null space (no sequence is longer than the head width), "
            "so effective attention equals raw attention everywhere.",
            {"sink_heads": 0},
        )
    heads = live.groupby(["layer", "head"])["raw_null_rows"].mean()
    chosen = heads[heads >= SINK].index
    if not len(chosen):
        return Verdict(
            "decoder_sink",
            NOT_TESTED,
            f"Not tested: no head puts {SINK} of its attention on the first token in the rows "
            f"with a null space (largest mean {float(heads.max()):.3f}): no sink to split.",
            {"sink_heads": 0, "largest_raw": float(heads.max())},
        )
    cells = live.set_index(["layer", "head"]).loc[chosen].reset_index()
    raw, eff = cells["raw_null_rows"], cells["effective_null_rows"]
    per_seq = (raw - eff).groupby(cells["seq"]).sum() / raw.groupby(cells["seq"]).sum()
    share = float(np.median(per_seq))
    lo, hi = median_interval(per_seq)
    ok = True if lo > MOST else False if hi <= MOST else None
    status = one_test(ok)
    sentence = (
        f"in the rows with a null space, {len(chosen)} sink heads put a mean {raw.mean():.3f} of "
        f"their raw attention on the first token and {eff.mean():.3f} of their effective "
        f"attention; the median over {len(per_seq)} sequences of the share in the null space is "
        f"{share:.1%} (exact 95% interval {lo:.1%} … {hi:.1%}; test: above {MOST:.0%})"
        + outcome(
            ok,
            ": most of the sink does not reach the heads' outputs.",
            ": most of the sink reaches the heads' outputs.",
        )
    )
    numbers = {
        "sink_heads": len(chosen),
        "null_share": share,
        "null_share_lo": lo,
        "null_share_hi": hi,
        "mean_raw": float(raw.mean()),
        "mean_effective": float(eff.mean()),
        "sequences": len(per_seq),
    }
    return judged("decoder_sink", status, sentence, numbers)


def rows_figure(prefix: pd.DataFrame, d_v: int, model: str) -> Figure:
    """Fig. 1 for causal rows: dim LN(T_{≤i}) and the row's null share against prefix length."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.6), layout="constrained")
    ax_dim, ax_share = fig.subplots(1, 2)
    p = prefix["prefix"].to_numpy()
    ax_dim.plot(p, prefix["null_dim"], color="#d1495b", label="measured (mean over heads)")
    ax_dim.plot(p, np.maximum(p - d_v, 0), color="#444", lw=1, label="lower bound max(0, p − d_v)")
    ax_dim.set(xlabel="prefix length p = i + 1", ylabel="dim LN(T≤i)", title=model)
    ax_dim.legend(fontsize=7.5)
    ax_share.plot(p, prefix["null_fraction"], color="#1f5fa8")
    ax_share.set(
        xlabel="prefix length p = i + 1",
        ylabel="‖a − ã‖ / ‖a‖ (row in the null space)",
        title="raw against effective attention, per row",
    )
    for ax in (ax_dim, ax_share):
        ax.axvline(d_v, color="#444", lw=1, ls=":")
        ax.grid(alpha=0.3)
    return fig


def sinks_figure(table: pd.DataFrame, model: str) -> Figure:
    """Per layer: raw and effective attention on the first token (means over heads), over
    every row (solid) and over the rows with a null space (dashed)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.6), layout="constrained")
    ax = fig.subplots()
    ax.plot(table["layer"], table["raw"], "o-", ms=3, color="#d1495b", label="raw A (mean)")
    ax.plot(
        table["layer"],
        table["raw_max"],
        "^",
        ms=3,
        color="#d1495b",
        alpha=0.5,
        label="raw A (largest head)",
    )
    ax.plot(
        table["layer"],
        table["effective"],
        "o-",
        ms=3,
        color="#1f5fa8",
        label="effective A_eff (mean)",
    )
    for col, color, label in (
        ("raw_null_rows", "#d1495b", "raw A, rows with a null space"),
        ("effective_null_rows", "#1f5fa8", "effective A_eff, rows with a null space"),
    ):
        ax.plot(table["layer"], table[col], "--", lw=1, color=color, label=label)
    ax.axhline(0, color="#999", lw=0.8)
    ax.set(xlabel="layer", ylabel="attention on the first token", title=f"{model}: the sink")
    ax.legend(fontsize=7.5)
    ax.grid(alpha=0.3)
    return fig


def section(tables: dict[str, pd.DataFrame], info: Any, fig: Any) -> Section:
    """The decoder section; `fig(stem, figure, caption)` writes a figure."""
    sinks, prefix = tables["decoder_sinks"], prefix_table(tables["decoder_by_prefix"])
    table, d_v = sink_table(sinks), int(info.head_dim)
    n_seq = int(sinks["seq"].nunique()) if len(sinks) else 0
    lengths = f"{int(sinks['length'].min())}–{int(sinks['length'].max())}" if n_seq else "—"
    caption = f"{n_seq} sequences of {lengths} tokens; paper variant, float64."
    return Section(
        "decoder",
        TITLE,
        "In a decoder, query row i sees only the first i + 1 tokens, so its attention is not "
        "identifiable once the prefix is longer than the head width: the same head output "
        "allows a (p − d_v)-dimensional family of rows. Trained decoders park much of their "
        "attention on the first token (a sink); if that weight lies in the null space, it "
        "does not reach the output.",
        f"Left: for each prefix length p, the null-space dimension of the row's keys (mean over "
        f"heads and layers) against its lower bound p − d_v (d_v = {d_v}), and the share of "
        "the row that lies in the null space. Right: attention on the first token per layer, "
        "raw against effective (means over heads and sequences; the table is the scan's sink "
        "table), over every row (solid) and over the rows with a null space only (dashed), "
        "where the two can differ. Effective attention can be negative.",
        [
            fig("decoder_rows", rows_figure(prefix, d_v, info.name), "Causal rows. " + caption),
            fig("decoder_sinks", sinks_figure(table, info.name), "The sink. " + caption),
        ],
        [claim_sink_is_null(sinks)],
        [("decoder_sink_table (per layer)", table), ("decoder_by_prefix (means)", prefix)],
    )
