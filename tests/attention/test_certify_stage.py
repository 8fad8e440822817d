"""The certify pipeline stage on a tiny model, and its reduce."""

from __future__ import annotations

import torch

from helpers.traces import TEXT_LONG
from identifiable.attention import constrained_attention, interval_map
from identifiable.experiments.certify import ROW_COLUMNS, certify_reduce, certify_tables


def test_stage_rows_agree_with_the_analyses(tiny_model):
    model = tiny_model("bert")
    shard = [TEXT_LONG, ("the cat sat on the mat.", TEXT_LONG)]
    calls = []
    part = certify_tables(model, shard, 10, calls.append, rows_per_head=2, seed=3, heads=[0, 2])
    rows = part["rows"]
    assert list(rows.columns) == ROW_COLUMNS and calls == [1, 1]
    assert len(rows) == 2 * 2 * 2 * 2 and set(rows["seq"]) == {10, 11}
    again = certify_tables(model, shard, 10, lambda _: None, rows_per_head=2, seed=3, heads=[0, 2])
    assert again["rows"].equals(rows)  # same seed, same rows
    r = rows.iloc[5]
    tr = model.trace(shard[int(r["seq"]) - 10])
    layer, head, q = int(r["layer"]), int(r["head"]), int(r["query"])  # tables: from 0
    imap = interval_map(tr, layers=[layer], heads=[head], rows=[q])
    assert abs(float(imap.width.max()) - r["width_max"]) < 1e-12
    assert abs(float(imap.movable_mass[0, 0, 0]) - r["movable_mass"]) < 1e-12
    con = constrained_attention(tr, layer, head, rows=[q])
    assert abs(float(con.l1_effective[0]) - r["l1_effective"]) < 1e-12
    live = rows[rows["null_dim"] > 0]
    assert len(live) and (live["width_max"] > 0).all()
    assert (rows["l1_constrained"] <= 2 * rows["movable_mass"] + 1e-9).all()  # a valid row
    red = certify_reduce([part, part])
    assert len(red["rows"]) == 2 * len(rows)
    assert list(red["by_layer"]["layer"]) == [0, 1] and (red["by_layer"]["n_rows"] == 16).all()
    assert len(red["by_length"]) == 2
    assert torch.isfinite(torch.tensor(red["by_layer"]["width_mean"].to_numpy())).all()
