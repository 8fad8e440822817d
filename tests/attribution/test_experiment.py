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
    for layer in (0, 1):  # tables number layers as the results do (block l, from 0)
        assert s.loc[layer, "n_tokens"] == 23
        assert s.loc[layer, "median"] == pytest.approx(np.median(own[layer]))
        assert s.loc[layer, "q1"] == pytest.approx(np.quantile(own[layer], 0.25))
        assert s.loc[layer, "p_tilde"] == pytest.approx(not_top[layer].mean())
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
    row = rp[(rp["layer"] == 0) & (rp["offset"] == 1)].iloc[0]
    expect = sum(float(torch.diagonal(r.contributions[0], offset=1).sum()) for r in results)
    assert row["total"] == pytest.approx(expect)
    assert row["n_pairs"] == 8 + 13


def test_special_table(synthetic):
    results, t = synthetic
    sp = t.special.set_index(["layer", "special_token"])
    cls = [float(r.contributions[0, 1:-1, 0].sum()) for r in results]
    both = [float(r.contributions[0, 1:-1][:, [0, -1]].sum()) for r in results]
    assert sp.loc[(0, "[CLS]"), "share_percent"] == pytest.approx(100 * sum(cls) / 19)
    assert sp.loc[(0, "any"), "share_percent"] == pytest.approx(100 * sum(both) / 19)
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
    assert set(t.own_summary["layer"]) == {0, 1}
    assert "own_stderr" in t.tokens and t.tokens["own_stderr"].notna().all()
    assert set(t.special["special_token"]) == {"[CLS]", "[SEP]", "any"}


def _stage_tables(lengths: list[int], seed: int = 0) -> dict[str, pd.DataFrame]:
    """The attribution stage's per-sequence tables for random contributions of given lengths."""
    from identifiable.experiments.attribution import ATTRIBUTION_COLUMNS, attribution_rows

    rows: dict[str, list] = {name: [] for name in ATTRIBUTION_COLUMNS}
    for seq, n in enumerate(lengths):
        c = random_result(n, seed + seq).contributions
        special = torch.zeros(n, dtype=torch.bool)
        special[[0, n - 1]] = True
        for name, new in attribution_rows(seq, c, special, 0.01 * c).items():
            rows[name] += new
    return {name: pd.DataFrame(r, columns=ATTRIBUTION_COLUMNS[name]) for name, r in rows.items()}


def test_expanded_quantile_matches_numpy_and_repeats_values():
    from identifiable.experiments.attribution_summaries import _expanded_quantile

    rng = np.random.default_rng(0)
    values = np.sort(rng.random(11))
    for q in (0.25, 0.5, 0.75):
        ones = np.ones((1, 11), dtype=np.int64)
        assert _expanded_quantile(values, ones, q)[0] == pytest.approx(np.quantile(values, q))
        weights = rng.integers(0, 3, size=(1, 11))
        weights[0, 0] = 1
        expanded = np.repeat(values, weights[0])
        assert _expanded_quantile(values, weights, q)[0] == pytest.approx(np.quantile(expanded, q))


def test_bootstrap_summaries_agree_with_the_report_and_bracket_it():
    from identifiable.experiments.attribution import attribution_reduce
    from identifiable.report import claims

    tables = _stage_tables([9, 14, 20, 11, 16])
    half = len(tables["own"]) // 2
    parts = [{k: v.iloc[:half] if k == "own" else v for k, v in tables.items()}]
    parts.append({"own": tables["own"].iloc[half:]})
    out = attribution_reduce(parts, probes=3, seed=1, resamples=200)
    own = out["own_summary"].set_index("layer")
    medians = tables["own"].groupby("layer")["own"].median() * 100
    np.testing.assert_allclose(own["median"], medians.to_numpy())
    share, _ = claims.not_top_share(tables["own"])
    np.testing.assert_allclose(own["p_tilde"], share["percent"].to_numpy())
    groups = out["groups_summary"].merge(
        claims.neighbour_groups(tables["groups"]), on=["layer", "group"]
    )
    np.testing.assert_allclose(groups["percent_x"], groups["percent_y"])
    pos = out["offsets_summary"].merge(
        claims.relative_positions(tables["offsets"]), on=["layer", "offset"]
    )
    assert len(pos) == len(out["offsets_summary"])
    np.testing.assert_allclose(pos["total_x"], pos["total_y"])
    for name, stat in (
        ("own_summary", "median"),
        ("own_summary", "p_tilde"),
        ("groups_summary", "percent"),
    ):
        t = out[name]
        assert (t[f"{stat}_lo"] <= t[stat] + 1e-9).all() and (
            t[stat] <= t[f"{stat}_hi"] + 1e-9
        ).all()
        assert (t[f"{stat}_hi"] > t[f"{stat}_lo"]).any()  # five sequences do vary
    est = out["estimator"].iloc[0]
    assert (
        est["n_sequences"] == 5
        and est["probes"] == 3
        and est["median_rel_stderr_own"] == pytest.approx(0.01)
    )
    again = attribution_reduce(parts, probes=3, seed=1, resamples=200)
    other = attribution_reduce(parts, probes=3, seed=2, resamples=200)
    pd.testing.assert_frame_equal(out["own_summary"], again["own_summary"])  # seeded
    assert not out["groups_summary"]["percent_lo"].equals(other["groups_summary"]["percent_lo"])


def test_pairs_are_drawn_from_the_stated_length_range(tiny_model):
    from identifiable.experiments.attribution import items_in_length_range

    model = tiny_model("bert")
    items = ["a b c", "one two three four five six seven eight nine ten", "x", "p q r s t u v w"]
    lengths = [len(model.encode(t, truncate=True)) for t in items]
    chosen = items_in_length_range(model, items, 8, 12, 2)
    assert all(8 <= len(model.encode(t, truncate=True)) <= 12 for t in chosen) and len(chosen) == 2
    filled = items_in_length_range(model, items, 11, 12, 3)  # one qualifies; the longest fill up
    assert len(filled) == 3 and items[2] not in filled, lengths
