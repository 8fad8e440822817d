"""The posterior section of the report (`report.posterior_section`): each verdict on
fabricated tables that pass, fail and straddle; flagged rows are left out of the verdicts
with a count, drawn as flagged in the figure and listed in the flagged table."""

from __future__ import annotations

import pandas as pd
import pytest

from identifiable.report.posterior_section import (
    FLAG_WORDS,
    claim_band_inside,
    claim_top_key_settled,
    flagged_table,
    section,
    uncertainty_figure,
)
from identifiable.report.verdicts import NOT_SETTLED, NOT_SUPPORTED, NOT_TESTED, SUPPORTED


def _rows(ratios: list[float], settled: list[bool] | None = None, **extra: object) -> pd.DataFrame:
    """One sound row with a null space per ratio (credible_max / certified_max), over two
    sequences and three layers; `settled`: whether each row's raw top key is settled."""
    settled = [True] * len(ratios) if settled is None else settled
    recs = []
    for i, (ratio, ok) in enumerate(zip(ratios, settled, strict=True)):
        recs.append({
            "seq": i % 2, "length": 40 + 10 * (i % 2), "layer": i % 3, "head": i % 4,
            "query": i, "keys": 40, "null_dim": 8, "certified_max": 0.2,
            "certified_mean": 0.05, "credible_max": 0.2 * ratio, "credible_mean": 0.01,
            "width_ratio": ratio, "top_key": 0, "p_top_stays": 1.0 if ok else 0.6,
            "settled": ok, "ess": 400.0, "rhat": 1.004, "draws": 800, "flags": 0,
            "flagged": False, "flag_text": "", "top_effective": i % 2, "top_constrained": 0,
            "l1_effective": 0.9, "l1_constrained": 0.1, "l1_mean": 0.03,
        } | extra)  # fmt: skip
    return pd.DataFrame(recs)


def _flagged(n: int, ratio: float, settled: bool) -> pd.DataFrame:
    return _rows([ratio] * n, [settled] * n, flagged=True, flags=1, rhat=1.05,
                 flag_text="R̂ > 1.01")  # fmt: skip


NARROW = [0.2, 0.25, 0.3, 0.22, 0.28, 0.35, 0.3, 0.2, 0.26, 0.31, 0.24, 0.33]
WIDE = [0.7, 0.8, 0.65, 0.9, 0.75, 0.85, 0.6, 0.7, 0.8, 0.72, 0.66, 0.95]
MIXED = [0.2, 0.8, 0.3, 0.7, 0.4, 0.6, 0.35, 0.65, 0.45, 0.55, 0.3, 0.75]


@pytest.mark.parametrize(
    ("ratios", "status"),
    [(NARROW, SUPPORTED), (WIDE, NOT_SUPPORTED), (MIXED, NOT_SETTLED), ([0.1] * 4, NOT_SETTLED)],
)
def test_the_band_verdict_passes_fails_and_straddles(ratios: list[float], status: str) -> None:
    v = claim_band_inside(_rows(ratios))
    assert v.status == status, v.sentence
    assert v.sentence.startswith(status.capitalize())
    assert v.numbers["median_ratio"] == pytest.approx(pd.Series(ratios).median())
    assert v.numbers["median_ratio_lo"] <= v.numbers["median_ratio"] <= v.numbers["median_ratio_hi"]
    assert f"{v.numbers['median_ratio']:.3f}" in v.sentence


def _settled(unsettled: int, n: int = 40) -> list[bool]:
    return [i >= unsettled for i in range(n)]


@pytest.mark.parametrize(
    ("unsettled", "status"),
    [(4, SUPPORTED), (34, NOT_SUPPORTED), (20, NOT_SETTLED), (16, NOT_SETTLED)],
)
def test_the_top_key_verdict_passes_fails_and_straddles(unsettled: int, status: str) -> None:
    rows = _rows([0.3] * 40, _settled(unsettled))
    v = claim_top_key_settled(rows)
    assert v.status == status, v.sentence
    assert v.numbers["unsettled"] == pytest.approx(unsettled / 40)
    assert v.numbers["unsettled_lo"] <= unsettled / 40 <= v.numbers["unsettled_hi"]
    assert f"in {unsettled} of 40 rows" in v.sentence
    # beside it: A_eff's top key is on another key in every other row, the constrained row's never
    assert v.numbers["effective_moves_top"] == 0.5 and v.numbers["constrained_moves_top"] == 0


def test_flagged_rows_and_points_are_left_out_with_a_count() -> None:
    sound = _rows(NARROW, _settled(1, len(NARROW)))
    points = _rows([float("nan")] * 3, null_dim=0, ess=float("nan"), flags=4,
                   flag_text="point (dim P = 0)")  # fmt: skip
    # flagged rows that would turn both verdicts round if they were used
    rows = pd.concat([sound, _flagged(30, 0.95, False), points], ignore_index=True)
    for claim in (claim_band_inside, claim_top_key_settled):
        alone, mixed = claim(sound), claim(rows)
        assert mixed.status == alone.status == SUPPORTED
        assert mixed.numbers["flagged"] == 30 and mixed.numbers["points"] == 3
        assert mixed.numbers["rows"] == len(NARROW)
        assert "30 flagged rows left out; 3 rows without a null space" in mixed.sentence
    only_flagged = pd.concat([_flagged(8, 0.3, True), points], ignore_index=True)
    for claim in (claim_band_inside, claim_top_key_settled):
        v = claim(only_flagged)
        assert v.status == NOT_TESTED and "8 flagged rows left out" in v.sentence


def _by_layer(rows: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"layer": [0, 1, 2], "unsettled": [0.1, 0.0, 0.2],
                         "effective_moves_top": [0.5, 0.4, 0.6],
                         "constrained_moves_top": [0.0, 0.1, 0.0]})  # fmt: skip


def test_figure_and_table_show_the_flagged_rows() -> None:
    rows = pd.concat([_rows(NARROW), _flagged(5, 0.9, False)], ignore_index=True)
    fig = uncertainty_figure(rows, _by_layer(rows), "tiny")
    left, middle, right = fig.axes
    for ax in (left, middle):
        crosses = [c for c in ax.collections if c.get_label() == FLAG_WORDS]
        assert len(crosses) == 1 and len(crosses[0].get_offsets()) == 5
    assert len(right.patches) == 3  # one bar per layer
    clean = uncertainty_figure(_rows(NARROW), _by_layer(rows), "tiny")
    assert not [c for c in clean.axes[0].collections if c.get_label() == FLAG_WORDS]
    table = flagged_table(rows)
    assert len(table) == 5 and set(table["flag_text"]) == {"R̂ > 1.01"}
    assert flagged_table(_rows(NARROW)).empty


def test_section_reads_the_tables_and_writes_one_figure() -> None:
    rows = pd.concat([_rows(NARROW), _flagged(2, 0.9, False)], ignore_index=True)
    written: list[str] = []

    def fig(stem: str, figure: object, caption: str) -> tuple[str, bytes, str]:
        written.append(caption)
        return stem, b"", caption

    class Info:
        name = "tiny"

    tables = {"posterior_rows": rows, "posterior_by_layer": _by_layer(rows)}
    s = section(tables, Info(), fig)
    assert s.key == "posterior" and s.title.startswith("8. ")
    assert [v.key for v in s.verdicts] == ["posterior_band", "posterior_top"]
    assert "14 sampled rows of 2 sequences of 40–50 tokens" in written[0]
    assert "2 flagged rows" in written[0]
    assert dict(s.tables)["posterior_flagged"].shape[0] == 2
