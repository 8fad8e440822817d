"""The bootstrap summaries of the attribution stage (Figs. 3-4), and its estimator summary.

Every plotted statistic gets a 95 % percentile interval over sequences resampled with
replacement (`bootstrap_summaries`); `estimator_summary` records the estimator and the
sample sizes. Called by `experiments.attribution.attribution_reduce`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from identifiable.attribution.stats import DISTANCE_GROUPS

BOOTSTRAP_RESAMPLES = 1000


def _expanded_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> np.ndarray:
    """Quantile q of `values` `[T]` (sorted) repeated `weights` `[B, T]` times, per row b.

    Linear interpolation between order statistics, as numpy's and pandas' default, so that
    all-ones weights give exactly `np.quantile(values, q)`.
    """
    cum = np.cumsum(weights, axis=1)  # [B, T]
    total = cum[:, -1]
    pos = (total - 1) * q
    lo, hi = np.floor(pos), np.ceil(pos)
    i_lo = (cum <= lo[:, None]).sum(1)
    i_hi = (cum <= hi[:, None]).sum(1)
    v_lo, v_hi = (
        values[np.minimum(i_lo, len(values) - 1)],
        values[np.minimum(i_hi, len(values) - 1)],
    )
    return v_lo + (pos - lo) * (v_hi - v_lo)


def _interval(samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Percentile 95 % interval over the first axis."""
    return np.nanpercentile(samples, 2.5, axis=0), np.nanpercentile(samples, 97.5, axis=0)


@dataclass(frozen=True)
class _Resamples:
    """The bootstrap over sequences: `counts[b, s]` is how often resample b draws sequence
    s (`ones` is the point estimate's single draw of each), `slot` maps a seq id to s."""

    counts: np.ndarray  # [B, S]
    ones: np.ndarray  # [1, S]
    slot: dict[Any, int]

    @property
    def n_seq(self) -> int:
        return self.ones.shape[1]


def _own_rows(own: pd.DataFrame, r: _Resamples) -> list[dict[str, Any]]:
    """own_summary: quartiles of c^l_{i,i} and p_tilde per layer, with intervals."""
    n_seq, slot, ones, counts = r.n_seq, r.slot, r.ones, r.counts
    own_rows = []
    for layer, t in own.groupby("layer", sort=True):
        order = np.argsort(t["own"].to_numpy(), kind="stable")
        values = t["own"].to_numpy()[order] * 100
        where = np.array([slot[s] for s in t["seq"].to_numpy()[order]])
        row: dict[str, Any] = {
            "layer": int(layer),
            "n_sequences": n_seq,
            "n_tokens": len(t),
        }
        for name, q in (("q1", 0.25), ("median", 0.5), ("q3", 0.75)):
            row[name] = float(_expanded_quantile(values, ones[:, where], q)[0])
            lo, hi = _interval(_expanded_quantile(values, counts[:, where], q))
            row[f"{name}_lo"], row[f"{name}_hi"] = float(lo), float(hi)
        not_top = (~t["own_is_top"].astype(bool)).to_numpy()
        per_seq_k = np.bincount([slot[s] for s in t["seq"]], weights=not_top, minlength=n_seq)
        per_seq_n = np.bincount([slot[s] for s in t["seq"]], minlength=n_seq)
        row["p_tilde"] = float(100 * per_seq_k.sum() / per_seq_n.sum())
        lo, hi = _interval(100 * (counts @ per_seq_k) / (counts @ per_seq_n))
        row["p_tilde_lo"], row["p_tilde_hi"] = float(lo), float(hi)
        own_rows.append(row)
    return own_rows


