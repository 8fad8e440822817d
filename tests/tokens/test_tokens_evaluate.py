"""End-to-end evaluation on synthetic pairs: rates, control at chance, ties, cross-layer, errors."""

from __future__ import annotations

import pytest
import torch

from helpers.token_pairs import synthetic_pairs, vocabulary
from identifiable.errors import IdentifiableError
from identifiable.tokens.evaluate import evaluate_pairs
from identifiable.tokens.extract import TokenPairs
from identifiable.tokens.probes import ProbeConfig

# small MLPs and short selection keep the protocol but not its cost (synthetic d = 16)
FAST = {
    "cross_layer": (),
    "controls": (),
    "probe_config": ProbeConfig(mlp_width=32, max_steps=400, select_steps=20),
}


def _rate(df, layer, probe, objective, column="rate"):
    row = df[(df["layer"] == layer) & (df["probe"] == probe) & (df["objective"] == objective)]
    assert len(row) == 1
    return float(row[column].iloc[0])


def test_linear_probe_undoes_what_the_naive_probe_cannot():
    pairs = synthetic_pairs(n_seq=50, d=16, n_layers=3)
    ev = evaluate_pairs(pairs, layers=[0, 3], **FAST)
    df = ev.per_layer
    assert len(df) == 2 * 6
    for probe in ("naive", "linear", "mlp"):
        assert _rate(df, 0, probe, "l2") == 1.0  # e^0 against itself
    assert _rate(df, 3, "linear", "l2") > 0.95 and _rate(df, 3, "linear", "cos") > 0.95
    assert _rate(df, 3, "naive", "l2") < 0.5  # rotated and scaled: identity fails
    for _, row in df.iterrows():
        assert row["ci_low"] <= row["rate"] <= row["ci_high"]
        assert row["n_tokens"] == ev.split.test.numel()


def test_shuffled_target_control_lands_near_chance():
    pairs = synthetic_pairs(n_seq=120, d=16, n_layers=2, seq_len=(10, 16))
    ev = evaluate_pairs(pairs, probe_kinds=["linear"], layers=[1, 2], cross_layer=())
    ctrl = ev.control
    assert set(zip(ctrl["probe"], ctrl["objective"], strict=True)) == {
        ("linear", "l2"),
        ("linear", "cos"),
    }
    chance = float(ctrl["chance"].iloc[0])
    assert 0.05 < chance < 0.1  # about 1/13 candidates per sequence
    for _, row in ctrl.iterrows():
        # chance lies inside (or within a hair of) the 95 % interval; the real probe is far above
        assert row["ci_low"] - 0.02 <= chance <= row["ci_high"] + 0.02, row
        assert abs(row["rate"] - chance) < 0.06
    assert (ev.per_layer["rate"] > 0.9).all()


def test_ties_are_counted_when_repeated_tokens_share_e0():
    # No positions and a tiny vocabulary: repeated ids in a sequence have identical e^0.
    pairs = synthetic_pairs(n_seq=60, d=16, n_layers=1, positions=False, vocab=20)
    ev = evaluate_pairs(pairs, probe_kinds=["naive"], objectives=["l2"], layers=[0], **FAST)
    row = ev.per_layer.iloc[0]
    test = ev.split.test
    ids, seq = pairs.input_ids[test], pairs.seq_ids[test]
    expected_tied = sum(
        int(((ids == ids[i]) & (seq == seq[i])).sum() > 1) for i in range(test.numel())
    )
    assert row["n_tied"] == expected_tied > 0
    assert row["rate"] == 1.0  # a tie with an identical vector still identifies the input
    assert row["rate_strict"] == pytest.approx(1 - expected_tied / test.numel())
    assert row["chance"] > (1.0 / pairs.seq_ids.bincount().float()).mean() * 0.9


def test_positions_make_every_e0_unique_so_no_ties():
    pairs = synthetic_pairs(n_seq=40, d=16, n_layers=1, positions=True, vocab=20)
    ev = evaluate_pairs(pairs, probe_kinds=["naive"], objectives=["l2"], layers=[0], **FAST)
    assert ev.per_layer["n_tied"].iloc[0] == 0
    assert ev.per_layer["rate_strict"].iloc[0] == 1.0


def test_cross_layer_diagonal_equals_the_per_layer_rate():
    pairs = synthetic_pairs(n_seq=50, d=16, n_layers=3, noise=0.4)
    ev = evaluate_pairs(pairs, probe_kinds=["linear"], objectives=["cos"], controls=())
    cross = ev.cross_layer
    assert len(cross) == 2 * 9 and set(cross["regime"]) == {"ridge start", "identity start"}
    assert set(cross["train_layer"]) == {1, 2, 3}
    for layer in (1, 2, 3):
        # Fig. 2a's probe is the better-validated of the two starts' fits
        row = ev.per_layer[(ev.per_layer["layer"] == layer) & (ev.per_layer["probe"] == "linear")]
        chosen = cross[cross["regime"] == f"{row['start'].iloc[0]} start"]
        diag = chosen[(chosen["train_layer"] == layer) & (chosen["test_layer"] == layer)]
        assert float(diag["rate"].iloc[0]) == _rate(ev.per_layer, layer, "linear", "cos")
        fits = cross[(cross["train_layer"] == layer) & (cross["test_layer"] == layer)]
        assert float(row["val_rate"].iloc[0]) == fits["fit_val_rate"].max()
    with pytest.raises(IdentifiableError, match="unknown cross-layer regime"):
        evaluate_pairs(pairs, probe_kinds=["linear"], cross_layer_regimes=["best"], controls=())


