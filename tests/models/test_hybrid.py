"""Hybrid stacks and multi-head latent attention (issue 54): only softmax-attention layers
are traced, at their model indices; the other layers are named once; MLA's per-head values
come from the normalised latent; families that are not softmax attention are refused in
one line."""

from __future__ import annotations

import pytest
import torch

from helpers.families import _skip_if_missing_in_tf4
from helpers.family_table import tiny_config
from identifiable import effective_attention, null_space
from identifiable.attention import attention_intervals
from identifiable.errors import IdentifiableError
from identifiable.models import Model

IDS = torch.arange(10, 30)


def _hf(model_type: str, **config):
    from transformers import AutoConfig, AutoModel

    _skip_if_missing_in_tf4(model_type)
    cfg = tiny_config(model_type) if not config else AutoConfig.for_model(model_type, **config)
    torch.manual_seed(0)
    hf = AutoModel.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return hf


@pytest.fixture(scope="module")
def jamba():
    return Model.from_hf(_hf("jamba"))


def test_a_hybrid_traces_its_attention_layers_at_their_model_indices(jamba):
    tr = jamba.trace(IDS)
    assert tr.layers == [1, 3] and tr.attentions.shape[0] == 2
    assert float(tr.verify().max()) < 1e-5
    line = "layers 0, 2 are mamba (JambaMambaMixer): not softmax attention, not analysed"
    assert jamba.info.not_analysed == line and repr(jamba).endswith(line)
    one = jamba.trace(IDS, layers=[3])
    assert one.layers == [3] and torch.equal(one.attentions[0], tr.attentions[1])
    # analyses run on the traced layers; A_eff·T = A·T on every head
    eff = effective_attention(tr).effective.double()
    t = tr.values.double() @ tr.out_proj.double()
    assert torch.allclose(eff @ t, tr.attentions.double() @ t, atol=1e-6)


def test_a_layer_that_is_not_softmax_attention_is_refused_in_one_line(jamba):
    with pytest.raises(IdentifiableError) as info:
        jamba.trace(IDS, layers=[2])
    msg = str(info.value)
    assert "\n" not in msg and "layer 2 is mamba (JambaMambaMixer): not softmax attention" in msg
    assert "1, 3" in msg


def test_a_hybrid_without_softmax_attention_is_refused_in_one_line():
    config = tiny_config("jamba").to_dict() | {"attn_layer_period": 8, "attn_layer_offset": 7}
    with pytest.raises(IdentifiableError) as info:
        Model.from_hf(_hf("jamba", **{k: v for k, v in config.items() if k != "model_type"}))
    assert "\n" not in str(info.value) and "no softmax attention" in str(info.value)


def test_gated_attention_is_refused_by_name():
    """Qwen3-Next's softmax layers multiply each head's output by a query-dependent gate
    before W_O: A·(E W_V)·W_O does not reproduce them, and the refusal says so."""
    with pytest.raises(IdentifiableError) as info:
        Model.from_hf(_hf("qwen3_next"))
    msg = str(info.value)
    assert "\n" not in msg and "layer 1's self_attn is softmax attention" in msg
    assert "output gate" in msg


@pytest.mark.parametrize("model_type", ["deepseek_v3", "deepseek_v2"])
def test_latent_attention_values_are_the_latent_through_kv_b_proj(model_type, tiny_model):
    m = tiny_model(model_type)
    cfg = m.hf_model.config
    tr = m.trace("The cat sat on the mat, and it was happy.")
    assert float(tr.verify().max()) <= 1e-4
    assert tr.values.shape[-1] == cfg.v_head_dim != cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    # independent: the model's own value states, from the attention module's expansion
    layer = m.hf_model.layers[1]
    attn = layer.self_attn
    with torch.no_grad():
        x = layer.input_layernorm(tr.hidden_states[1][None])
        kv = attn.kv_a_proj_with_mqa(x)[..., : cfg.kv_lora_rank]
        v = attn.kv_b_proj(attn.kv_a_layernorm(kv)).view(1, -1, cfg.num_attention_heads, 28)
    assert torch.allclose(tr.values[1], v[0, :, :, 16:].transpose(0, 1), atol=1e-5)
    ns = null_space(tr)
    n = len(tr.tokens)
    assert ns.rank.shape == (2, cfg.num_attention_heads, n)
    assert int(ns.rank[..., -1].max()) <= cfg.v_head_dim  # T = (c W_V) W_O has rank ≤ d_v
    assert torch.equal(ns.dim[..., -1], n - ns.rank[..., -1])
    iv = attention_intervals(tr, 1, 0, 5)
    row = tr.attentions[1, 0, 5].double()
    assert bool((iv.lower <= row + 1e-6).all() and (row <= iv.upper + 1e-6).all())


@pytest.fixture(scope="module")
def gemma4():
    return Model.from_hf(_hf("gemma4_text"))


def test_normalised_values_are_the_model_s_own(gemma4):
    """Gemma 4 normalises each head's E·W_V (an RMS norm without scale) before attention
    reads it: the trace's values are the normalised ones, checked by hand, and T is
    built on them (verify, A_eff·T = A·T)."""
    assert gemma4.spec.value_norm == "self_attn.v_norm"
    tr = gemma4.trace(IDS)
    assert float(tr.verify().max()) < 1e-5
    attn = gemma4.hf_model.layers[0].self_attn
    with torch.no_grad():
        x = gemma4.hf_model.layers[0].input_layernorm(tr.hidden_states[0][None])
        v = attn.v_proj(x).view(1, len(IDS), -1, 16)[0].double()
    normed = v / (v.pow(2).mean(-1, keepdim=True) + attn.v_norm.eps).sqrt()
    heads = tr.n_heads // normed.shape[1]
    want = normed.repeat_interleave(heads, dim=1).transpose(0, 1)
    assert torch.allclose(tr.values[0].double(), want, atol=1e-5)
    assert not torch.allclose(
        tr.values[0].double(), v.repeat_interleave(heads, 1).transpose(0, 1), atol=1e-2
    )
    assert float(tr.value_bias.abs().max()) == 0.0  # b_V is inside the norm
    eff = effective_attention(tr).effective.double()
    t = tr.values.double() @ tr.out_proj.double()
    assert torch.allclose(eff @ t, tr.attentions.double() @ t, atol=1e-6)


def test_layers_of_another_head_width_are_named_and_refused_in_one_line(gemma4):
    """Gemma 4's global layers have wider heads than its sliding ones; a trace holds one
    head width, so they are named once and a request for them is refused in one line."""
    line = (
        "layer 1 is softmax attention with heads of width 512 (the traced layers': 16; a trace "
        "holds one head width): not analysed"
    )
    assert gemma4.info.not_analysed == line
    with pytest.raises(IdentifiableError) as info:
        gemma4.trace(IDS, layers=[1])
    assert "\n" not in str(info.value) and "heads of width 512" in str(info.value)


def test_the_training_penalty_refuses_normalised_values_in_one_line(gemma4):
    """The penalty captures the value projection's output, before Gemma 4's v_norm."""
    from identifiable.training import null_attention_penalty

    with pytest.raises(IdentifiableError) as info:
        null_attention_penalty(
            gemma4, {"input_ids": IDS[None], "attention_mask": torch.ones(1, len(IDS))}
        )
    assert "\n" not in str(info.value) and "normalises each head's values" in str(info.value)
