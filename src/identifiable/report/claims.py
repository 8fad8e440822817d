"""One verdict per paper claim, computed from our tables (never written by hand).

Each function states the test it applies in its docstring; the sentence it
returns quotes the numbers it used, beside the paper's BERT-base values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from identifiable.report.paper import paper_reference

SUPPORTED, PARTLY, NOT_SUPPORTED, NOT_TESTED = (
    "supported",
    "partly supported",
    "not supported",
    "not tested",
)


@dataclass
class Verdict:
    key: str
    status: str
    sentence: str
    numbers: dict[str, Any] = field(default_factory=dict)


def _f(x: float, digits: int = 3) -> str:
    return f"{x:.{digits}f}"


def pearson_by_length(by_length: pd.DataFrame, head_dim: int) -> Verdict:
    """Supported when every sequence with n ≤ d_v has r ≥ 1 − 1e-6 and longer ones have median r < 0.99."""
    short = by_length[by_length["length"] <= head_dim]["pearson_r"]
    long = by_length[by_length["length"] > head_dim]["pearson_r"]
    numbers = {
        "head_dim": head_dim,
        "n_short": len(short),
        "n_long": len(long),
        "min_r_short": float(short.min()) if len(short) else None,
        "median_r_long": float(long.median()) if len(long) else None,
    }
    if long.empty:
        return Verdict(
            "fig1a",
            NOT_TESTED,
            f"Not tested: no sequence is longer than the head width d_v = {head_dim}.",
            numbers,
        )
    short_ok = short.empty or bool(short.min() >= 1 - 1e-6)
    long_ok = bool(long.median() < 0.99)
    status = SUPPORTED if short_ok and long_ok else PARTLY if short_ok or long_ok else NOT_SUPPORTED
    short_txt = (
        f"all {len(short)} sequences with n ≤ {head_dim} have r = 1 (lowest {short.min():.6f})"
        if short_ok and len(short)
        else f"sequences with n ≤ {head_dim} have r as low as {short.min():.6f}"
        if len(short)
        else f"no sequence is as short as {head_dim} tokens"
    )
    return Verdict(
        "fig1a",
        status,
        f"{status.capitalize()}: {short_txt}, and the {len(long)} longer ones have median r = {_f(long.median())} "
        "(paper, BERT-base with d_v = 64: r = 1 up to 64 tokens, about 0.45–0.95 beyond).",
        numbers,
    )


def layer_means(to_tokens: pd.DataFrame) -> pd.DataFrame:
    """Mean over heads per (kind, target, layer): columns kind, target, layer, value."""
    return to_tokens.groupby(["kind", "target", "layer"], as_index=False)["value"].mean()


def effective_vs_raw_targets(to_tokens: pd.DataFrame) -> Verdict:
    """Take the (layer, target) where raw attention's layer mean is largest; supported when
    effective attention there is at most half of it. Not tested when raw never exceeds 0.2."""
    means = layer_means(to_tokens)
    raw = means[means["kind"] == "raw"].set_index(["target", "layer"])["value"]
    eff = means[means["kind"] == "effective"].set_index(["target", "layer"])["value"]
    if raw.empty:
        return Verdict(
            "fig1bc", NOT_TESTED, "Not tested: no [CLS], [SEP] or punctuation token in the sample."
        )
    target, layer = raw.idxmax()
    r, e = float(raw.max()), float(eff.loc[(target, layer)])
    numbers = {
        "target": target,
        "layer": int(layer),
        "raw": r,
        "effective": e,
        "max_abs_effective": float(eff.abs().max()),
    }
    ref = paper_reference()
    paper = f"paper, BERT-base: raw up to {max(max(v) for k, v in ref['fig1b_raw_attention_layer_mean'].items() if k != 'note'):.2f}, effective at most about 0.1"
    if r < 0.2:
        return Verdict(
            "fig1bc",
            NOT_TESTED,
            f"Not tested: raw attention never concentrates on these tokens (largest layer mean {_f(r)}, {target} at layer {layer}); {paper}.",
            numbers,
        )
    status = SUPPORTED if e <= 0.5 * r else NOT_SUPPORTED
    return Verdict(
        "fig1bc",
        status,
        f"{status.capitalize()}: the largest raw layer mean is {_f(r)} on {target} at layer {layer}, where "
        f"effective attention averages {_f(e)} ({e / r:.0%} of it); {paper}.",
        numbers,
    )


def _rate(per_layer: pd.DataFrame, probe: str, objective: str) -> pd.Series:
    t = per_layer[(per_layer["probe"] == probe) & (per_layer["objective"] == objective)]
    return t.set_index("layer")["rate"].sort_index()


def cosine_beats_l2(per_layer: pd.DataFrame) -> Verdict:
    """Supported when, for the linear and the MLP probe, the cosine rate ≥ the L2 rate at every layer."""
    losing = []
    for probe in ("linear", "mlp"):
        cos, l2 = _rate(per_layer, probe, "cos"), _rate(per_layer, probe, "l2")
        losing += [
            (probe, int(layer)) for layer in cos.index if cos[layer] < l2.get(layer, -1) - 1e-12
        ]
    n_layers = per_layer["layer"].nunique()
    numbers = {"layers_where_l2_wins": [f"{p}@{layer}" for p, layer in losing]}
    if not losing:
        return Verdict(
            "fig2a_cos",
            SUPPORTED,
            f"Supported: cosine ≥ L2 at all {n_layers} layers for both the linear and the MLP probe (as in the paper).",
            numbers,
        )
    status = PARTLY if len({layer for _, layer in losing}) < n_layers else NOT_SUPPORTED
    where = ", ".join(f"{p} probe at layer {layer}" for p, layer in losing)
    return Verdict(
        "fig2a_cos",
        status,
        f"{status.capitalize()}: L2 beats cosine for the {where}; the paper has cosine ahead everywhere.",
        numbers,
    )


def identifiable_at_depth(per_layer: pd.DataFrame, control: pd.DataFrame) -> Verdict:
    """Supported when the best learned cosine probe stays ≥ 0.8 at the last layer, is no higher there
    than at layer 1, and the shuffled control stays within 0.05 of chance."""
    best = pd.concat([_rate(per_layer, p, "cos") for p in ("linear", "mlp")], axis=1).max(axis=1)
    first, last = float(best.iloc[0]), float(best.iloc[-1])
    ctrl_gap = (
        float((control["rate"] - control["chance"]).abs().max())
        if not control.empty
        else float("nan")
    )
    numbers = {"first_layer": first, "last_layer": last, "control_gap_to_chance": ctrl_gap}
    ok = last >= 0.8 and last <= first + 1e-9
    ctrl_ok = bool(ctrl_gap <= 0.05)
    status = SUPPORTED if ok and ctrl_ok else PARTLY if ok or last >= 0.5 else NOT_SUPPORTED
    paper = paper_reference()["fig2a_identifiability_rate_by_layer"]
    return Verdict(
        "fig2a_depth",
        status,
        f"{status.capitalize()}: the best learned cosine probe identifies {first:.1%} of tokens at layer 1 and "
        f"{last:.1%} at the last layer (paper: {paper['lin_cos'][0]:.0%} → {paper['lin_cos'][-1]:.0%}); the "
        f"shuffled-target control is within {ctrl_gap:.3f} of chance.",
        numbers,
    )


def cross_layer(cross: pd.DataFrame) -> Verdict:
    """Supported when a linear cosine probe trained on any layer identifies ≥ 50% of tokens at every other layer."""
    t = cross[(cross["probe"] == "linear") & (cross["objective"] == "cos")]
    off = t[t["train_layer"] != t["test_layer"]]["rate"]
    if off.empty:
        return Verdict("fig2b", NOT_TESTED, "Not tested: the model has a single layer.")
    numbers = {"min_off_diagonal": float(off.min()), "mean_off_diagonal": float(off.mean())}
    status = SUPPORTED if off.min() >= 0.5 else NOT_SUPPORTED
    return Verdict(
        "fig2b",
        status,
        f"{status.capitalize()}: trained on one layer and tested on another, the linear cosine probe identifies "
        f"{off.mean():.1%} of tokens on average (lowest {off.min():.1%}); the paper's lowest is about 67%.",
        numbers,
    )


def own_contribution_falls(own: pd.DataFrame) -> Verdict:
    """Supported when the median own contribution at the last layer is below that at layer 1."""
    med = own.groupby("layer")["own"].median().sort_index() * 100
    first, last = float(med.iloc[0]), float(med.iloc[-1])
    paper = paper_reference()["fig3a_own_token_contribution_median_percent"]
    status = SUPPORTED if last < first else NOT_SUPPORTED
    return Verdict(
        "fig3a",
        status,
        f"{status.capitalize()}: the median contribution of a token's own input falls from {first:.1f}% at layer 1 "
        f"to {last:.1f}% at the last layer (paper: {paper[0]:.1f}% → {paper[-1]:.1f}%).",
        {"median_first": first, "median_last": last},
    )


def not_top_share(own: pd.DataFrame) -> tuple[pd.DataFrame, Verdict]:
    """Per layer, percent of tokens whose own input is not the top contributor; supported when it is
    ≤ 5% at layer 1 and higher at the last layer."""
    share = (100 * (1 - own.groupby("layer")["own_is_top"].mean())).rename("percent").reset_index()
    first, last = float(share["percent"].iloc[0]), float(share["percent"].iloc[-1])
    paper = paper_reference()["fig3b_percent_tokens_own_input_not_top_contributor"]
    status = SUPPORTED if first <= 5 and last > first else PARTLY if last > first else NOT_SUPPORTED
    return share, Verdict(
        "fig3b",
        status,
        f"{status.capitalize()}: {first:.1f}% of tokens at layer 1 and {last:.1f}% at the last layer do not get their "
        f"largest contribution from their own input (paper: {paper[0]:.0f}% → {paper[-1]:.1f}%).",
        {"percent_first": first, "percent_last": last},
    )


GROUPS = ("1", "2", "3", "4-5", "6-10", "11+")
GROUP_NORMALISATION = (
    "per layer: for each token, the summed contribution of the inputs in the group divided by "
    "the number of such positions, averaged over the tokens that have the group, then rescaled "
    "so that the six groups sum to 100%"
)


def neighbour_groups(groups: pd.DataFrame) -> pd.DataFrame:
    """Columns layer, group, percent (see GROUP_NORMALISATION, the same as
    `identifiable.experiments.attribution`); groups: layer, group, per_position_sum, tokens
    summed over sequences."""
    agg = groups.groupby(["layer", "group"], as_index=False)[["per_position_sum", "tokens"]].sum()
    agg["mean"] = agg["per_position_sum"] / agg["tokens"].where(agg["tokens"] > 0)
    agg["percent"] = 100 * agg["mean"] / agg.groupby("layer")["mean"].transform("sum")
    agg["group"] = pd.Categorical(agg["group"], categories=GROUPS, ordered=True)
    out = agg.sort_values(["layer", "group"])[["layer", "group", "percent"]]
    return out.assign(group=out["group"].astype(str)).reset_index(drop=True)


def neighbours_spread(groups: pd.DataFrame) -> Verdict:
    """Supported when at layer 1 the nearest neighbours (distance 1) weigh more than those 11+ away,
    and the 11+ group's share is larger at the last layer than at layer 1."""
    g = groups.pivot(index="layer", columns="group", values="percent").sort_index()
    if "11+" not in g or g["11+"].isna().all():
        return Verdict("fig4a", NOT_TESTED, "Not tested: no sequence is longer than 11 tokens.")
    near1, far1, far_last = float(g["1"].iloc[0]), float(g["11+"].iloc[0]), float(g["11+"].iloc[-1])
    ok1, ok2 = near1 > far1, far_last > far1
    status = SUPPORTED if ok1 and ok2 else PARTLY if ok1 or ok2 else NOT_SUPPORTED
    return Verdict(
        "fig4a",
        status,
        f"{status.capitalize()}: at layer 1 an input 1 position away weighs {near1:.1f}% against {far1:.1f}% for one "
        f"11+ away; at the last layer the far group has {far_last:.1f}% (paper: 10.0% vs 5.2% → 9.9%).",
        {"near_first": near1, "far_first": far1, "far_last": far_last},
    )


