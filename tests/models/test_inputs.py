"""Input kinds: token ids, BatchEncoding, datasets.Dataset columns, and refused ambiguous lists."""

from __future__ import annotations

import pytest
import torch

from identifiable.errors import IdentifiableError

TEXT = "The cat sat on the mat."


def test_token_ids_and_batch_encoding_equal_text(tiny_model, bert_tokenizer):
    m = tiny_model("bert")
    ref = m.trace(TEXT)
    ids = ref.input_ids.tolist()
    for given in (ids, torch.tensor(ids), torch.tensor([ids]), bert_tokenizer(TEXT)):
        tr = m.trace(given)
        assert tr.tokens == ref.tokens
        torch.testing.assert_close(tr.attentions, ref.attentions)
    # a padded BatchEncoding of one sequence: padding positions are dropped
    padded = bert_tokenizer(TEXT, padding="max_length", max_length=20, return_tensors="pt")
    tr = m.trace(padded)
    assert tr.tokens == ref.tokens
    torch.testing.assert_close(tr.attentions, ref.attentions, atol=1e-6, rtol=1e-5)


def test_pair_batch_encoding_keeps_segments(tiny_model, bert_tokenizer):
    m = tiny_model("bert")
    ref = m.trace(("The cat sat.", "On the mat."))
    tr = m.trace(bert_tokenizer("The cat sat.", "On the mat."))
    torch.testing.assert_close(tr.hidden_states, ref.hidden_states)


def test_batch_encoding_of_many_goes_to_trace_many(tiny_model, bert_tokenizer):
    m = tiny_model("bert")
    batch = bert_tokenizer(["a b c", "a much longer text here"], padding=True, return_tensors="pt")
    with pytest.raises(IdentifiableError, match="holds 2 sequences; trace takes one"):
        m.trace(batch)
    out = list(m.trace_many(batch))
    assert [t.tokens for t in out] == [
        m.trace("a b c").tokens,
        m.trace("a much longer text here").tokens,
    ]


@pytest.mark.parametrize(
    ("given", "match"),
    [
        (["a b", "c d"], "pass a pair as a tuple .* trace_many"),
        ([], "cannot trace a list"),
        ([1.5, 2.0], "cannot trace a list"),
        ([5, 10**9], "token ids must lie in 0..30521"),
        (torch.zeros(2, 3, dtype=torch.long), "1-D integer tensor"),
        (torch.ones(4), "1-D integer tensor"),
        ({"text": "x"}, "no 'input_ids'"),
        (3, "cannot trace a int"),
    ],
)
def test_ambiguous_or_bad_inputs(tiny_model, given, match):
    with pytest.raises(IdentifiableError, match=match):
        tiny_model("bert").trace(given)


def test_encode_refuses_a_list(tiny_model):
    with pytest.raises(IdentifiableError, match="tuple"):
        tiny_model("bert").encode(["a", "b"])


def test_trace_many_refuses_a_string_and_a_dict(tiny_model):
    m = tiny_model("bert")
    with pytest.raises(IdentifiableError, match="for one text use trace"):
        list(m.trace_many("just one text"))
    with pytest.raises(IdentifiableError, match="iterates over its keys"):
        list(m.trace_many({"text": ["a", "b"], "label": [0, 1]}))
    with pytest.raises(IdentifiableError, match=r"apply to a datasets\.Dataset"):
        list(m.trace_many(["a"], column="text"))


def test_too_long_ids_are_truncated_or_refused(tiny_model):
    from identifiable.models import TruncationWarning

    m = tiny_model("bert")  # 128 positions
    ids = list(range(1000, 1200))
    with pytest.warns(TruncationWarning, match="dropped the last 72"):
        assert m.trace(ids).n_tokens == 128
    with pytest.raises(IdentifiableError, match="at most 128"):
        m.trace(ids, truncate=False)


@pytest.fixture
def datasets():
    return pytest.importorskip("datasets", reason="the 'datasets' extra is not installed")


def test_dataset_column_and_pairs(tiny_model, datasets):
    m = tiny_model("bert")
    ds = datasets.Dataset.from_dict(
        {"text": ["first text", "second one here"], "other": ["x y", "z"], "label": [0, 1]}
    )
    got = [t.tokens for t in m.trace_many(ds, column="text")]
    assert got == [m.trace("first text").tokens, m.trace("second one here").tokens]
    pairs = [t.tokens for t in m.trace_many(ds, pair_columns=("text", "other"))]
    assert pairs[0] == m.trace(("first text", "x y")).tokens


def test_dataset_single_text_column_needs_no_name(tiny_model, datasets):
    m = tiny_model("bert")
    ds = datasets.Dataset.from_dict({"sentence": ["a b", "c"], "label": [0, 1]})
    assert [t.tokens for t in m.trace_many(ds)] == [m.trace("a b").tokens, m.trace("c").tokens]


def test_dataset_errors(tiny_model, datasets):
    m = tiny_model("bert")
    ds = datasets.Dataset.from_dict({"text": ["a"], "title": ["b"], "label": [0]})
    with pytest.raises(
        IdentifiableError,
        match=r"column 'txt' is not in the dataset; its columns are: text, title, label",
    ):
        list(m.trace_many(ds, column="txt"))
    with pytest.raises(IdentifiableError, match="say which column holds the texts"):
        list(m.trace_many(ds))
    with pytest.raises(IdentifiableError, match="not both"):
        list(m.trace_many(ds, column="text", pair_columns=("text", "title")))
