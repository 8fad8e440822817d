"""`layers=`, `heads=` and `memory_budget=` on `trace_many` (issue 22, item 2): each
batched trace of a selection equals `trace` of that selection, bad selections are refused
before any text is read, and a batch over the budget is refused in one line that counts the
batch, before its forward pass."""

from __future__ import annotations

import pytest
import torch

from helpers.families import build_tiny_hf_model
from identifiable import IdentifiableError
from identifiable.models import Model

TEXTS = ["the cat sat on the mat", "a dog", "the dog sat on the log and the cat on the mat", "x y"]


@pytest.fixture(scope="module")
def llama(bert_tokenizer):
    return Model.from_hf(build_tiny_hf_model("llama", attn_implementation="sdpa"), bert_tokenizer)


def test_selection_of_each_batched_trace_equals_trace(llama):
    many = list(llama.trace_many(TEXTS, batch_size=3, layers=[1], heads=[3, 0]))
    assert len(many) == len(TEXTS)
    for text, tb in zip(TEXTS, many, strict=True):
        one = llama.trace(text, layers=[1], heads=[3, 0])
        assert tb.layers == [1] and tb.heads == [3, 0]
        assert tb.tokens == one.tokens
        for name in ("attentions", "values", "hidden_states", "out_proj"):
            torch.testing.assert_close(getattr(tb, name), getattr(one, name), atol=2e-5, rtol=1e-4)
        assert float(tb.verify().max()) < 1e-4


def test_bad_selection_is_refused_before_any_text_is_read(llama):
    def texts():
        raise AssertionError("read a text before checking heads=")
        yield "never"

    with pytest.raises(IdentifiableError, match="heads="):
        next(iter(llama.trace_many(texts(), heads=[99])))


def test_a_batch_over_the_budget_is_refused_naming_the_batch(llama):
    long = " ".join(["word"] * 40)
    one = llama.memory_plan(len(llama.encode(long)), llama.info.n_layers, None).total
    # one sequence fits; four of them padded to the same length do not
    it = llama.trace_many([long] * 4, batch_size=4, memory_budget=int(one * 1.5))
    with pytest.raises(IdentifiableError, match=r"4 sequences of \d+ tokens") as err:
        next(iter(it))
    assert "memory_budget=" in str(err.value)
    assert len(list(llama.trace_many([long] * 4, batch_size=1, memory_budget=int(one * 1.5)))) == 4
    with pytest.raises(IdentifiableError, match="memory_budget= takes"):
        next(iter(llama.trace_many(TEXTS, memory_budget=0)))
