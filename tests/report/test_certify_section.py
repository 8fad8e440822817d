"""Report section verdicts: fabricated tables make each one pass and fail."""

from __future__ import annotations

import pandas as pd
import pytest

from identifiable.report.certify_section import (
    claim_constrained_is_closer,
    claim_effective_overshoots,
    claim_pinned,
    main_table,
    movement_figure,
)
from identifiable.report.claims import NOT_SUPPORTED, NOT_TESTED, SUPPORTED


def _rows(
    width_max: float, l1_eff: float, mass: float, l1_con: float, null_dim: int = 80
) -> pd.DataFrame:
    recs = []
    for seq, length in enumerate((40, 80, 121)):
        for layer in (1, 2, 3):
            recs.append({"seq": seq, "length": length, "layer": layer, "head": 0, "query": 5,
                         "keys": length, "null_dim": null_dim, "width_max": width_max * layer,
                         "width_mean": width_max / 6, "movable_mass": mass, "l1_effective": l1_eff,
                         "l1_constrained": l1_con, "lps": 100})  # fmt: skip
    return pd.DataFrame(recs)


@pytest.mark.parametrize(
    ("claim", "good", "bad"),
    [
        (claim_pinned, _rows(0.02, 2.0, 0.1, 0.3), _rows(0.3, 2.0, 0.1, 0.3)),
        (claim_effective_overshoots, _rows(0.02, 2.0, 0.1, 0.3), _rows(0.02, 0.1, 0.2, 0.05)),
        (claim_constrained_is_closer, _rows(0.02, 2.0, 0.1, 0.3), _rows(0.02, 0.2, 0.1, 0.3)),
    ],
)
def test_each_verdict_can_pass_and_fail(claim, good, bad):
    yes, no = claim(good), claim(bad)
    assert yes.status == SUPPORTED and no.status == NOT_SUPPORTED
    assert yes.sentence != no.sentence and any(ch.isdigit() for ch in yes.sentence)
    empty = claim(good.assign(null_dim=0))
    assert empty.status == NOT_TESTED


def test_numbers_in_the_sentence_come_from_the_table():
    v = claim_pinned(_rows(0.02, 2.0, 0.1, 0.3))
    assert v.numbers["median_width_max"] == pytest.approx(0.04)  # layers 1..3: 0.02, 0.04, 0.06
    assert "0.040" in v.sentence and "80" in v.sentence


def test_main_table_and_figure():
    rows = _rows(0.02, 2.0, 0.1, 0.3)
    t = main_table(rows)
    assert list(t["layer"]) == [1, 2, 3] and list(t["rows"]) == [3, 3, 3]
    assert t["width_max"].tolist() == pytest.approx([0.02, 0.04, 0.06])
    fig = movement_figure(rows, "tiny")
    assert len(fig.axes) == 2 and len(fig.axes[0].lines) == 4
