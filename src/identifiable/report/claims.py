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


FALL_MEDIAN = 0.9  # beyond d_v the paper's r is at most ~0.95 just past 64 tokens, ~0.45 by 128
MIN_LONG = 5  # fewer sequences longer than d_v cannot show a trend


def pearson_by_length(by_length: pd.DataFrame, head_dim: int) -> Verdict:
    """Fig. 1a: r(raw, effective) is 1 up to n = d_v and falls beyond it.

    The identity below d_v holds by construction (rank T = n there, so A_eff = A); it is a
    check of the computation, and a failure makes the verdict "not supported". The claim
    proper is the fall beyond d_v, tested two ways on the sequences with n > d_v:
    (a) departure: their median r is below 0.9 (FALL_MEDIAN: just past 64 tokens the paper
    shows about 0.95, and 0.45-0.5 from 100 tokens on); (b) trend: r decreases with n,
    Spearman ρ(n, r) < 0 with a one-sided p < 0.05 (needs at least MIN_LONG sequences).
    Supported when the check holds and both (a) and (b) do; partly when one of them does.
    """
    from scipy.stats import spearmanr

    short = by_length[by_length["length"] <= head_dim]["pearson_r"]
    long = by_length[by_length["length"] > head_dim]
    numbers: dict[str, Any] = {
        "head_dim": head_dim,
        "n_short": len(short),
        "n_long": len(long),
        "min_r_short": float(short.min()) if len(short) else None,
        "median_r_long": float(long["pearson_r"].median()) if len(long) else None,
    }
    if len(long) < MIN_LONG:
        return Verdict(
            "fig1a",
            NOT_TESTED,
            f"Not tested: only {len(long)} sequences are longer than the head width d_v = {head_dim} "
            f"(at least {MIN_LONG} are needed to see r fall).",
            numbers,
        )
    if long["length"].nunique() < 2 or long["pearson_r"].nunique() < 2:
        rho, p_one = 0.0, 1.0  # constant: no trend to see
    else:
        rho_, p_two = spearmanr(long["length"], long["pearson_r"])
        rho = float(rho_)
        p_one = float(p_two) / 2 if rho < 0 else 1.0
    numbers |= {"spearman_rho_long": rho, "spearman_p_one_sided": p_one}
    short_ok = short.empty or bool(short.min() >= 1 - 1e-6)
    departs = bool(long["pearson_r"].median() < FALL_MEDIAN)
    trend = rho < 0 and p_one < 0.05
    if not short_ok:
        status = NOT_SUPPORTED
    else:
        status = SUPPORTED if departs and trend else PARTLY if departs or trend else NOT_SUPPORTED
    short_txt = (
        f"all {len(short)} sequences with n ≤ {head_dim} have r = 1 (lowest {short.min():.6f}, as it must)"
        if short_ok and len(short)
        else f"sequences with n ≤ {head_dim} have r as low as {short.min():.6f}, which should be impossible"
        if len(short)
        else f"no sequence is as short as {head_dim} tokens"
    )
    return Verdict(
        "fig1a",
        status,
        f"{status.capitalize()}: {short_txt}; the {len(long)} longer ones have median r = "
        f"{_f(long['pearson_r'].median())} (fall test: below {FALL_MEDIAN}) and r falls with length "
        f"(Spearman ρ = {rho:.2f}, one-sided p = {p_one:.2g}; trend test: ρ < 0, p < 0.05) "
        "(paper, BERT-base with d_v = 64: r = 1 up to 64 tokens, about 0.95 just beyond, 0.45 at 128).",
        numbers,
    )


def layer_means(to_tokens: pd.DataFrame) -> pd.DataFrame:
    """Mean over heads per (kind, target, layer): columns kind, target, layer, value."""
    return to_tokens.groupby(["kind", "target", "layer"], as_index=False)["value"].mean()


RAW_CONCENTRATED = 0.2  # a layer mean of raw attention this high "piles up" on the target