def _group_percent(
    t: pd.DataFrame, slot: dict[Any, int], n_seq: int, labels: list[str]
) -> Callable[[np.ndarray], np.ndarray]:
    """Sequence weights `[B, S]` → every distance group's percent `[B, groups]` at one layer
    (rows of `t`: seq, group, per_position_sum, tokens), normalised as Fig. 4a is
    (`report.claims.GROUP_NORMALISATION`)."""
    sums = np.zeros((n_seq, len(labels)))
    toks = np.zeros((n_seq, len(labels)))
    for s, g, v, k in t[["seq", "group", "per_position_sum", "tokens"]].itertuples(index=False):
        sums[slot[s], labels.index(g)] += v
        toks[slot[s], labels.index(g)] += k

    def percent(w: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = (w @ sums) / np.where(w @ toks > 0, w @ toks, np.nan)
            return 100 * mean / np.nansum(mean, axis=1, keepdims=True)

    return percent


def _group_rows(groups: pd.DataFrame, r: _Resamples) -> list[dict[str, Any]]:
    """groups_summary: each distance group's percent per layer, with intervals."""
    n_seq, slot, ones, counts = r.n_seq, r.slot, r.ones, r.counts
    labels = [label for label, _, _ in DISTANCE_GROUPS]
    group_rows = []
    for layer, t in groups.groupby("layer", sort=True):
        percent = _group_percent(t, slot, n_seq, labels)
        point = percent(ones.astype(float))[0]
        lo, hi = _interval(percent(counts.astype(float)))
        group_rows += [
            {
                "layer": int(layer),
                "group": g,
                "percent": float(point[k]),
                "percent_lo": float(lo[k]),
                "percent_hi": float(hi[k]),
            }
            for k, g in enumerate(labels)
        ]
    return group_rows


def _offset_rows(off: pd.DataFrame, r: _Resamples) -> list[dict[str, Any]]:
    """offsets_summary: totals by relative position (max 1 per layer), with intervals."""
    slot, ones, counts, n_seq = r.slot, r.ones, r.counts, r.n_seq
    offset_rows = []
    for layer, t in off.groupby("layer", sort=True):
        keys = np.array(sorted(t["offset"].unique()))
        col = {o: k for k, o in enumerate(keys)}
        totals = np.zeros((n_seq, len(keys)))
        for s, o, v in t[["seq", "offset", "total"]].itertuples(index=False):
            totals[slot[s], col[o]] += v

        def normalised(w: np.ndarray, totals=totals) -> np.ndarray:
            agg = w @ totals
            return agg / np.maximum(agg.max(axis=1, keepdims=True), 1e-300)

        point = normalised(ones.astype(float))[0]
        lo, hi = _interval(normalised(counts.astype(float)))
        offset_rows += [
            {
                "layer": int(layer),
                "offset": int(o),
                "total": float(point[k]),
                "total_lo": float(lo[k]),
                "total_hi": float(hi[k]),
            }
            for k, o in enumerate(keys)
        ]
    return offset_rows


def bootstrap_summaries(
    tables: dict[str, pd.DataFrame], *, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES
) -> dict[str, pd.DataFrame]:
    """Every plotted statistic of Figs. 3-4 with a 95 % bootstrap interval over sequences.

    Sequences are resampled with replacement (`resamples` times, `numpy` generator seeded
    by `seed`, so the intervals are deterministic); each resample recomputes the statistic
    from its sequences exactly as the point estimate is computed from all of them
    (percentile intervals). Tables:
    own_summary: layer, n_sequences, n_tokens, and for q1 / median / q3 of c^l_{i,i} (%)
    and p_tilde (% of tokens whose own input is not the top contributor) the estimate with
    _lo and _hi; groups_summary: layer, group, percent, percent_lo, percent_hi;
    offsets_summary: layer, offset, total (normalised to a maximum of 1 per layer,
    offset 0 left out), total_lo, total_hi.
    """
    own, groups, offsets = tables["own"], tables["groups"], tables["offsets"]
    seqs = np.array(sorted(own["seq"].unique()))
    n_seq = len(seqs)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n_seq, size=(resamples, n_seq))
    counts = np.stack([np.bincount(d, minlength=n_seq) for d in draws])  # [B, S]
    ones = np.ones((1, n_seq), dtype=counts.dtype)
    slot = {s: k for k, s in enumerate(seqs)}
    r = _Resamples(counts, ones, slot)
    off = offsets[(offsets["offset"] != 0) & (offsets["offset"].abs() <= 60)]
    return {
        "own_summary": pd.DataFrame(_own_rows(own, r)),
        "groups_summary": pd.DataFrame(_group_rows(groups, r)),
        "offsets_summary": pd.DataFrame(_offset_rows(off, r)),
        "trends": _trends(own, off, groups, counts, slot),
    }


TAIL_FROM = 11  # |j − i| from which an input counts in the tail of Fig. 4b (Fig. 4a's "11+")