def relative_positions(offsets: pd.DataFrame, span: int = 60) -> pd.DataFrame:
    """Columns layer, offset, total: Σ contributions per relative position j − i in [−span, span],
    excluding the token itself (offset 0), normalised to a maximum of 1 per layer.
    offsets: layer, offset, total (per sequence)."""
    t = offsets[(offsets["offset"] != 0) & (offsets["offset"].abs() <= span)]
    agg = t.groupby(["layer", "offset"], as_index=False)["total"].sum()
    agg["total"] = agg["total"] / agg.groupby("layer")["total"].transform("max")
    return agg


def peak_at_neighbours(positions: pd.DataFrame) -> Verdict:
    """Supported when, at layer 1, the largest total contribution (self excluded) comes from offset ±1."""
    first = positions[positions["layer"] == positions["layer"].min()]
    if first.empty:
        return Verdict("fig4b", NOT_TESTED, "Not tested: sequences too short.")
    peak = int(first.loc[first["total"].idxmax(), "offset"])
    status = SUPPORTED if abs(peak) == 1 else NOT_SUPPORTED
    return Verdict(
        "fig4b",
        status,
        f"{status.capitalize()}: at layer 1 the largest contribution from other positions comes from offset {peak:+d} "
        "(paper: a sharp peak at ±1, with heavier tails in deeper layers).",
        {"peak_offset_first_layer": peak},
    )