def effective_vs_raw_targets(to_tokens: pd.DataFrame) -> Verdict:
    """Figs. 1b/1c: where raw attention piles up on [CLS], [SEP] or punctuation, effective
    attention is far smaller, in every layer and for every target, as the paper claims.

    Every (layer, target) whose raw layer mean (mean over heads) is at least 0.2 is a
    tested cell (RAW_CONCENTRATED: the paper's peaks are 0.25-0.57, its quiet layers
    ≤ 0.12); a cell passes when the effective layer mean there is at most half the raw
    one. Supported when every tested cell passes, partly when at least half do, not
    supported otherwise; not tested when raw attention never reaches 0.2.
    """
    means = layer_means(to_tokens)
    raw = means[means["kind"] == "raw"].set_index(["target", "layer"])["value"]
    eff = means[means["kind"] == "effective"].set_index(["target", "layer"])["value"]
    if raw.empty:
        return Verdict(
            "fig1bc", NOT_TESTED, "Not tested: no [CLS], [SEP] or punctuation token in the sample."
        )
    cells = raw[raw >= RAW_CONCENTRATED]
    ref = paper_reference()
    paper = f"paper, BERT-base: raw up to {max(max(v) for k, v in ref['fig1b_raw_attention_layer_mean'].items() if k != 'note'):.2f}, effective at most about 0.1"
    numbers: dict[str, Any] = {
        "cells_tested": len(cells),
        "max_abs_effective": float(eff.abs().max()),
        "largest_raw": float(raw.max()),
    }
    if cells.empty:
        target, layer = raw.idxmax()
        return Verdict(
            "fig1bc",
            NOT_TESTED,
            f"Not tested: raw attention never concentrates on these tokens (largest layer mean {_f(float(raw.max()))}, "
            f"{target} at layer {layer}; a tested cell needs {RAW_CONCENTRATED}); {paper}.",
            numbers,
        )
    ratio = pd.Series({k: float(eff.get(k, float("nan"))) / float(v) for k, v in cells.items()})
    passing = ratio <= 0.5
    worst = ratio.idxmax()
    numbers |= {
        "cells_passing": int(passing.sum()),
        "worst_target": worst[0],
        "worst_layer": int(worst[1]),
        "worst_raw": float(cells[worst]),
        "worst_effective": float(eff.get(worst, float("nan"))),
    }
    k, n = int(passing.sum()), len(cells)
    status = SUPPORTED if k == n else PARTLY if 2 * k >= n else NOT_SUPPORTED
    return Verdict(
        "fig1bc",
        status,
        f"{status.capitalize()}: in {k} of the {n} (layer, target) cells where raw attention averages at least "
        f"{RAW_CONCENTRATED}, effective attention is at most half of it; the weakest cell is {worst[0]} at layer "
        f"{worst[1]} (raw {_f(float(cells[worst]))}, effective {_f(float(eff.get(worst, float('nan'))))}); {paper}.",
        numbers,
    )


def output_change(changes: pd.DataFrame, head_dim: int) -> dict[str, float]:
    """Median and maximum over heads, layers and sequences with n > d_v of the relative change
    of the head output when A is replaced by A_eff: bias-free (zero up to rounding, by the
    null space's definition) and biased (the model's real values, E W_V + 1 b_Vᵀ).
    changes: seq, length, layer, head, bias_free, biased."""
    t = changes[changes["length"] > head_dim]
    if t.empty:
        return {"n_heads": 0}
    return {
        "n_heads": len(t),
        "n_sequences": int(t["seq"].nunique()),
        "bias_free_max": float(t["bias_free"].max()),
        "biased_median": float(t["biased"].median()),
        "biased_max": float(t["biased"].max()),
    }


def _rate(per_layer: pd.DataFrame, probe: str, objective: str) -> pd.Series:
    t = per_layer[(per_layer["probe"] == probe) & (per_layer["objective"] == objective)]
    return t.set_index("layer")["rate"].sort_index()


