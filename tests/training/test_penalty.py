"""The penalty: its value is effective attention's, its gradients are right and finite."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import gradcheck
from torch.func import functional_call

from helpers.training import TEXTS, batch_for
from identifiable.attention import effective_attention
from identifiable.errors import IdentifiableError
from identifiable.training import null_attention_penalty
from identifiable.training.projection import row_null_fractions


def _reference(model, texts, variant: str) -> float:
    """Mean over texts, layers, heads and rows of ‖A − A_eff‖² / ‖A‖² (the analyses)."""
    rows = []
    for t in texts:
        ea = effective_attention(model.trace(t), variant)
        a = ea.raw.double()
        rows.append(((a - ea.effective).square().sum(-1) / a.square().sum(-1)).flatten())
    return float(torch.cat(rows).mean())


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama"])
@pytest.mark.parametrize("variant", ["paper", "row-stochastic"])
def test_value_equals_effective_attention_on_a_padded_batch(tiny64, arch, variant) -> None:
    m = tiny64(arch)
    got = null_attention_penalty(m, batch_for(m, TEXTS), variant=variant)
    ref = _reference(m, TEXTS, variant)
    assert ref > 1e-4  # the texts are longer than d_v: there is null attention to measure
    assert float(got) == pytest.approx(ref, rel=1e-6, abs=1e-9)


def test_left_padding_and_layer_head_selection(tiny64) -> None:
    m = tiny64("gpt2")
    right = null_attention_penalty(m, batch_for(m, TEXTS), layers=[1], heads=[0, 2])
    batch = batch_for(m, TEXTS, left=True)
    batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp_min(0)  # as unpadded
    left = null_attention_penalty(m, batch, layers=[1], heads=[0, 2])
    assert float(left) == pytest.approx(float(right), rel=1e-9)
    every = null_attention_penalty(m, batch_for(m, TEXTS))
    assert float(every) != pytest.approx(float(right), rel=1e-3)  # the selection matters


def _directional(model, batch, k: int, seed: int = 0):
    """f(t) = penalty at inputs_embeds + Σ t_j D_j: gradcheck of the whole pipeline along k
    random directions (every layer's A and V move)."""
    emb = model.hf_model.get_input_embeddings()(batch["input_ids"]).detach()
    gen = torch.Generator().manual_seed(seed)
    dirs = torch.randn(k, *emb.shape, generator=gen, dtype=emb.dtype) * 0.1
    rest = {key: v for key, v in batch.items() if key != "input_ids"}

    def f(t):
        x = emb + (t[:, None, None, None] * dirs).sum(0)
        return null_attention_penalty(model, {"inputs_embeds": x, **rest})

    return f


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_gradcheck_through_the_model(tiny64, arch) -> None:
    m = tiny64(arch)
    f = _directional(m, batch_for(m, TEXTS[:2]), 3)
    t = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    assert gradcheck(f, (t,), eps=1e-6, atol=1e-8, rtol=1e-4)


def test_gradcheck_in_a_weight(tiny64) -> None:
    """Along directions of layer 0's value projection (V moves, A does not)."""
    m = tiny64("bert")
    batch = batch_for(m, TEXTS[:2])
    name = "encoder.layer.0.attention.self.value.weight"
    w0 = dict(m.hf_model.named_parameters())[name].detach()
    dirs = torch.randn(3, *w0.shape, generator=torch.Generator().manual_seed(1), dtype=w0.dtype)

    def f(t):
        w = w0 + 0.05 * (t[:, None, None] * dirs).sum(0)
        with torch.nn.utils.stateless._reparametrize_module(m.hf_model, {name: w}):
            return null_attention_penalty(m, batch)

    t = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    assert gradcheck(f, (t,), eps=1e-6, atol=1e-8, rtol=1e-4)
    assert functional_call is not None


def _attn(logits, lengths, causal):
    n = logits.shape[-1]
    pos = torch.arange(n)
    mask = pos[None, None, :] < lengths[:, None, None]
    if causal:
        mask = mask & (pos[None, None, :] <= pos[None, :, None])
    return torch.softmax(logits.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("stochastic", [False, True])
def test_gradcheck_of_the_projection_at_full_and_deficient_rank(causal, stochastic) -> None:
    """V = X Y of inner width 2 < m = 4 keeps its rank under any perturbation of X, Y, so
    finite differences see the constant-rank derivative the penalty uses."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([7, 5])
    logits = torch.randn(2, 7, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 7, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randn(2, 2, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 7, 4, generator=gen, dtype=torch.float64, requires_grad=True)

    def deficient(lg, x, y):
        a = _attn(lg, lengths, causal)
        return row_null_fractions(a, x @ y, lengths, causal=causal, row_stochastic=stochastic)[0]

    def full(lg, v):
        a = _attn(lg, lengths, causal)
        return row_null_fractions(a, v, lengths, causal=causal, row_stochastic=stochastic)[0]

    assert float(deficient(logits, x, y).sum()) > 0.1
    assert gradcheck(deficient, (logits, x, y), eps=1e-6, atol=1e-7, rtol=1e-4)
    assert gradcheck(full, (logits, v), eps=1e-6, atol=1e-7, rtol=1e-4)


def test_repeated_tokens_in_a_causal_model_give_finite_exact_gradients(tiny64) -> None:
    """Llama's first layer reads token embeddings without positions: repeated tokens give
    identical rows of V, so prefixes are rank-deficient. Perturbing the embedding table
    keeps them identical (constant rank), so gradcheck applies."""
    m = tiny64("llama")
    text = "water water water river river water river water water river river water " * 2
    batch = batch_for(m, [text])
    name = "embed_tokens.weight"
    w0 = dict(m.hf_model.named_parameters())[name].detach()
    ids = batch["input_ids"].unique()
    dirs = torch.zeros(2, *w0.shape, dtype=w0.dtype)
    dirs[:, ids] = torch.randn(
        2, len(ids), w0.shape[1], generator=torch.Generator().manual_seed(2), dtype=w0.dtype
    )

    def f(t):
        w = w0 + 0.05 * (t[:, None, None] * dirs).sum(0)
        with torch.nn.utils.stateless._reparametrize_module(m.hf_model, {name: w}):
            return null_attention_penalty(m, batch)

    t = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    p = f(t)
    assert float(p) == pytest.approx(_reference(m, [text], "paper"), rel=1e-6)
    (g,) = torch.autograd.grad(p, t)
    assert torch.isfinite(g).all()

    def first_layer(t):  # exactly rank-deficient there; later layers are merely ill-conditioned
        w = w0 + 0.05 * (t[:, None, None] * dirs).sum(0)
        with torch.nn.utils.stateless._reparametrize_module(m.hf_model, {name: w}):
            return null_attention_penalty(m, batch, layers=[0])

    assert float(first_layer(t)) > 1e-3
    # The rank-deficient prefixes are solved through normal equations (as the analyses
    # do), accurate to ~1e-9: central differences need a step of 1e-3 to stay above that
    # noise (at 1e-3 they agree with the analytic derivative to ~1e-5 relative).
    assert gradcheck(first_layer, (t,), eps=1e-3, atol=1e-6, rtol=1e-3)


def test_rank_deficient_value_and_output_projections_give_no_nan(bert_tokenizer) -> None:
    from helpers.families import build_tiny_hf_model
    from identifiable.models import Model

    hf = build_tiny_hf_model("bert").double()
    att = hf.encoder.layer[0].attention
    with torch.no_grad():
        w = att.self.value.weight  # [H·d_v, d]: head 0's rows get rank 3
        w[:16] = torch.randn(16, 3, dtype=w.dtype) @ torch.randn(3, w.shape[1], dtype=w.dtype)
        o = att.output.dense.weight  # [d, H·d_v]: head 1's columns of W_O get rank 5
        o[:, 16:32] = torch.randn(o.shape[0], 5, dtype=o.dtype) @ torch.randn(5, 16, dtype=o.dtype)
    m = Model.from_hf(hf, bert_tokenizer)
    batch = batch_for(m, TEXTS[:1])
    p = null_attention_penalty(m, batch, layers=[0])
    # The traces store V in float32, whose rounding (~1e-6) lifts rank 3 back to 16: the
    # reference is the explicit float64 T = V H of the same forward pass, projected by SVD.
    from identifiable.attention.reference import effective_rows_reference
    from identifiable.training.capture import capture, head_out_proj

    with torch.no_grad(), capture(m) as got:
        m.hf_model(**batch)
    out_proj = head_out_proj(m, 0).detach()
    rows = []
    for h in range(4):
        a, t = got.attentions[0][0, h], got.values[0][0, h] @ out_proj[h]
        eff = effective_rows_reference(a, t, stochastic=False, causal=False, d_v=16)
        rows.append((a - eff).square().sum(-1) / a.square().sum(-1))
    assert float(p) == pytest.approx(float(torch.cat(rows).mean()), rel=1e-8)
    p.backward()
    grads = [q.grad for q in hf.parameters() if q.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_bad_arguments_are_one_line_errors(tiny64) -> None:
    m = tiny64("bert")
    batch = batch_for(m, TEXTS)
    with pytest.raises(IdentifiableError, match="variant"):
        null_attention_penalty(m, batch, variant="nope")
    with pytest.raises(IdentifiableError, match="layers"):
        null_attention_penalty(m, batch, layers=[7])
    with pytest.raises(IdentifiableError, match="heads"):
        null_attention_penalty(m, batch, heads=[4])
    with pytest.raises(IdentifiableError, match="batch"):
        null_attention_penalty(m, 3)


def test_a_model_without_attention_maps_is_refused(bert_tokenizer, monkeypatch) -> None:
    import contextlib

    from helpers.families import build_tiny_hf_model
    from identifiable.models import Model
    from identifiable.training import capture

    hf = build_tiny_hf_model("bert", attn_implementation="sdpa")
    m = Model.from_hf(hf, bert_tokenizer)
    # the penalty switches an sdpa model to eager for its pass and back afterwards
    assert float(null_attention_penalty(m, batch_for(m, TEXTS))) > 0
    assert hf.config._attn_implementation == "sdpa"
    # without that switch sdpa returns no probabilities: one line
    monkeypatch.setattr(capture, "running", lambda *a, **k: contextlib.nullcontext())
    with pytest.raises(IdentifiableError, match="returns no attention weights"):
        null_attention_penalty(m, batch_for(m, TEXTS))


def test_texts_are_tokenised_and_hf_models_wrapped_without_changing_their_mode(tiny64) -> None:
    m = tiny64("bert")
    hf, batch = m.hf_model, batch_for(m, TEXTS)
    hf.train()
    try:
        p_hf = null_attention_penalty(hf, batch)  # dropout on: a different, finite number
        assert hf.training and torch.isfinite(p_hf)
    finally:
        hf.eval()
    assert float(null_attention_penalty(hf, batch)) == pytest.approx(
        float(null_attention_penalty(m, TEXTS)), rel=1e-9
    )
