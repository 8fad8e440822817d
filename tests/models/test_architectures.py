"""Every supported architecture: shapes, the self-check, and the functional view."""

from __future__ import annotations

import pytest
import torch

from helpers.families import ARCHITECTURES, CAUSAL

TEXT = "The cat sat on the mat. It was happy, and so was I."


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_trace_shapes_and_self_check(tiny_model, arch):
    m = tiny_model(arch)
    tr = m.trace(TEXT)
    n, L, H, dv, d = (
        tr.n_tokens,
        m.info.n_layers,
        m.info.n_heads,
        m.info.head_dim,
        m.info.hidden_size,
    )
    assert tr.tokens[0] == "[CLS]" and len(tr.tokens) == n
    assert tr.attentions.shape == (L, H, n, n)
    assert tr.values.shape == (L, H, n, dv)
    assert tr.value_bias.shape == (L, H, dv)
    assert tr.out_proj.shape == (L, H, dv, d)
    assert tr.hidden_states.shape == (L + 1, n, d)
    torch.testing.assert_close(tr.attentions.sum(-1), torch.ones(L, H, n))
    errs = tr.verify(rtol=1e-4)
    assert errs.max() < 1e-5, errs
    assert tr.is_causal == (arch in CAUSAL)
    if tr.is_causal:
        assert torch.equal(tr.attentions.triu(1), torch.zeros_like(tr.attentions))


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_pair_format(tiny_model, arch):
    tr = tiny_model(arch).trace(("The cat sat.", "On the mat."))
    assert tr.tokens == [
        "[CLS]",
        "the",
        "cat",
        "sat",
        ".",
        "[SEP]",
        "on",
        "the",
        "mat",
        ".",
        "[SEP]",
    ]
    tr.verify()


def test_llama_grouped_query_heads_share_values(tiny_model):
    m = tiny_model("llama")
    tr = m.trace(TEXT)
    assert m.info.n_kv_heads == 2 and m.info.n_heads == 4
    assert tr.kv_head_of.tolist() == [0, 0, 1, 1]
    assert torch.equal(tr.values[:, 0], tr.values[:, 1])
    assert not torch.equal(tr.values[:, 1], tr.values[:, 2])
    # each query head keeps its own slice of W_O
    assert not torch.equal(tr.out_proj[:, 0], tr.out_proj[:, 1])


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_functional_view_matches_trace(tiny_model, arch):
    m = tiny_model(arch)
    tr = m.trace(TEXT)
    e0 = m.embed(tr.input_ids)
    torch.testing.assert_close(e0, tr.hidden_states[0])
    torch.testing.assert_close(
        m.layer_outputs(e0, tr.input_ids), tr.hidden_states, atol=1e-5, rtol=1e-5
    )
    batched = m.layer_outputs(torch.stack([e0, 2 * e0]), tr.input_ids)
    assert batched.shape == (2, *tr.hidden_states.shape)
    torch.testing.assert_close(batched[0], tr.hidden_states, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama"])
def test_layer_outputs_under_vmap_jvp(tiny_model, arch):
    from torch.func import jvp, vmap

    m = tiny_model(arch)
    enc = m.encode("a short sentence here")
    e0 = m.embed(enc.input_ids)
    f = lambda x: m.layer_outputs(x, enc.input_ids)  # noqa: E731
    tangents = torch.randn(3, *e0.shape, generator=torch.Generator().manual_seed(0))
    batched = vmap(lambda t: jvp(f, (e0,), (t,))[1])(tangents)
    one_by_one = torch.stack([jvp(f, (e0,), (t,))[1] for t in tangents])
    torch.testing.assert_close(batched, one_by_one, atol=1e-4, rtol=1e-4)


def test_wrong_spec_is_caught_by_verify(tiny_model):
    """The self-check must be able to fail: corrupt one captured piece."""
    from identifiable.errors import IdentifiableError

    tr = tiny_model("bert").trace(TEXT)
    tr.value_bias = tr.value_bias + 0.5
    with pytest.raises(IdentifiableError, match="does not reproduce"):
        tr.verify()