def learned_probes(per_layer: pd.DataFrame) -> tuple[list[str], bool]:
    """The distinct learned probes of the table, and whether an MLP copied the linear probe.

    An MLP whose rates equal the linear probe's at every layer for every objective is
    counted once (as the linear probe): two identical curves are one piece of evidence.
    """
    probes = [p for p in ("linear", "mlp") if (per_layer["probe"] == p).any()]
    if probes != ["linear", "mlp"]:
        return probes, False
    same = all(
        _rate(per_layer, "mlp", obj).round(12).equals(_rate(per_layer, "linear", obj).round(12))
        for obj in ("l2", "cos")
    )
    return (["linear"], True) if same else (probes, False)


def cosine_beats_l2(per_layer: pd.DataFrame) -> Verdict:
    """Fig. 2a: cosine probes identify at least as many tokens as L2 probes, at every layer.

    Each distinct learned probe (linear; the MLP unless its rates copy the linear probe's,
    see `learned_probes`) is compared at every layer (ties count for cosine: early layers
    are at 100 % for both). Supported when cosine ≥ L2 everywhere; not supported when L2
    wins in at least half of the (probe, layer) cells; partly otherwise.
    """
    probes, copied = learned_probes(per_layer)
    losing, cells = [], 0
    for probe in probes:
        cos, l2 = _rate(per_layer, probe, "cos"), _rate(per_layer, probe, "l2")
        for layer in cos.index:
            if layer in l2.index:
                cells += 1
                if cos[layer] < l2[layer] - 1e-12:
                    losing.append((probe, int(layer)))
    numbers: dict[str, Any] = {
        "layers_where_l2_wins": [f"{p}@{layer}" for p, layer in losing],
        "probes_compared": probes,
        "cells": cells,
        "mlp_copies_linear": copied,
    }
    who = " and ".join(f"the {p}" for p in probes) + (" probe" if len(probes) == 1 else " probes")
    note = (
        " (the MLP's rates equal the linear probe's everywhere, so it is counted once)"
        if copied
        else ""
    )
    if cells == 0:
        return Verdict(
            "fig2a_cos", NOT_TESTED, "Not tested: no learned probe with both objectives.", numbers
        )
    if not losing:
        return Verdict(
            "fig2a_cos",
            SUPPORTED,
            f"Supported: cosine ≥ L2 at all {cells} (probe, layer) cells for {who}{note}, as in the paper.",
            numbers,
        )
    status = NOT_SUPPORTED if 2 * len(losing) >= cells else PARTLY
    where = ", ".join(f"{p} probe at layer {layer}" for p, layer in losing)
    return Verdict(
        "fig2a_cos",
        status,
        f"{status.capitalize()}: L2 beats cosine for the {where} ({len(losing)} of {cells} cells){note}; "
        "the paper has cosine ahead everywhere.",
        numbers,
    )


