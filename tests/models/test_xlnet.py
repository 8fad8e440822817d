"""XLNet: raw [d, H, d_v] projections, sequence-first layers, the content stream traced.

XLNet stays out of the family-wide tests (tests/helpers/families.py XLNET_CONFIG says why); this
file gives it the same checks: every capture verified (float32 and half precision),
A_eff·T = A·T on every head, HTA, batching, layer streaming and `models --check`.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers.families import build_tiny_hf_model
from identifiable.errors import IdentifiableError
from identifiable.models import Model, find_spec
from identifiable.models.hooks import HookSet
from identifiable.models.quirks import AT_OUT_PROJ, SEQUENCE_FIRST

TEXT = "The cat sat on the mat. It was happy, and so was I."


@pytest.fixture(scope="module")
def xlnet(tiny_model):
    return tiny_model("xlnet")


@pytest.fixture(scope="module")
def trace(xlnet):
    return xlnet.trace(TEXT)


def test_table_spec_and_shapes(xlnet, trace):
    assert xlnet.discovery is None and xlnet.spec is find_spec("xlnet")
    assert xlnet.spec.weight_layout == "heads" and xlnet.spec.axes == SEQUENCE_FIRST
    info = xlnet.info
    assert (info.n_layers, info.n_heads, info.n_kv_heads, info.head_dim) == (2, 4, 4, 16)
    assert info.intermediate_size == 128  # d_inner
    n = trace.n_tokens
    assert n > info.head_dim  # rows see more keys than the head width: null spaces exist
    assert trace.attentions.shape == (2, 4, n, n)
    assert trace.hidden_states.shape == (3, n, 64)


def test_verify_float32(xlnet, trace):
    errs = trace.verify()
    assert errs.max() < 1e-5, errs
    assert trace.tolerance == 1e-4 and trace.capture_dtype == "float32"
    # bidirectional ("bi" attention, no perm_mask): every row sees every key
    assert not trace.is_causal and bool(trace.key_mask.all())
    assert bool(trace.attentions.gt(0).all())
    torch.testing.assert_close(trace.attentions.sum(-1), torch.ones(2, 4, trace.n_tokens))


def test_capture_matches_the_models_own_outputs(xlnet, trace):
    """Hidden states and attention maps as the model returns them (batch-first there),
    and the block output by a second route: the layer norm after the residual reads
    block output + E, so its input minus E is the block output up to that sum's rounding."""
    ids = trace.input_ids[None]
    norm_in: list[torch.Tensor] = []
    e_in: list[torch.Tensor] = []
    with HookSet() as hooks, torch.no_grad():
        for layer in xlnet.layers:
            hooks.pre(layer.rel_attn, lambda m, a: e_in.append(a[0]))
            hooks.pre(layer.rel_attn.layer_norm, lambda m, a: norm_in.append(a[0]))
        out = xlnet.hf_model(
            input_ids=ids, output_hidden_states=True, output_attentions=True, use_mems=False
        )
    assert len(out.attentions) == 2 and out.attentions[0].shape == (
        1,
        4,
        trace.n_tokens,
        trace.n_tokens,
    )
    torch.testing.assert_close(torch.cat(out.hidden_states), trace.hidden_states)
    torch.testing.assert_close(torch.cat(out.attentions), trace.attentions)
    for layer in range(2):
        # sequence-first inside the layers: [n, 1, d]
        second = (norm_in[layer] - e_in[layer])[:, 0]
        scale = float(second.norm())
        assert float((second - trace.attn_outputs[layer]).norm()) / scale < 1e-5


def test_raw_parameters_are_read_per_head(xlnet, trace):
    """values[l, h] = E · v[:, h, :], out_proj[l, h] = o[:, h, :]ᵀ, no biases."""
    for layer in range(2):
        attn = xlnet.layers[layer].rel_attn
        e = trace.hidden_states[layer]  # E is the layer input (post-norm)
        for h in range(4):
            torch.testing.assert_close(trace.values[layer, h], e @ attn.v[:, h, :].detach())
            torch.testing.assert_close(trace.out_proj[layer, h], attn.o[:, h, :].detach().T)
    assert not trace.value_bias.any() and not trace.out_bias.any()