@pytest.mark.parametrize("candidates", ["corpus", "vocabulary"])
def test_other_candidate_sets(candidates):
    pairs = synthetic_pairs(n_seq=50, d=16, n_layers=2, positions=False, vocab=60)
    vocab = vocabulary(pairs, vocab=60, d=16)
    ev = evaluate_pairs(pairs, candidates=candidates, layers=[0, 2], vocab_embeddings=vocab, **FAST)
    df = ev.per_layer
    n_test = ev.split.test.numel()
    if candidates == "vocabulary":
        assert ((df["chance"] - 1 / 60).abs() < 1e-12).all()  # one row per id among 60
        assert (df["n_tied"] == 0).all()
    else:
        assert (df["n_tied"] > 0).all()  # ids repeat across the evaluation set
        assert (df["chance"] < 0.1).all() and (df["n_tokens"] == n_test).all()
    assert _rate(df, 0, "naive", "cos") == 1.0
    assert _rate(df, 2, "linear", "l2") > 0.9


def test_evaluation_is_deterministic_under_a_seed():
    pairs = synthetic_pairs(n_seq=40, d=12, n_layers=2, noise=0.5)
    a, b = (evaluate_pairs(pairs, seed=7, probe_config=FAST["probe_config"]) for _ in range(2))
    c = evaluate_pairs(pairs, seed=8, probe_config=FAST["probe_config"])
    assert a.per_layer.equals(b.per_layer) and a.control.equals(b.control)
    assert a.cross_layer.equals(b.cross_layer)
    assert not torch.equal(a.split.test, c.split.test)


@pytest.mark.parametrize("layers", [[4], [-1], [0, 9]])
def test_layer_out_of_range_is_a_clear_error(layers):
    pairs = synthetic_pairs(n_seq=20, n_layers=3)
    with pytest.raises(IdentifiableError, match=r"out of range: valid layers are 0\.\.3"):
        evaluate_pairs(pairs, layers=layers)


def test_too_few_tokens_states_the_minimum():
    pairs = synthetic_pairs(n_seq=4, d=16, seq_len=(5, 5))
    with pytest.raises(
        IdentifiableError, match=r"got 20 tokens in 4 sequences, need at least 34 tokens"
    ):
        evaluate_pairs(pairs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"probe_kinds": ["svm"]}, "unknown probe 'svm'"),
        ({"objectives": ["l1"]}, "unknown objective 'l1'"),
        ({"candidates": "everything"}, "unknown candidates 'everything'"),
        ({"candidates": "vocabulary"}, "needs the vocabulary embedding matrix"),
    ],
)
def test_bad_options_are_clear_errors(kwargs, message):
    with pytest.raises(IdentifiableError, match=message):
        evaluate_pairs(synthetic_pairs(n_seq=20), **kwargs)


def test_float16_storage_gives_the_same_rates_at_this_precision():
    pairs = synthetic_pairs(n_seq=40, d=16, n_layers=2)
    half = TokenPairs(pairs.states.half(), pairs.seq_ids, pairs.input_ids, pairs.positions)
    a = evaluate_pairs(pairs, probe_kinds=["linear"], objectives=["l2"], **FAST).per_layer
    b = evaluate_pairs(half, probe_kinds=["linear"], objectives=["l2"], **FAST).per_layer
    assert (a["rate"] - b["rate"]).abs().max() < 0.02


def test_fit_table_marks_unfinished_fits_and_mlps_below_the_naive_probe():
    pairs = synthetic_pairs(n_seq=40, d=16, n_layers=1)
    # two hidden units and 20 steps: the MLP cannot learn the identity of layer 0
    starved = ProbeConfig(mlp_width=2, max_steps=20, select_steps=5, eval_every=5)
    ev = evaluate_pairs(pairs, layers=[0], cross_layer=(), controls=(), probe_config=starved)
    df = ev.per_layer.set_index(["probe", "objective"])
    assert df.loc[("naive", "cos"), "rate"] == 1.0
    mlp = df.loc[("mlp", "cos")]
    assert mlp["rate"] < 1.0 and bool(mlp["fit_failure"]) and mlp["mlp_width"] == 2
    assert mlp["stopped"] == "max steps" and not bool(mlp["converged"])
    assert mlp["late_gain"] > 0.01 and mlp["optimizer"] == "Adam"
    linear = df.loc[("linear", "cos")]
    assert linear["optimizer"] == "L-BFGS" and not bool(linear["fit_failure"])
    # at e^0 itself the identity identifies every validation token: nothing can beat it
    l2 = df.loc[("linear", "l2")]
    assert l2["start"] == "identity" and l2["stopped"] == "ceiling" and l2["rate"] == 1.0
    # a well-fed MLP on a noisy layer (a loss floor, so early stopping ends it) is neither
    noisy = synthetic_pairs(n_seq=40, d=16, n_layers=1, noise=0.3)
    fed = ProbeConfig(mlp_width=64, max_steps=6000, select_steps=20)
    ev = evaluate_pairs(noisy, layers=[1], cross_layer=(), controls=(), probe_config=fed)
    mlp = ev.per_layer.set_index(["probe", "objective"]).loc[("mlp", "cos")]
    assert bool(mlp["converged"]) and not bool(mlp["fit_failure"]), mlp