def identifiable_at_depth(per_layer: pd.DataFrame, control: pd.DataFrame) -> Verdict:
    """Fig. 2a: identifiability falls with depth yet stays high, and the control sits at chance.

    The best distinct learned cosine probe (see `learned_probes`) must identify ≥ 80 % of
    test tokens at the last layer (the paper's lowest learned-cosine rate is 94 %; 80 %
    leaves room for a smaller model and sample), be no higher there than at the first layer, and
    the shuffled-target control must be present and within 0.05 of chance at every layer.
    Supported when all hold; partly when the rate conditions hold but the control does
    not, or the last-layer rate is only ≥ 50 %; not supported otherwise.
    """
    probes, copied = learned_probes(per_layer)
    rates = pd.concat({p: _rate(per_layer, p, "cos") for p in probes}, axis=1)
    best = rates.max(axis=1)
    first, last = float(best.iloc[0]), float(best.iloc[-1])
    best_last = str(rates.iloc[-1].idxmax())
    ctrl_gap = (
        float((control["rate"] - control["chance"]).abs().max())
        if not control.empty
        else float("nan")
    )
    numbers = {
        "first_layer": first,
        "last_layer": last,
        "best_probe_last_layer": best_last,
        "control_gap_to_chance": ctrl_gap,
        "mlp_copies_linear": copied,
    }
    ok = last >= 0.8 and last <= first + 1e-9
    ctrl_ok = bool(ctrl_gap <= 0.05)
    status = SUPPORTED if ok and ctrl_ok else PARTLY if ok or last >= 0.5 else NOT_SUPPORTED
    paper = paper_reference()["fig2a_identifiability_rate_by_layer"]
    ctrl_txt = (
        f"the shuffled-target control is within {ctrl_gap:.3f} of chance"
        if ctrl_gap == ctrl_gap
        else "no shuffled-target control was run"
    )
    return Verdict(
        "fig2a_depth",
        status,
        f"{status.capitalize()}: the best learned cosine probe identifies {first:.1%} of tokens at the first layer and "
        f"{last:.1%} at the last layer ({best_last} probe; paper: {paper['lin_cos'][0]:.0%} → {paper['lin_cos'][-1]:.0%}); "
        f"{ctrl_txt}.",
        numbers,
    )


CROSS_MIN = 0.5  # the paper's lowest off-diagonal rate is ~0.67; half the tokens is "transfers"


def cross_layer(cross: pd.DataFrame) -> Verdict:
    """Fig. 2b: a linear cosine probe trained on one layer still identifies most tokens on others.

    Tested separately for each fitting regime of the table (`regime`: "converged", the
    Fig. 2a probe, and "closed form", least squares to unit targets without refinement),
    because the transfer depends on how the probe was fitted: a regime supports the claim
    when every off-diagonal rate is ≥ 0.5 (CROSS_MIN; the paper's lowest is about 0.67).
    Supported when every regime supports it; not supported when none does; partly when
    the regimes disagree, i.e. the verdict hinges on the fitting regime.
    """
    t = cross[(cross["probe"] == "linear") & (cross["objective"] == "cos")]
    if "regime" not in t:
        t = t.assign(regime="converged")
    off = t[t["train_layer"] != t["test_layer"]]
    if off.empty:
        return Verdict("fig2b", NOT_TESTED, "Not tested: the model has a single layer.")
    regimes = {r: g["rate"] for r, g in off.groupby("regime", sort=False)}
    passes = {r: bool(v.min() >= CROSS_MIN) for r, v in regimes.items()}
    numbers: dict[str, Any] = {"min_off_diagonal": float(off["rate"].min())}
    for r, v in regimes.items():
        key = r.replace(" ", "_")
        numbers |= {
            f"min_off_diagonal_{key}": float(v.min()),
            f"mean_off_diagonal_{key}": float(v.mean()),
        }
    n_pass = sum(passes.values())
    status = SUPPORTED if n_pass == len(passes) else NOT_SUPPORTED if n_pass == 0 else PARTLY
    parts = "; ".join(f"{r}: mean {v.mean():.1%}, lowest {v.min():.1%}" for r, v in regimes.items())
    hinge = " The verdict hinges on the fitting regime." if status == PARTLY else ""
    return Verdict(
        "fig2b",
        status,
        f"{status.capitalize()}: trained on one layer and tested on another, the linear cosine probe identifies "
        f"({parts}); a regime supports the claim when its lowest rate is ≥ {CROSS_MIN:.0%} "
        f"(the paper's lowest is about 67%).{hinge}",
        numbers,
    )


MONOTONE_TOL = 1.0  # percentage points: the paper's values are read off to about ±1 pp