def test_a_wrong_reading_of_the_parameters_fails_verify(xlnet, bert_tokenizer, trace):
    swapped = dataclasses.replace(xlnet.spec, value="rel_attn.k")  # keys read as values
    wrong = Model.from_hf(xlnet.task_model, bert_tokenizer, spec=swapped)
    with pytest.raises(IdentifiableError, match="probably reads E or W_V/W_O"):
        wrong.trace(TEXT).verify()
    # W_O's heads in the wrong order
    rolled = type(trace)(**{**trace.__dict__, "out_proj": trace.out_proj.roll(1, dims=1)})
    with pytest.raises(IdentifiableError, match="probably reads E or W_V/W_O"):
        rolled.verify()
    # a block output read from the layer norm (output, after the residual) is not the block's
    at_norm = dataclasses.replace(
        xlnet.spec, block_output=AT_OUT_PROJ, out_proj="rel_attn.layer_norm"
    )
    with pytest.raises(IdentifiableError):
        Model.from_hf(xlnet.task_model, bert_tokenizer, spec=at_norm).trace(TEXT).verify()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_verifies(bert_tokenizer, dtype):
    m = Model.from_hf(build_tiny_hf_model("xlnet").to(dtype), bert_tokenizer)
    tr = m.trace(TEXT)
    name = str(dtype).removeprefix("torch.")
    assert tr.capture_dtype == name and tr.attentions.dtype == torch.float32
    eps = torch.finfo(dtype).eps
    assert tr.tolerance == pytest.approx(eps * 64**0.5 / 2)
    errs = tr.verify()
    assert 0 < errs.max() < eps and errs.max() < tr.tolerance / 5, errs
    with pytest.raises(IdentifiableError, match=f"computes in {name}, whose rounding"):
        tr.verify(rtol=1e-5)


@pytest.mark.parametrize("variant", ["paper", "row-stochastic"])
def test_effective_attention_invariant(trace, variant):
    from identifiable.attention import effective_attention, null_space

    ea = effective_attention(trace, variant, dtype=torch.float64)
    t = torch.einsum("lhnv,lhvd->lhnd", trace.values.double(), trace.out_proj.double())
    lhs = ea.effective @ t
    rhs = trace.attentions.double() @ t
    scale = rhs.abs().amax(dim=(-2, -1), keepdim=True)
    assert ((lhs - rhs).abs() / scale).max() < 1e-9
    assert not torch.allclose(ea.effective, trace.attentions.double())  # it did project
    ns = null_space(trace)
    assert torch.equal(ns.dim, trace.n_tokens - ns.rank)
    assert bool((ns.dim > 0).all())  # n = 18 keys > head width 16 on every head


