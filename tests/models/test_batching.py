"""trace_many must give exactly what trace gives, one text at a time."""

from __future__ import annotations

import pytest
import torch

from helpers.families import ARCHITECTURES

TEXTS = [
    "Short one.",
    "A noticeably longer sentence, with commas, several words and a full stop at the end.",
    ("A pair starts here.", "And continues there."),
    "Mid length text about attention.",
    "x",
    "Another sentence that is neither short nor long.",
]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_trace_many_equals_trace(tiny_model, arch):
    m = tiny_model(arch)
    batched = list(m.trace_many(TEXTS, batch_size=4))
    assert len(batched) == len(TEXTS)
    for text, tb in zip(TEXTS, batched, strict=True):
        t1 = m.trace(text)
        assert tb.tokens == t1.tokens
        for name in ("attentions", "values", "hidden_states", "attn_outputs"):
            torch.testing.assert_close(
                getattr(tb, name), getattr(t1, name), atol=2e-5, rtol=1e-4, msg=name
            )
        tb.verify()


def test_trace_many_keeps_order_across_windows(tiny_model):
    m = tiny_model("bert")
    texts = [("word " * k).strip() for k in (9, 1, 5, 3, 7, 2, 8, 4, 6, 10, 1)]
    out = list(m.trace_many(texts, batch_size=2))
    assert [t.n_tokens for t in out] == [m.encode(t).input_ids.numel() for t in texts]


def test_trace_many_rejects_bad_batch_size(tiny_model):
    from identifiable.errors import IdentifiableError

    with pytest.raises(IdentifiableError, match="batch_size"):
        list(tiny_model("bert").trace_many(["a"], batch_size=0))
