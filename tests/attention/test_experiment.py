"""Pearson pooling, token categories and the Fig. 1 experiment tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.traces import TEXT_LONG, TEXT_SHORT
from identifiable.attention import effective_attention
from identifiable.attention.stats import (
    attention_to,
    causal_mask,
    pearson_from_sums,
    pearson_sums,
    token_categories,
)
from identifiable.errors import IdentifiableError
from identifiable.experiments.attention import attention_experiment


@settings(max_examples=30, deadline=None)
@given(parts=st.integers(1, 4), size=st.integers(2, 30), seed=st.integers(0, 999))
def test_pooled_pearson_equals_numpy(parts, size, seed):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.rand(size, generator=g) for _ in range(parts)]
    ys = [x * 0.5 + torch.rand(size, generator=g) for x in xs]
    pooled = sum(pearson_sums(x, y) for x, y in zip(xs, ys, strict=True))
    want = np.corrcoef(torch.cat(xs).numpy(), torch.cat(ys).numpy())[0, 1]
    assert pearson_from_sums(pooled) == pytest.approx(want, abs=1e-9)


def test_pearson_mask_and_degenerate_cases():
    x = torch.tensor([[1.0, 0.0], [2.0, 3.0]])
    y = torch.tensor([[2.0, 99.0], [4.0, 6.0]])
    mask = causal_mask(2)  # drops the upper-right entry
    assert pearson_from_sums(pearson_sums(x, y, mask)) == pytest.approx(1.0)
    assert np.isnan(pearson_from_sums(pearson_sums(torch.ones(3), torch.rand(3))))


def test_token_categories_bert_and_gpt2_style():
    cats = token_categories(
        ["[CLS]", "hi", ",", "there", ".", "[SEP]"], {"cls": "[CLS]", "sep": "[SEP]"}
    )
    assert list(cats) == ["CLS", "SEP", "PUNCT"]
    assert cats["PUNCT"][1].tolist() == [False, False, True, False, True, False]
    gpt2 = {"bos": "<|endoftext|>", "eos": "<|endoftext|>"}
    cats = token_categories(["<|endoftext|>", "Hi", "Ġ,", "Ġthere", "."], gpt2)
    assert list(cats) == ["BOS", "PUNCT"]  # eos shares the token: merged under BOS
    assert cats["BOS"][1].tolist() == [True, False, False, False, False]
    assert cats["PUNCT"][1].tolist() == [False, False, True, False, True]


def test_attention_to_is_mean_over_queries_of_summed_weight():
    a = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.1, 0.1, 0.8]]])
    keys = torch.tensor([True, False, True])
    assert attention_to(a, keys).tolist() == pytest.approx([(0.5 + 0.7 + 0.9) / 3])


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_experiment_tables(tiny_model, arch, tmp_path):
    model = tiny_model(arch)
    texts = [TEXT_SHORT, TEXT_LONG, ("a first part.", "and a second, longer part of the pair.")]
    res = attention_experiment(model, texts, batch_size=2)
    traces = [model.trace(t) for t in texts]
    n_l, n_h = model.info.n_layers, model.info.n_heads
    corr = res.correlation
    assert len(corr) == len(texts) * (n_l + 1)
    pooled = corr[corr["layer"].isna()].set_index("seq")
    for seq, tr in enumerate(traces):
        eff = effective_attention(tr, dtype=torch.float64).effective
        raw = tr.attentions.double()
        keep = (
            causal_mask(tr.n_tokens).expand_as(raw)
            if tr.is_causal
            else torch.ones_like(raw, dtype=torch.bool)
        )
        want = np.corrcoef(raw[keep].numpy(), eff[keep].numpy())[0, 1]
        assert pooled.loc[seq, "pearson_r"] == pytest.approx(want, abs=1e-9)
        assert pooled.loc[seq, "n_entries"] == int(keep.sum())
        assert pooled.loc[seq, "n_tokens"] == tr.n_tokens
    short = pooled.loc[0]
    if not model.info.is_causal:
        assert short["pearson_r"] == pytest.approx(1.0, abs=1e-12)  # n ≤ d_v: A_eff = A
    assert pooled.loc[1, "pearson_r"] < 0.999  # n > d_v: null attention removed
    dims = res.null_dims
    assert len(dims) == len(texts) * n_l * n_h
    long_dims = dims[dims["seq"] == 1]
    assert (long_dims["dim"] == traces[1].n_tokens - long_dims["rank"]).all()
    assert (long_dims["dim"] >= traces[1].n_tokens - model.info.head_dim).all()
    per_seq = res.token_attention_per_sequence
    assert set(per_seq["category"]) == {"CLS", "SEP", "PUNCT"}
    row = per_seq[
        (per_seq["seq"] == 1)
        & (per_seq["layer"] == 1)
        & (per_seq["head"] == 3)
        & (per_seq["category"] == "SEP")
    ]
    keys = torch.tensor([t == "[SEP]" for t in traces[1].tokens])
    eff = effective_attention(traces[1], dtype=torch.float64).effective[1, 3]
    assert float(row["raw"].iloc[0]) == pytest.approx(
        float(attention_to(traces[1].attentions[1, 3], keys))
    )
    assert float(row["effective"].iloc[0]) == pytest.approx(float(attention_to(eff, keys)))
    summary = res.token_attention()
    assert len(summary) == n_l * n_h * 3 and (summary["n_sequences"] == len(texts)).all()
    assert len(res.token_attention_layer_means()) == n_l * 3
    written = res.write(tmp_path / "out")
    assert {p.name for p in written} >= {"correlation.csv", "null_dims.csv", "settings.json"}
    assert len(pd.read_csv(tmp_path / "out" / "correlation.csv")) == len(corr)
    assert not list((tmp_path / "out").glob(".*.tmp"))
    assert (
        "causally masked entries excluded" in res.settings["pearson_entries"]
    ) == model.info.is_causal


def test_experiment_rejects_bad_input(tiny_model):
    with pytest.raises(IdentifiableError, match="empty"):
        attention_experiment(tiny_model("bert"), [])
    with pytest.raises(IdentifiableError, match="unknown variant"):
        attention_experiment(tiny_model("bert"), [TEXT_SHORT], variant="nope")  # type: ignore[arg-type]