def test_hta_runs(xlnet):
    from identifiable.attribution import hidden_token_attribution

    r = hidden_token_attribution(xlnet, "a short text", probes=4)
    n = len(xlnet.encode("a short text"))
    assert r.contributions.shape == (2, n, n)
    torch.testing.assert_close(r.contributions.sum(-1), torch.ones(2, n, dtype=torch.float64))
    assert not any("forward" in mod.__dict__ for mod in xlnet.hf_model.modules())
    tr = xlnet.trace("a short text")
    e0 = xlnet.embed(tr.input_ids)
    assert e0.shape == (n, 64)
    torch.testing.assert_close(e0, tr.hidden_states[0])
    torch.testing.assert_close(
        xlnet.layer_outputs(e0, tr.input_ids), tr.hidden_states, atol=1e-5, rtol=1e-5
    )
    # batched e0, and another e0 changes the later states (the input is really replaced)
    both = xlnet.layer_outputs(torch.stack([e0, e0.flip(0)]), tr.input_ids)
    torch.testing.assert_close(both[0], tr.hidden_states, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(both[1, 1:], tr.hidden_states[1:], atol=1e-3)


def test_hta_exact_matches_reverse_mode(xlnet):
    """Exact HTA (forward-mode, vmap) against autograd's reverse-mode Jacobian rows."""
    from identifiable.attribution import hidden_token_attribution
    from identifiable.attribution.reference import reverse_mode_sq_norms

    enc = xlnet.encode("a short text about cats")
    e0 = xlnet.embed(enc.input_ids)
    n = len(enc)
    rows = [(1, 0), (2, n // 2), (2, n - 1)]
    ref = reverse_mode_sq_norms(lambda x: xlnet.layer_outputs(x, enc.input_ids), e0, rows=rows)
    got = hidden_token_attribution(xlnet, "a short text about cats", probes=None)
    for layer, i in rows:
        torch.testing.assert_close(
            got.sq_norms[layer - 1, i], ref[layer - 1, i], rtol=1e-4, atol=1e-10
        )


def test_trace_many_with_padding_equals_trace(xlnet):
    texts = ["Short one.", TEXT, "Mid length text about attention."]
    for text, tb in zip(texts, xlnet.trace_many(texts, batch_size=3), strict=True):
        t1 = xlnet.trace(text)
        torch.testing.assert_close(tb.attentions, t1.attentions, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(tb.values, t1.values, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(tb.hidden_states, t1.hidden_states, atol=2e-5, rtol=1e-4)
        assert tb.verify().max() < 1e-5


def test_iter_layers_equals_trace(xlnet, trace):
    seen = []
    for layer, one in xlnet.iter_layers(TEXT):
        seen.append(layer)
        assert one.verify().max() < 1e-5
        torch.testing.assert_close(one.attentions[0], trace.attentions[layer])
        torch.testing.assert_close(one.hidden_states, trace.hidden_states[layer : layer + 2])
        torch.testing.assert_close(one.attn_outputs[0], trace.attn_outputs[layer])
    assert seen == [0, 1]


def test_cli_models_check(tmp_path, bert_tokenizer, capsys):
    from identifiable.cli import main

    build_tiny_hf_model("xlnet").save_pretrained(tmp_path / "xl")
    bert_tokenizer.save_pretrained(tmp_path / "xl")
    main(["models", "--check", str(tmp_path / "xl")])
    out = capsys.readouterr().out
    assert "spec: xlnet (table)" in out and "layers.N.rel_attn.v" in out
    assert "bidirectional" in out and "verified: max relative error" in out


def test_context_mixing_runs_or_refuses_in_one_line(xlnet):
    from identifiable.mixing import context_mixing, method_names

    n = len(xlnet.encode(TEXT))
    # hta has its own tests above
    for method in sorted(set(method_names()) - {"hta"}):
        try:
            res = context_mixing(xlnet, TEXT, method)
        except IdentifiableError as err:
            assert "\n" not in str(err)
            if method == "value-zeroing":
                # no value module whose output could be zeroed: XLNet forms its values
                # inside the attention's forward from the raw parameter v
                assert "not available for xlnet" in str(err)
                continue
            # the norm-based decompositions run on XLNet (its post-LN layout is in its spec)
            assert method in ("globenc", "alti") and "'xlnet'" in str(err)
            continue
        assert res.layerwise.shape == (2, n, n) and torch.isfinite(res.layerwise).all()


def test_pairs_pass_their_segments(xlnet):
    """XLNet compares token types (same or different segment) in its attention scores."""
    pair = ("The cat sat on the mat.", "It was happy.")
    enc = xlnet.encode(pair)
    assert enc.token_type_ids is not None and set(enc.token_type_ids.tolist()) == {0, 1}
    inputs = xlnet.batch_inputs([enc])
    assert torch.equal(inputs["token_type_ids"][0], enc.token_type_ids)
    tr = xlnet.trace(pair)
    assert tr.verify().max() < 1e-5
    one_segment = xlnet.trace(enc.input_ids)  # ids alone: no segments
    assert not torch.allclose(tr.attentions, one_segment.attentions, atol=1e-4)
