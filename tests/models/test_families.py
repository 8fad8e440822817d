"""Families added for issue 9: every capture verified, A_eff·T = A·T on every head, HTA runs.

Each family is a tiny random config (tests/helpers/families.py FAMILY_CONFIGS) with valid
pad/bos/eos ids; windows are 4 keys wide so short texts exercise per-row key sets.
"""

from __future__ import annotations

import pytest
import torch

from helpers.families import FAMILIES
from identifiable.attention import effective_attention, null_space
from identifiable.models.hooks import HookSet, first_tensor, replace_hidden_input

TEXT = "The cat sat on the mat. It was happy, and so was I."
CAUSAL_FAMILIES = set(FAMILIES) - {"albert", "deberta-v2", "modernbert"}


@pytest.fixture(scope="module")
def traces(tiny_model):
    return {arch: tiny_model(arch).trace(TEXT) for arch in FAMILIES}


@pytest.mark.parametrize("arch", FAMILIES)
def test_verify_and_key_mask(traces, tiny_model, arch):
    m, tr = tiny_model(arch), traces[arch]
    errs = tr.verify()
    assert errs.max() < 1e-5, errs
    assert tr.tolerance == 1e-4 and tr.capture_dtype == "float32"
    assert tr.is_causal == (arch in CAUSAL_FAMILIES)
    L, n = m.info.n_layers, tr.n_tokens
    assert tr.key_mask.shape == (L, n, n)
    # The mask comes from the config; on these random models no weight underflows,
    # so the attention's support is exactly the mask (a wrong window would show here).
    assert torch.equal(tr.attentions.ne(0).any(1), tr.key_mask)
    torch.testing.assert_close(tr.attentions.sum(-1), torch.ones(L, m.info.n_heads, n))


WINDOWED = {
    # family: (layer, expected mask as a function of (i, j))
    "gpt_neo": (1, lambda i, j: (j <= i) & (i - j < 4)),
    "gemma2": (0, lambda i, j: (j <= i) & (i - j < 4)),
    "gemma3_text": (0, lambda i, j: (j <= i) & (i - j < 4)),
    "mixtral": (1, lambda i, j: (j <= i) & (i - j < 4)),
    "modernbert": (1, lambda i, j: (i - j).abs() <= 2),
}


@pytest.mark.parametrize("arch", sorted(WINDOWED))
def test_windowed_layers(traces, arch):
    layer, rule = WINDOWED[arch]
    tr = traces[arch]
    n = tr.n_tokens
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    assert torch.equal(tr.key_mask[layer], rule(i, j))
    assert not bool(tr.key_mask[layer].all()) and n > 5


@pytest.mark.parametrize("arch", FAMILIES)
@pytest.mark.parametrize("variant", ["paper", "row-stochastic"])
def test_effective_attention_invariant(traces, arch, variant):
    """A_eff·T = A·T on every head, A_eff zero wherever the row cannot see the key."""
    tr = traces[arch]
    ea = effective_attention(tr, variant, dtype=torch.float64)
    t = torch.einsum("lhnv,lhvd->lhnd", tr.values.double(), tr.out_proj.double())
    lhs = ea.effective @ t
    rhs = tr.attentions.double() @ t
    scale = rhs.abs().amax(dim=(-2, -1), keepdim=True)
    assert ((lhs - rhs).abs() / scale).max() < 1e-9
    # the default call answers in the trace's float32 and keeps the identity to its rounding
    e32 = effective_attention(tr, variant).effective
    assert e32.dtype == torch.float32
    assert (((e32.double() @ t) - rhs).abs() / scale).max() < 1e-5
    outside = ~tr.key_mask[:, None].expand_as(ea.effective)
    assert torch.count_nonzero(ea.effective[outside]) == 0
    ns = null_space(tr)
    seen = tr.key_mask.sum(-1)[:, None]
    assert torch.equal(ns.dim, seen - ns.rank)
    # rows that see more keys than the head width have a null space, the others none
    assert bool((ns.dim > 0).any()) == bool((seen > tr.head_dim).any())


