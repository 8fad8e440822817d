"""Layer streaming: `Model.iter_layers` yields one verified layer at a time, equal to `trace`."""

from __future__ import annotations

import pytest
import torch

from identifiable.attention import effective_attention
from identifiable.errors import IdentifiableError

TEXT = "The cat sat on the mat. It was happy, and so was I."


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama", "albert", "gemma2", "modernbert"])
def test_iter_layers_equals_trace(tiny_model, arch):
    m = tiny_model(arch)
    full = m.trace(TEXT)
    got = list(m.iter_layers(TEXT))
    assert [i for i, _ in got] == list(range(m.info.n_layers))
    for i, tr in got:
        assert tr.n_layers == 1
        assert tr.verify().max() < 1e-5
        torch.testing.assert_close(tr.attentions[0], full.attentions[i], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(tr.values[0], full.values[i], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(
            tr.hidden_states, full.hidden_states[i : i + 2], atol=1e-5, rtol=1e-5
        )
        assert torch.equal(tr.key_mask[0], full.key_mask[i])
        torch.testing.assert_close(
            effective_attention(tr).effective[0], effective_attention(full).effective[i]
        )


def test_iter_layers_stops_early_and_reports_errors(tiny_model):
    import threading

    m = tiny_model("gpt2")
    before = threading.active_count()
    first = next(iter(m.iter_layers(TEXT)))[0]
    assert first == 0 and threading.active_count() == before  # the worker ended
    with pytest.raises(IdentifiableError, match="a list of 2 texts is ambiguous"):
        next(m.iter_layers(["a", "b"]))
    # an attention module that returns no weights: a one-line error, not a wrong trace
    gpt2 = tiny_model("gpt2")
    strip = gpt2.layers[1].attn.register_forward_hook(lambda m, a, o: (o[0], None))
    try:
        with pytest.raises(IdentifiableError, match="returns no attention weights per layer"):
            list(gpt2.iter_layers(TEXT))
    finally:
        strip.remove()


def test_iter_layers_asks_attention_modules_for_weights(tiny_model):
    """DeBERTa's attention returns weights only when called with output_attentions=True
    (as do all attention modules of transformers 4.x): iter_layers asks each one."""
    deberta = tiny_model("deberta-v2")
    full = deberta.trace(TEXT)
    got = list(deberta.iter_layers(TEXT))
    assert [i for i, _ in got] == list(range(deberta.info.n_layers))
    for i, tr in got:
        torch.testing.assert_close(tr.attentions[0], full.attentions[i], atol=1e-6, rtol=1e-5)
        assert tr.verify().max() < 1e-5
