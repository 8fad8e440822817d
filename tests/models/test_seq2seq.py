"""Encoder–decoder families (T5, mT5, BART, mBART, Marian): three verified captures per pair.

Tiny random configs (tests/helpers/families.py SEQ2SEQ_CONFIGS); the source is longer than
the head width (16) so the cross-attention has a null space over the encoder keys.
"""

from __future__ import annotations

import pytest
import torch

from helpers.families import SEQ2SEQ_FAMILIES, build_tiny_hf_model
from identifiable.attention import effective_attention, null_space
from identifiable.errors import IdentifiableError
from identifiable.models import Model
from identifiable.models.quirks import SEQUENCE_FIRST
from identifiable.models.seq2seq import Seq2SeqModel

SOURCE = "The cat sat on the mat, and the dog sat on the log by the door."
TARGET = "Le chat est assis."


@pytest.fixture(scope="module")
def models(bert_tokenizer):
    return {a: Model.from_hf(build_tiny_hf_model(a), bert_tokenizer) for a in SEQ2SEQ_FAMILIES}


@pytest.fixture(scope="module")
def traces(models):
    return {a: m.trace(SOURCE, TARGET) for a, m in models.items()}


@pytest.mark.parametrize("arch", SEQ2SEQ_FAMILIES)
def test_three_captures_verify(models, traces, arch, bert_tokenizer):
    m, tr = models[arch], traces[arch]
    assert isinstance(m, Seq2SeqModel)
    errs = tr.verify()
    assert set(errs) == {"encoder", "decoder", "cross"}
    assert all(float(e.max()) < 1e-5 for e in errs.values()), errs
    n_s = len(bert_tokenizer(SOURCE)["input_ids"])
    n_t = len(bert_tokenizer(TARGET)["input_ids"])
    assert tr.encoder.attentions.shape[-2:] == (n_s, n_s)
    assert tr.decoder.attentions.shape[-2:] == (n_t, n_t)
    assert tr.cross.attentions.shape[-2:] == (n_t, n_s)
    assert tr.cross.values.shape[-2] == n_s and tr.cross.n_keys == n_s
    assert tr.cross.key_tokens == tr.encoder.tokens and tr.cross.tokens == tr.decoder.tokens
    # decoder input = target shifted right behind the start token
    assert int(tr.decoder.input_ids[0]) == m.decoder_start_token_id
    assert tr.decoder.input_ids[1:].tolist() == bert_tokenizer(TARGET)["input_ids"][:-1]
    # masks: encoder all, decoder causal, cross all; the attention is exactly 0 outside
    assert bool(tr.encoder.key_mask.all()) and bool(tr.cross.key_mask.all())
    assert torch.equal(tr.decoder.key_mask[0], torch.ones(n_t, n_t, dtype=torch.bool).tril())
    assert torch.count_nonzero(tr.decoder.attentions.triu(1)) == 0
    assert tr.decoder.is_causal and not tr.cross.is_causal and tr.cross.is_cross


@pytest.mark.parametrize("arch", SEQ2SEQ_FAMILIES)
@pytest.mark.parametrize("part", ["encoder", "decoder", "cross"])
@pytest.mark.parametrize("variant", ["paper", "row-stochastic"])
def test_effective_attention_invariant(traces, arch, part, variant):
    """A_eff·T = A·T on every head of all three attention kinds."""
    tr = getattr(traces[arch], part)
    ea = effective_attention(tr, variant, dtype=torch.float64)
    assert ea.effective.shape == tr.attentions.shape
    t = torch.einsum("lhnv,lhvd->lhnd", tr.values.double(), tr.out_proj.double())
    lhs, rhs = ea.effective @ t, tr.attentions.double() @ t
    scale = rhs.abs().amax(dim=(-2, -1), keepdim=True)
    assert ((lhs - rhs).abs() / scale).max() < 1e-9
    ns = null_space(tr)
    assert ns.rank.shape == tr.attentions.shape[:3]
    # keys seen per row: n_s for cross (the encoder length), not the decoder length
    assert torch.equal(ns.dim, tr.key_mask.sum(-1)[:, None] - ns.rank)
    if part == "cross":
        assert int(ns.dim.min()) == tr.n_keys - tr.head_dim > 0
        # the null attention is a real, non-zero part of A (n_s > d_v)
        assert float(ea.null.abs().max()) > 1e-6


