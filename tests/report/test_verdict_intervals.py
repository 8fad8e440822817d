"""Issue 50: every verdict decides on a 95 % interval, and a borderline case of each rule
comes out "not settled" (its fabricated pass and fail cases live beside the rule's tests)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binom, binomtest
from tests.report.test_claims import by_length, cross, groups_table, own_table, per_layer, trends

from identifiable.report import certify_section, claims, mixing_section
from identifiable.report.verdicts import (
    NOT_SETTLED,
    PARTLY,
    SUPPORTED,
    Verdict,
    binomial_interval,
    headline,
    median_interval,
    tally,
)


def test_intervals_match_scipy_and_brute_force() -> None:
    # the example: 76 of 144 rows against one half
    lo, hi = binomial_interval(76, 144)
    assert (round(lo, 3), round(hi, 3)) == (0.443, 0.611)
    assert binomtest(76, 144).pvalue == pytest.approx(0.56, abs=0.01)
    # the median's order-statistic interval covers the true median ≥ 95 % (exactly, by
    # the binomial law of the count below it) and is the narrowest such pair
    for n in (6, 9, 20, 144):
        x = np.arange(n, dtype=float)
        lo_m, hi_m = median_interval(x)
        j = int(lo_m) + 1
        assert hi_m == n - j and binom.cdf(n - j, n, 0.5) - binom.cdf(j - 1, n, 0.5) >= 0.95
        assert binom.cdf(n - j - 1, n, 0.5) - binom.cdf(j, n, 0.5) < 0.95
    assert median_interval([1.0] * 5) == (float("-inf"), float("inf"))


def test_certify_overshoot_at_76_of_144_is_not_settled() -> None:
    rows = pd.DataFrame(
        {
            "null_dim": 10,
            "l1_effective": [1.0] * 76 + [0.1] * 68,
            "movable_mass": 0.2,
            "width_max": np.linspace(0.05, 0.15, 144),  # median 0.1: straddles NARROW
            "width_mean": 0.01,
            "l1_constrained": np.linspace(0.0, 2.0, 144),  # paired difference straddles 0
        }
    )
    for claim in (
        certify_section.claim_effective_overshoots,
        certify_section.claim_pinned,
        certify_section.claim_constrained_is_closer,
    ):
        v = claim(rows)
        assert v.status == NOT_SETTLED and v.sentence.startswith("Not settled:")
    assert "0.443 … 0.611" in certify_section.claim_effective_overshoots(rows).sentence


def test_paper_rules_on_borderline_data_are_not_settled() -> None:
    # Fig. 1a: six falling sequences: the median's interval (min, max) straddles 0.9
    v = claims.pearson_by_length(by_length([0.95, 0.8, 0.7, 0.6, 0.5, 0.45]), head_dim=32)
    assert v.status == NOT_SETTLED
    # and low r that neither clearly falls nor rises with length
    flat = by_length([0.5, 0.4, 0.5, 0.4, 0.5, 0.45] * 2)
    assert claims.pearson_by_length(flat, head_dim=32).status == NOT_SETTLED
    # Fig. 2a: L2 ahead by 2 points within noise
    cos_l2 = per_layer([1, 0.88], [1, 0.9])
    close = cos_l2.assign(ci_low=cos_l2["rate"] - 0.05, ci_high=cos_l2["rate"] + 0.05)
    assert claims.cosine_beats_l2(close).status == NOT_SETTLED
    depth = per_layer([1, 0.96], [1, 0.8])  # a 4-point fall whose interval reaches below 3
    depth = depth.assign(ci_low=depth["rate"] - 0.03, ci_high=depth["rate"] + 0.03)
    control = pd.DataFrame({"rate": [0.05], "chance": [0.04]})
    assert claims.identifiable_at_depth(depth, control).status == NOT_SETTLED
    # Fig. 2b: every cell at 67 % whose interval reaches below 65.5 %
    c = cross({"identity start": 0.67})
    c = c.assign(ci_low=c["rate"] - 0.03, ci_high=c["rate"] + 0.03)
    assert claims.cross_layer(c).status == NOT_SETTLED
    # Fig. 3a: a 1.5-point fall whose intervals are not 1 point apart
    assert claims.own_contribution_falls(own_table([0.3, 0.295, 0.285])).status == NOT_SETTLED
    # Fig. 3b: a large rise whose interval reaches zero
    rising = own_table([0.4, 0.2], top=[1.0, 1 / 3], n=90)
    _, v = claims.not_top_share(rising, trends("p_tilde", 0.0, 66.7, -2.0, 90.0))
    assert v.status == NOT_SETTLED
    # Fig. 4a: the nearest group's fall reaches zero
    base = {g: 15.0 for g in claims.GROUPS}
    local = groups_table({1: base | {"1": 30.0, "11+": 5.0}, 2: base | {"1": 28.0, "11+": 6.0}})
    v = claims.neighbours_spread(local, trends("near_share", 30, 28, -4, 0.5))
    assert v.status == NOT_SETTLED
    # Fig. 4b: tails that grow 2× at the point, but whose interval reaches zero
    peak = pd.DataFrame(
        [(1, o, 1.0 if o == 1 else 0.3) for o in range(-10, 11) if o],
        columns=["layer", "offset", "total"],
    )
    noisy = trends("far_share", 4.0, 8.0, -1.0, 9.0)
    assert claims.peak_at_neighbours(peak, noisy).status == NOT_SETTLED


def test_fig1bc_straddling_cells_and_short_sequences() -> None:
    rows = []
    for head, eff in enumerate([0.1, 0.3, 0.2, 0.35, 0.15, 0.25]):  # ratio 0.5 on average
        rows += [(1, head, "raw", "SEP", 0.4), (1, head, "effective", "SEP", eff)]
    t = pd.DataFrame(rows, columns=["layer", "head", "kind", "target", "value"])
    v = claims.effective_vs_raw_targets(t)
    assert v.status == NOT_SETTLED and v.numbers["cells_open"] == 1
    # no sequence longer than d_v: A_eff = A, the data cannot speak
    short = claims.effective_vs_raw_targets(t, longest=40, head_dim=64)
    assert short.status == claims.NOT_TESTED and "longer than the head width" in short.sentence


def test_mixing_layer_whose_intervals_overlap_is_open() -> None:
    def summary(best_lo: list[float]) -> pd.DataFrame:
        rows = []
        for layer, lo in enumerate(best_lo):
            rows.append((layer, "attention", "hta", 0.5, 0.45, 0.55, 4))
            rows.append((layer, "globenc", "hta", lo + 0.05, lo, lo + 0.1, 4))
        return pd.DataFrame(rows, columns=list(mixing_section.SUMMARY_COLUMNS))

    assert mixing_section.mixing_claim(summary([0.7, 0.7]))[0] == SUPPORTED
    assert mixing_section.mixing_claim(summary([0.7, 0.2]))[0] == PARTLY
    assert mixing_section.mixing_claim(summary([0.7, 0.5]))[0] == NOT_SETTLED
    assert mixing_section.mixing_claim(summary([0.2, 0.3]))[0] == claims.NOT_SUPPORTED


def test_headline_counts_the_papers_claims_and_ours_apart() -> None:
    statuses = {"fig1a": SUPPORTED, "fig1bc": claims.NOT_TESTED, "fig2b": NOT_SETTLED}
    statuses |= {"fig3a": SUPPORTED, "certify_pinned": SUPPORTED, "mixing_hta": PARTLY}
    counts = tally([Verdict(k, s, "") for k, s in statuses.items()])
    assert counts["paper"] == {"claims": 4, "tested": 3, "supported": 2, "not_settled": 1}
    assert headline({"counts": counts}) == (
        "paper: 2 of 3 supported, 1 not settled, 1 not tested; beyond: 1 of 2 supported"
    )
