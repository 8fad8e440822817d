"""Corpus-level tables for Figs. 3-4, on synthetic results and on a tiny model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from identifiable.attribution import HTAResult
from identifiable.errors import IdentifiableError
from identifiable.experiments.attribution import attribution_tables, run_attribution_experiment


def fake_result(c: torch.Tensor, tokens: list[str], special: list[bool]) -> HTAResult:
    return HTAResult(
        contributions=c, stderr=None, sq_norms=c.square(), sq_norms_stderr=None, tokens=tokens,
        input_ids=torch.arange(len(tokens)), special=torch.tensor(special), probes=None, seed=0,
        n_jvps=0, chunk_size=1, seconds=0.0,
    )  # fmt: skip


def random_result(n: int, seed: int, n_layers: int = 2) -> HTAResult:
    raw = torch.rand(
        n_layers, n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    tokens = ["[CLS]", *(f"w{i}" for i in range(n - 2)), "[SEP]"]
    return fake_result(raw / raw.sum(-1, keepdim=True), tokens, [True, *[False] * (n - 2), True])


@pytest.fixture(scope="module")
def synthetic():
    results = [random_result(9, 0), random_result(14, 1)]
    return results, attribution_tables(results, max_offset=12)


def test_own_summary_matches_direct_computation(synthetic):
    results, t = synthetic
    own = [
        np.concatenate([torch.diagonal(r.contributions[layer]).numpy() for r in results])
        for layer in (0, 1)
    ]
    not_top = [
        np.concatenate(
            [
                (r.contributions[layer].argmax(-1) != torch.arange(r.n_tokens)).numpy()
                for r in results
            ]
        )
        for layer in (0, 1)
    ]
    s = t.own_summary.set_index("layer")
    for layer in (1, 2):
        assert s.loc[layer, "n_tokens"] == 23
        assert s.loc[layer, "median"] == pytest.approx(np.median(own[layer - 1]))
        assert s.loc[layer, "q1"] == pytest.approx(np.quantile(own[layer - 1], 0.25))
        assert s.loc[layer, "p_tilde"] == pytest.approx(not_top[layer - 1].mean())
    assert len(t.tokens) == 2 * 23 and set(t.tokens["sequence"]) == {0, 1}


def test_distance_table(synthetic):
    _, t = synthetic
    d = t.distance
    assert list(d["group"].unique()) == ["1", "2", "3", "4-5", "6-10", "11+"]
    sums = d.groupby("layer")["per_position_percent"].sum()
    np.testing.assert_allclose(sums.to_numpy(), 100.0)
    own_mean = t.tokens.groupby("layer")["own"].mean() * 100
    total = d.groupby("layer")["total_share_percent"].sum() + own_mean
    np.testing.assert_allclose(total.to_numpy(), 100.0)
    assert (d["normalisation"].str.contains("number of those positions")).all()
    # only the 14-token sequence has tokens 11+ apart: tokens 0-2 and 11-13
    assert d.loc[d["group"] == "11+", "n_tokens"].iloc[0] == 6


def test_relative_position_table(synthetic):
    results, t = synthetic
    rp = t.relative_position
    assert 0 not in set(rp["offset"]) and rp["offset"].min() == -12 and rp["offset"].max() == 12
    np.testing.assert_allclose(rp.groupby("layer")["normalised"].max().to_numpy(), 1.0)
    row = rp[(rp["layer"] == 1) & (rp["offset"] == 1)].iloc[0]
    expect = sum(float(torch.diagonal(r.contributions[0], offset=1).sum()) for r in results)
    assert row["total"] == pytest.approx(expect)
    assert row["n_pairs"] == 8 + 13


def test_special_table(synthetic):
    results, t = synthetic
    sp = t.special.set_index(["layer", "special_token"])
    cls = [float(r.contributions[0, 1:-1, 0].sum()) for r in results]
    both = [float(r.contributions[0, 1:-1][:, [0, -1]].sum()) for r in results]
    assert sp.loc[(1, "[CLS]"), "share_percent"] == pytest.approx(100 * sum(cls) / 19)
    assert sp.loc[(1, "any"), "share_percent"] == pytest.approx(100 * sum(both) / 19)
    assert (t.special["queries"] == "non-special tokens").all()


def test_save_writes_every_table(synthetic, tmp_path):
    _, t = synthetic
    paths = t.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)
    assert len(paths) == 5
    back = pd.read_csv(tmp_path / "attribution_own_summary.csv")
    np.testing.assert_allclose(back["median"], t.own_summary["median"])
    with pytest.raises(IdentifiableError, match="does not exist"):
        t.save(tmp_path / "missing")


def test_empty_corpus_and_mixed_models():
    with pytest.raises(IdentifiableError, match="empty"):
        attribution_tables([])
    with pytest.raises(IdentifiableError, match="layers"):
        attribution_tables([random_result(5, 0, n_layers=2), random_result(5, 1, n_layers=3)])


def test_run_on_tiny_model(tiny_model):
    texts = ["A short sentence.", "Another, slightly longer sentence follows here."]
    t = run_attribution_experiment(tiny_model("bert"), texts, probes=2, seed=1)
    assert t.meta["n_sequences"] == 2 and t.meta["probes"] == [2]
    assert set(t.own_summary["layer"]) == {1, 2}
    assert "own_stderr" in t.tokens and t.tokens["own_stderr"].notna().all()
    assert set(t.special["special_token"]) == {"[CLS]", "[SEP]", "any"}