def _trends(
    own: pd.DataFrame,
    off: pd.DataFrame,
    groups: pd.DataFrame,
    counts: np.ndarray,
    slot: dict[Any, int],
) -> pd.DataFrame:
    """First layer → last layer changes of the Fig. 3b and 4b statistics, each with a paired
    95 % bootstrap interval over sequences (the same resamples as the other summaries).

    Rows: statistic "p_tilde" (% of tokens whose own input is not their top contributor),
    "tail_share" (% of the contribution from other positions within ±60 that comes from
    |j − i| ≥ 11: a summed share, already about half at the first layer on 100-128-token
    pairs) and "far_share" (the 11+ group's per-position share, Fig. 4a's normalisation:
    the statistic the paper's own numbers give for the tails, 5.2 → 9.9 %) and "near_share"
    (the distance-1 group's per-position share, the statistic of Fig. 4a's spread test);
    columns statistic, first_layer, last_layer, first, last, change
    (last − first, percentage points), change_lo, change_hi.
    """
    n_seq = counts.shape[1]
    ones = np.ones((1, n_seq))

    def p_tilde(t: pd.DataFrame, w: np.ndarray) -> np.ndarray:
        where = [slot[s] for s in t["seq"]]
        k = np.bincount(where, weights=(~t["own_is_top"].astype(bool)).to_numpy(), minlength=n_seq)
        return 100 * (w @ k) / (w @ np.bincount(where, minlength=n_seq))

    def tail(t: pd.DataFrame, w: np.ndarray) -> np.ndarray:
        where = [slot[s] for s in t["seq"]]
        far = (t["offset"].abs() >= TAIL_FROM).to_numpy()
        total = t["total"].to_numpy(dtype=float)
        part = np.bincount(where, weights=total * far, minlength=n_seq)
        return (
            100
            * (w @ part)
            / np.maximum(w @ np.bincount(where, weights=total, minlength=n_seq), 1e-300)
        )

    labels = [label for label, _, _ in DISTANCE_GROUPS]

    def far(t: pd.DataFrame, w: np.ndarray) -> np.ndarray:
        return _group_percent(t, slot, n_seq, labels)(w)[:, labels.index("11+")]

    def near(t: pd.DataFrame, w: np.ndarray) -> np.ndarray:
        return _group_percent(t, slot, n_seq, labels)(w)[:, labels.index("1")]

    rows = []
    stats = (
        ("p_tilde", own, p_tilde),
        ("tail_share", off, tail),
        ("far_share", groups, far),
        ("near_share", groups, near),
    )
    for name, table, stat in stats:
        if table.empty:
            continue
        lo_layer, hi_layer = int(table["layer"].min()), int(table["layer"].max())
        first, last = (table[table["layer"] == layer] for layer in (lo_layer, hi_layer))
        point = float(stat(last, ones)[0] - stat(first, ones)[0])
        lo, hi = _interval(stat(last, counts.astype(float)) - stat(first, counts.astype(float)))
        rows.append(
            {
                "statistic": name,
                "first_layer": lo_layer,
                "last_layer": hi_layer,
                "first": float(stat(first, ones)[0]),
                "last": float(stat(last, ones)[0]),
                "change": point,
                "change_lo": float(lo),
                "change_hi": float(hi),
            }
        )
    return pd.DataFrame(rows)


def estimator_summary(own: pd.DataFrame, probes: int | None, resamples: int) -> pd.DataFrame:
    """One row: sample sizes and the estimator's stated error, for captions and the methods.

    median_rel_stderr_own: median over tokens and layers of the estimator's standard error
    of c^l_{i,i} relative to c^l_{i,i} (NaN when exact). Lengths are tokens per sequence.
    """
    per_seq = own[own["layer"] == own["layer"].min()].groupby("seq").size()
    rel = (own["own_stderr"] / own["own"]).replace([np.inf, -np.inf], np.nan)
    return pd.DataFrame(
        [
            {
                "n_sequences": int(per_seq.size),
                "n_tokens": int(per_seq.sum()),
                "min_length": int(per_seq.min()),
                "max_length": int(per_seq.max()),
                "median_length": float(per_seq.median()),
                "estimator": "exact" if probes is None else f"{probes} random probes per token",
                "probes": -1 if probes is None else int(probes),
                "median_rel_stderr_own": float(rel.median()) if rel.notna().any() else float("nan"),
                "bootstrap_resamples": int(resamples),
            }
        ]
    )
