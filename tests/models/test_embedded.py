"""The embedded all-MiniLM-L6-v2, loaded offline."""

from __future__ import annotations

import pytest


@pytest.mark.integration
def test_embedded_model_self_check(minilm):
    assert (minilm.info.n_layers, minilm.info.n_heads, minilm.info.head_dim) == (6, 12, 32)
    tr = minilm.trace(("The cat sat on the mat.", "It was happy, and so was I."))
    errs = tr.verify(rtol=1e-4)
    assert errs.max() < 1e-5
    assert tr.special_tokens["cls"] == "[CLS]" and tr.special_tokens["sep"] == "[SEP]"


@pytest.mark.integration
def test_embedded_model_batched(minilm):
    texts = ["One.", "Two words here, and some more words after the comma.", "Three is a charm."]
    for text, tb in zip(texts, minilm.trace_many(texts, batch_size=3), strict=True):
        t1 = minilm.trace(text)
        assert (tb.attentions - t1.attentions).abs().max() < 1e-5