def own_contribution_falls(own: pd.DataFrame) -> Verdict:
    """Fig. 3a: the median contribution of a token's own input falls with depth.

    The per-layer medians m_1 … m_L (percent) must fall near-monotonically: no layer's
    median may exceed the previous layer's by more than MONOTONE_TOL = 1 percentage point
    (the precision of the paper's values; its own curve never rises), and the overall fall
    m_1 − m_L must exceed that tolerance. Supported when both hold; partly when the overall
    fall holds but some layer rises by more than the tolerance; not supported otherwise.
    """
    med = own.groupby("layer")["own"].median().sort_index() * 100
    first, last = float(med.iloc[0]), float(med.iloc[-1])
    steps = med.diff().iloc[1:]
    rises = {int(layer): float(v) for layer, v in steps.items() if v > MONOTONE_TOL}
    falls = first - last > MONOTONE_TOL
    status = SUPPORTED if falls and not rises else PARTLY if falls else NOT_SUPPORTED
    paper = paper_reference()["fig3a_own_token_contribution_median_percent"]
    rise_txt = (
        f"never rising by more than {MONOTONE_TOL:g} point from one layer to the next"
        if not rises
        else "but rising at layer(s) " + ", ".join(f"{k} (+{v:.1f})" for k, v in rises.items())
    )
    return Verdict(
        "fig3a",
        status,
        f"{status.capitalize()}: the median contribution of a token's own input goes from {first:.1f}% at the first layer "
        f"to {last:.1f}% at the last layer, {rise_txt} (tolerance {MONOTONE_TOL:g} percentage point; "
        f"paper: {paper[0]:.1f}% → {paper[-1]:.1f}%, monotone).",
        {
            "median_first": first,
            "median_last": last,
            "rises": rises,
            "medians": med.round(3).tolist(),
        },
    )


def not_top_share(own: pd.DataFrame) -> tuple[pd.DataFrame, Verdict]:
    """Per layer, percent of tokens whose own input is not the top contributor; supported when it is
    ≤ 5% at the first layer and higher at the last layer."""
    share = (100 * (1 - own.groupby("layer")["own_is_top"].mean())).rename("percent").reset_index()
    first, last = float(share["percent"].iloc[0]), float(share["percent"].iloc[-1])
    paper = paper_reference()["fig3b_percent_tokens_own_input_not_top_contributor"]
    status = SUPPORTED if first <= 5 and last > first else PARTLY if last > first else NOT_SUPPORTED
    return share, Verdict(
        "fig3b",
        status,
        f"{status.capitalize()}: {first:.1f}% of tokens at the first layer and {last:.1f}% at the last layer do not get their "
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
    """Supported when at the first layer the nearest neighbours (distance 1) weigh more than those 11+ away,
    and the 11+ group's share is larger at the last layer than at the first layer."""
    g = groups.pivot(index="layer", columns="group", values="percent").sort_index()
    if "11+" not in g or g["11+"].isna().all():
        return Verdict("fig4a", NOT_TESTED, "Not tested: no sequence is longer than 11 tokens.")
    near1, far1, far_last = float(g["1"].iloc[0]), float(g["11+"].iloc[0]), float(g["11+"].iloc[-1])
    ok1, ok2 = near1 > far1, far_last > far1
    status = SUPPORTED if ok1 and ok2 else PARTLY if ok1 or ok2 else NOT_SUPPORTED
    return Verdict(
        "fig4a",
        status,
        f"{status.capitalize()}: at the first layer an input 1 position away weighs {near1:.1f}% against {far1:.1f}% for one "
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
    """Supported when, at the first layer, the largest total contribution (self excluded) comes from offset ±1."""
    first = positions[positions["layer"] == positions["layer"].min()]
    if first.empty:
        return Verdict("fig4b", NOT_TESTED, "Not tested: sequences too short.")
    peak = int(first.loc[first["total"].idxmax(), "offset"])
    status = SUPPORTED if abs(peak) == 1 else NOT_SUPPORTED
    return Verdict(
        "fig4b",
        status,
        f"{status.capitalize()}: at the first layer the largest contribution from other positions comes from offset {peak:+d} "
        "(paper: a sharp peak at ±1, with heavier tails in deeper layers).",
        {"peak_offset_first_layer": peak},
    )