@pytest.mark.parametrize("arch", FAMILIES)
def test_hta_runs(tiny_model, arch):
    from identifiable.attribution import hidden_token_attribution

    m = tiny_model(arch)
    before = getattr(m.hf_model.config, "_experts_implementation", None)
    r = hidden_token_attribution(m, "a short text", probes=4)
    n = len(m.encode("a short text"))
    assert r.contributions.shape == (m.info.n_layers, n, n)
    torch.testing.assert_close(
        r.contributions.sum(-1), torch.ones(m.info.n_layers, n, dtype=torch.float64)
    )
    # the model is left as it was: experts implementation, and no substitute forward left
    # behind (transformers 4.57's check_model_inputs itself sets instance-level forwards, the
    # modules' own bound methods; a substitute is a plain function such as BLOOM's GELU)
    assert getattr(m.hf_model.config, "_experts_implementation", None) == before
    for mod in m.hf_model.modules():
        fwd = mod.__dict__.get("forward")
        assert fwd is None or getattr(fwd, "__self__", None) is mod, (type(mod).__name__, fwd)
    # the functional view reproduces the traced hidden states
    tr = m.trace("a short text")
    torch.testing.assert_close(
        m.layer_outputs(m.embed(tr.input_ids), tr.input_ids), tr.hidden_states, atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("arch", ["bloom", "mixtral"])
def test_forward_mode_substitutes_give_the_models_own_jacobian(tiny_model, bert_tokenizer, arch):
    """BLOOM's GELU (a backward-only autograd.Function in transformers 5.x) and MoE
    grouped_mm have no forward-mode AD; HTA runs plain-torch equivalents. Checked against
    the model's own reverse-mode derivative (HF's GeLUFunction.backward, grouped_mm's
    backward), taken without any substitute."""
    import dataclasses

    from identifiable.attribution import hidden_token_attribution
    from identifiable.attribution.reference import reverse_mode_sq_norms
    from identifiable.models import Model

    m = tiny_model(arch)
    plain = Model.from_hf(
        m.task_model, bert_tokenizer, spec=dataclasses.replace(m.spec, forward_ad=())
    )
    enc = m.encode("a short text about cats")
    e0 = m.embed(enc.input_ids, enc.token_type_ids)
    n = len(enc)

    def own(x):  # the model as configured, no substitutes, no switch of experts
        with HookSet() as hooks:
            outs = []
            hooks.pre(plain.layers[0], replace_hidden_input(x[None], first_call_only=True),
                      with_kwargs=True)  # fmt: skip
            for layer in plain.layers:
                hooks.post(layer, lambda mod, a, o: outs.append(first_tensor(o)))
            ids = enc.input_ids.reshape(1, -1)
            plain.hf_model(input_ids=ids, attention_mask=torch.ones_like(ids))
        return torch.stack([x, *(o[0] for o in outs)])

    with torch.no_grad():
        torch.testing.assert_close(m.layer_outputs(e0, enc.input_ids), own(e0), atol=1e-6, rtol=0)
    rows = [(1, 0), (2, n // 2), (2, n - 1)]
    ref = reverse_mode_sq_norms(own, e0, rows=rows)
    got = hidden_token_attribution(m, "a short text about cats", probes=None)
    for layer, i in rows:
        sq = got.sq_norms[layer - 1, i]
        torch.testing.assert_close(sq, ref[layer - 1, i], rtol=1e-4, atol=1e-10)


@pytest.mark.parametrize("arch", FAMILIES)
def test_trace_many_with_padding_equals_trace(tiny_model, arch):
    m = tiny_model(arch)
    texts = ["Short one.", TEXT, "Mid length text about attention."]
    for text, tb in zip(texts, m.trace_many(texts, batch_size=3), strict=True):
        t1 = m.trace(text)
        torch.testing.assert_close(tb.attentions, t1.attentions, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(tb.values, t1.values, atol=2e-5, rtol=1e-4)
        assert torch.equal(tb.key_mask, t1.key_mask)
        tb.verify()


def test_fused_layouts_pick_the_value_heads(tiny_model):
    """GPT-NeoX/BLOOM interleave [q, k, v] per head; Falcon multi-query has one K/V head."""
    from identifiable.models.model import value_columns

    neox = tiny_model("gpt_neox")
    assert neox.spec.fused == "per_kv_group" and neox.info.n_kv_heads == 4
    assert value_columns(neox.spec, 12 * 16, 4, 16)[1][:2] == [32, 33]  # head 0: rows 32..47
    falcon = tiny_model("falcon")
    assert falcon.info.n_kv_heads == 1 and falcon.kv_head_of.tolist() == [0, 0, 0, 0]
    tr = falcon.trace("one two three")
    assert all(torch.equal(tr.values[:, 0], tr.values[:, h]) for h in range(4))
    phi3 = tiny_model("phi3")
    assert phi3.spec.fused == "qkv_blocks" and phi3.info.n_kv_heads == 2


def test_albert_shared_layer_runs_three_times(tiny_model):
    m = tiny_model("albert")
    tr = m.trace(TEXT)
    assert m.info.n_layers == 3 and len({id(x) for x in m.layers}) == 1
    assert torch.equal(tr.out_proj[0], tr.out_proj[2])  # the same weights ...
    assert not torch.allclose(tr.values[0], tr.values[1])  # ... on different inputs
