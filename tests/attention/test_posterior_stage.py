"""The posterior pipeline stage on a tiny model: its rows against the analyses called
directly, its flags and its reduce."""

from __future__ import annotations

import math

import pytest

from identifiable.attention import attention_posterior, constrained_attention, interval_map
from identifiable.attention.chains import FLAG_POINT
from identifiable.experiments.posterior import (
    ROW_COLUMNS,
    SETTLED,
    UNSOUND,
    posterior_reduce,
    posterior_tables,
    sample_rows,
)
from identifiable.utils.threads import one_thread

TEXT = "the cat sat on the mat. the dog sat on the log, and the bird sat."  # n = 21 > d_v + 1


@pytest.fixture(scope="module")
def stage(tiny_model):
    """The model and one shard's tables (sequence 7, seed 3, 20 samples), with the progress
    calls it made."""
    model, calls = tiny_model("bert"), []
    part = posterior_tables(model, [TEXT], 7, calls.append, samples=20, seed=3)
    return model, part, calls


def test_stage_rows_agree_with_the_analyses(stage):
    model, part, calls = stage
    rows = part["rows"]
    tr = model.trace(TEXT)
    assert list(rows.columns) == ROW_COLUMNS and calls == [1]
    assert len(rows) == tr.n_layers * tr.n_heads and set(rows["seq"]) == {7}
    # the chains are seeded by (seed, seq, layer): a direct call gives the same draws
    layer = 1
    picked, chain_seed = sample_rows(tr.n_tokens, 1, 3, 7, layer)
    with one_thread():  # as the stage runs it: the same thread count, the same draws
        post = attention_posterior(tr, layer, [0, 1, 2, 3], picked, samples=20, seed=chain_seed)
    r = rows[(rows["layer"] == layer) & (rows["head"] == 2)].iloc[0]
    assert r["query"] == picked[0] and r["length"] == tr.n_tokens == r["keys"]
    assert r["p_top_stays"] == float(post.p_top_stays[2, 0])
    assert r["credible_max"] == float(post.credible_width[2, 0].max())
    assert r["ess"] == float(post.ess[2, 0]) and r["draws"] == int(post.draws[2, 0])
    imap = interval_map(tr, layers=[layer], heads=[2], rows=picked)
    assert r["certified_max"] == pytest.approx(float(imap.width.max()), abs=1e-12)
    assert r["null_dim"] == int(imap.null_dim[0, 0, 0]) == tr.n_tokens - 16 - 1
    con = constrained_attention(tr, layer, 2, rows=picked)
    assert r["l1_effective"] == pytest.approx(float(con.l1_effective[0]), abs=1e-9)
    assert r["l1_constrained"] == pytest.approx(float(con.l1_constrained[0]), abs=1e-9)
    # every draw is a valid row, so the credible band lies inside the certified interval
    assert (rows["credible_max"] <= rows["certified_max"] + 1e-9).all()
    assert ((rows["width_ratio"] > 0) & (rows["width_ratio"] <= 1 + 1e-9)).all()
    assert (rows["flagged"] == ((rows["flags"] & UNSOUND) != 0)).all()
    assert (rows["settled"] == (rows["p_top_stays"] >= SETTLED)).all()
    flagged = rows[rows["flagged"]]
    assert (flagged["flag_text"] != "").all()  # 20 samples: some chains stop at the cap
    assert not (rows["flags"] & FLAG_POINT).any()  # n > d_v + 1: every row has a null space


def test_reduce_counts_every_row_and_averages_the_sound_ones(stage):
    part = stage[1]
    rows = part["rows"]
    red = posterior_reduce([part, part])
    assert len(red["rows"]) == 2 * len(rows)
    by_layer = red["by_layer"]
    assert list(by_layer["layer"]) == [0, 1] and (by_layer["rows"] == 8).all()
    assert (by_layer["flagged"] + by_layer["used"] + by_layer["points"] == by_layer["rows"]).all()
    for layer, group in rows.groupby("layer"):
        sound = group[~group["flagged"]]
        got = by_layer[by_layer["layer"] == layer].iloc[0]
        assert got["flagged"] == 2 * group["flagged"].sum()
        if len(sound):
            assert got["credible_max"] == pytest.approx(sound["credible_max"].mean())
            assert got["unsettled"] == pytest.approx(1 - sound["settled"].mean())
        else:
            assert math.isnan(got["credible_max"])
    assert list(red["by_length"]["seq"]) == [7] and red["by_length"]["rows"].item() == 16
    assert posterior_reduce([])["by_layer"].empty
