"""Verdicts follow the data: the same rule flips when the numbers do."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from identifiable.experiments import attribution as stages
from identifiable.report import claims


def by_length(long_r: float) -> pd.DataFrame:
    return pd.DataFrame({"length": [10, 20, 40, 60], "pearson_r": [1.0, 1.0, long_r, long_r]})


def test_fig1a() -> None:
    assert claims.pearson_by_length(by_length(0.5), head_dim=32).status == claims.SUPPORTED
    assert claims.pearson_by_length(by_length(0.999), head_dim=32).status == claims.PARTLY
    assert claims.pearson_by_length(by_length(0.5), head_dim=64).status == claims.NOT_TESTED
    bad = by_length(0.999).assign(pearson_r=[0.9, 1.0, 0.999, 0.999])
    assert claims.pearson_by_length(bad, head_dim=32).status == claims.NOT_SUPPORTED
    assert "0.500" in claims.pearson_by_length(by_length(0.5), head_dim=32).sentence


def to_tokens(raw: float, eff: float) -> pd.DataFrame:
    rows = []
    for layer in (1, 2):
        for head in range(3):
            rows += [
                (layer, head, "raw", "SEP", raw if layer == 2 else 0.05),
                (layer, head, "effective", "SEP", eff),
            ]
    return pd.DataFrame(rows, columns=["layer", "head", "kind", "target", "value"])


def test_fig1bc() -> None:
    v = claims.effective_vs_raw_targets(to_tokens(0.6, 0.05))
    assert v.status == claims.SUPPORTED and v.numbers["layer"] == 2 and v.numbers["target"] == "SEP"
    assert claims.effective_vs_raw_targets(to_tokens(0.6, 0.5)).status == claims.NOT_SUPPORTED
    assert claims.effective_vs_raw_targets(to_tokens(0.1, 0.05)).status == claims.NOT_TESTED


def per_layer(cos: list[float], l2: list[float]) -> pd.DataFrame:
    rows = []
    for probe in ("linear", "mlp"):
        rows += [(i + 1, probe, "cos", r) for i, r in enumerate(cos)]
        rows += [(i + 1, probe, "l2", r) for i, r in enumerate(l2)]
    return pd.DataFrame(rows, columns=["layer", "probe", "objective", "rate"])


def test_fig2a() -> None:
    control = pd.DataFrame({"rate": [0.05], "chance": [0.04]})
    assert claims.cosine_beats_l2(per_layer([1, 0.95], [1, 0.9])).status == claims.SUPPORTED
    assert claims.cosine_beats_l2(per_layer([1, 0.85], [1, 0.9])).status == claims.PARTLY
    assert (
        claims.identifiable_at_depth(per_layer([1, 0.9], [1, 0.8]), control).status
        == claims.SUPPORTED
    )
    assert (
        claims.identifiable_at_depth(per_layer([1, 0.6], [1, 0.5]), control).status == claims.PARTLY
    )
    leaky = pd.DataFrame({"rate": [0.5], "chance": [0.04]})
    assert (
        claims.identifiable_at_depth(per_layer([1, 0.9], [1, 0.8]), leaky).status == claims.PARTLY
    )


def test_attribution_claims() -> None:
    own = pd.DataFrame(
        {
            "layer": [1, 1, 2, 2],
            "own": [0.5, 0.4, 0.2, 0.1],
            "own_is_top": [True, True, True, False],
        }
    )
    assert claims.own_contribution_falls(own).status == claims.SUPPORTED
    assert (
        claims.own_contribution_falls(own.assign(layer=[2, 2, 1, 1])).status == claims.NOT_SUPPORTED
    )
    share, verdict = claims.not_top_share(own)
    assert share["percent"].tolist() == [0.0, 50.0] and verdict.status == claims.SUPPORTED


def contributions(decay: list[float], n: int, gen: torch.Generator) -> torch.Tensor:
    """`[L, n, n]` random rows summing to 1 that decay with distance at a rate per layer."""
    dist = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().double()
    c = torch.stack([torch.exp(-rate * dist) for rate in decay]) * (
        1 + torch.rand(len(decay), n, n, generator=gen, dtype=torch.float64)
    )
    return c / c.sum(-1, keepdim=True)


def test_attribution_aggregates_match_the_attribution_experiment() -> None:
    from identifiable.attribution.api import HTAResult
    from identifiable.experiments.attribution import attribution_tables

    gen = torch.Generator().manual_seed(0)
    results, rows = [], {name: [] for name in stages.ATTRIBUTION_COLUMNS}
    for seq, n in enumerate([5, 17, 30]):
        c = contributions([1.0, 0.1], n, gen)
        special = torch.zeros(n, dtype=torch.bool)
        special[[0, n - 1]] = True
        results.append(
            HTAResult(c, None, c, None, ["t"] * n, torch.arange(n), special, None, 0, 0, 0, 0.0)
        )
        for name, new in stages.reduce_attribution(seq, c, special).items():
            rows[name] += new
    tables = {
        name: pd.DataFrame(r, columns=stages.ATTRIBUTION_COLUMNS[name]) for name, r in rows.items()
    }
    theirs = attribution_tables(results)
    ours = claims.neighbour_groups(tables["groups"])
    merged = ours.merge(theirs.distance, on=["layer", "group"])
    assert len(merged) == 12
    assert np.allclose(merged["percent"], merged["per_position_percent"])
    assert np.allclose(ours.groupby("layer")["percent"].sum(), 100)
    verdict = claims.neighbours_spread(ours)
    assert verdict.status == claims.SUPPORTED  # fast decay at layer 1, slow at layer 2
    positions = claims.relative_positions(tables["offsets"])
    theirs_pos = theirs.relative_position[theirs.relative_position["offset"] != 0]
    both = positions.merge(theirs_pos, on=["layer", "offset"])
    assert len(both) == len(positions) and np.allclose(both["total_x"], both["normalised"])
    assert 0 not in positions["offset"].tolist()
    assert claims.peak_at_neighbours(positions).status == claims.SUPPORTED
    share, _ = claims.not_top_share(tables["own"])
    assert np.allclose(
        share["percent"].to_numpy() / 100,
        theirs.own_summary.sort_values("layer")["p_tilde"].to_numpy(),
    )