def test_cross_effective_attention_matches_brute_force(traces):
    """Cross-attention A_eff against a per-head SVD of the n_s×d matrix T (numpy-free)."""
    tr = traces["bart"].cross
    ea = effective_attention(tr, dtype=torch.float64)
    for layer in range(tr.n_layers):
        for h in range(tr.n_heads):
            t = tr.values[layer, h].double() @ tr.out_proj[layer, h].double()  # [n_s, d]
            u, s, _ = torch.linalg.svd(t, full_matrices=False)
            k = int((s > s[0] * max(t.shape) * torch.finfo(torch.float64).eps).sum())
            proj = u[:, :k] @ u[:, :k].T
            want = tr.attentions[layer, h].double() @ proj
            torch.testing.assert_close(ea.effective[layer, h], want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("arch", ["t5", "bart", "fsmt"])
def test_encoder_trace_equals_encoder_model_and_hta_runs(models, traces, arch):
    """The encoder stack alone is a Model: its trace equals the pair's, and HTA runs there."""
    from identifiable.attribution import hidden_token_attribution

    m = models[arch]
    alone = m.encoder.trace(SOURCE)
    alone.verify()
    torch.testing.assert_close(alone.attentions, traces[arch].encoder.attentions)
    torch.testing.assert_close(alone.values, traces[arch].encoder.values)
    r = hidden_token_attribution(m.encoder, "a short text", probes=4)
    n = len(m.encoder.encode("a short text"))
    assert r.contributions.shape == (m.info.n_layers, n, n)
    torch.testing.assert_close(r.contributions.sum(-1), torch.ones(m.info.n_layers, n).double())


def test_t5_has_no_biases_and_a_wrong_spec_fails_verify(models, bert_tokenizer):
    """T5: zero b_V and b_O (captured as zeros); reading W_V from the self-attention for
    the cross-attention must be caught by verify()."""
    from dataclasses import replace

    m = models["t5"]
    tr = m.trace(SOURCE, TARGET)
    assert torch.count_nonzero(tr.cross.value_bias) == 0
    assert torch.count_nonzero(tr.encoder.out_bias) == 0
    # E read from the decoder's self-attention: the wrong number of keys, refused at capture
    wrong = replace(m.spec, cross=replace(m.spec.cross, value="layer.0.SelfAttention.v"))
    bad = Seq2SeqModel(m.task_model, bert_tokenizer, spec=wrong)
    with pytest.raises(IdentifiableError, match="reads E from the wrong module"):
        bad.trace(SOURCE, TARGET)
    # the self-attention's output taken as the cross-attention's: shapes fit, verify() fails
    wrong = replace(m.spec, cross=replace(m.spec.cross, out_proj="layer.0.SelfAttention.o"))
    tr = Seq2SeqModel(m.task_model, bert_tokenizer, spec=wrong).trace(SOURCE, TARGET)
    tr.encoder.verify()
    with pytest.raises(IdentifiableError, match=r"^cross attention: trace does not reproduce"):
        tr.verify()


def test_target_inputs_and_errors(models):
    m = models["bart"]
    ids = m.encoder.encode(TARGET).input_ids
    a = m.trace(SOURCE, TARGET)
    b = m.trace(SOURCE, ids.tolist())
    assert torch.equal(a.decoder.input_ids, b.decoder.input_ids)
    same = m.trace(SOURCE)  # no target: the decoder reads the source
    assert same.decoder.input_ids[1:].tolist() == same.encoder.input_ids[:-1].tolist()
    with pytest.raises(IdentifiableError, match="target must be a text or token ids"):
        m.trace(SOURCE, {"x": 1})
    with pytest.raises(IdentifiableError, match="Seq2SeqModel"):
        Model(m.task_model)


def test_fsmt_fairseq_layout_and_source_vocabulary(models, bert_tokenizer):
    """FSMT: its config-less encoder stack reads its model's config; its maps are batch-first
    between sequence-first hidden states (a spec without that is refused in one line); source
    ids are checked against the source vocabulary, not `vocab_size` (the target's)."""
    from dataclasses import replace

    from transformers import AutoModel

    from helpers.families import tiny_config

    m = models["fsmt"]
    assert m.encoder.hf_model.config is m.hf_model.config
    wrong = replace(m.spec, encoder=replace(m.spec.encoder, axes=SEQUENCE_FIRST))  # XLNet's
    with pytest.raises(IdentifiableError, match=r"^encoder attention: layer 0's attention maps"):
        Seq2SeqModel(m.task_model, bert_tokenizer, spec=wrong).trace(SOURCE, TARGET)
    cfg = tiny_config("fsmt")
    cfg.tgt_vocab_size = 500
    torch.manual_seed(0)
    small = Model.from_hf(AutoModel.from_config(cfg, attn_implementation="eager").eval())
    tr = small.trace(list(range(600, 620)), list(range(10, 20)))  # source ids ≥ 500
    assert all(float(e.max()) < 1e-5 for e in tr.verify().values())
    with pytest.raises(IdentifiableError, match=r"token ids must lie in 0\.\.30521"):
        small.trace([30522, 11, 12])
