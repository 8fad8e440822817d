"""The model a user holds keeps its attention implementation: every call that needs eager
attention (a trace of a family that cannot be recomputed, Hidden Token Attribution,
training's penalty, discovery) switches for the call and restores afterwards, and the
classifier answers exactly as before. A model built from a config has a name."""

from __future__ import annotations

import pytest
import torch

import identifiable as idf
from helpers.families import build_tiny_hf_model
from identifiable.models import backends, recompute

TEXT = "the quick brown fox jumps over the lazy dog"


def _classifier(arch: str = "bert", **options):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    cfg = AutoConfig.for_model(
        arch, vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128, pad_token_id=0, num_labels=3,
    )  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_config(cfg, **options).eval()


def _settings(hf) -> list[str]:
    return [str(c._attn_implementation) for c, _ in backends._settings(hf)]


@pytest.mark.parametrize("attention", ["auto", "eager"])
def test_the_users_classifier_keeps_its_attention_and_answers_the_same(
    bert_tokenizer, attention
) -> None:
    clf = _classifier()
    assert clf.config._attn_implementation == "sdpa"
    every = _settings(clf)
    ids = bert_tokenizer(TEXT, return_tensors="pt")
    with torch.no_grad():
        logits = clf(**ids).logits.clone()
    model = idf.load_model(clf, tokenizer=bert_tokenizer, attention=attention)
    recomputed = attention == "auto" and recompute.supported()
    assert model.attention == ("sdpa" if recomputed else "eager")
    assert clf.config._attn_implementation == "sdpa"  # after wrapping
    trace = model.trace(TEXT)
    assert clf.config._attn_implementation == "sdpa"  # after a trace
    eff = idf.effective_attention(trace, dtype=torch.float64)
    assert clf.config._attn_implementation == "sdpa"  # after effective attention
    t = torch.einsum("lhnv,lhvd->lhnd", trace.values.double(), trace.out_proj.double())
    lhs, rhs = eff.effective @ t, trace.attentions.double() @ t
    assert ((lhs - rhs).abs() / rhs.abs().amax(dim=(-2, -1), keepdim=True)).max() < 1e-9
    if not recompute.supported():
        pytest.skip(
            "transformers 4.x builds BERT's sdpa attention modules at construction: switching "
            "the config does not make them eager, so HTA's forward-mode pass cannot run on an "
            "sdpa-loaded BERT there (as before this change); the trace part above ran"
        )
    hta = idf.hidden_token_attribution(model, TEXT, progress=False)
    assert clf.config._attn_implementation == "sdpa"  # after HTA (it runs eager inside)
    assert hta.contributions.shape[0] == 2
    assert _settings(clf) == every  # every config in the model, not just the top one
    with torch.no_grad():
        assert torch.equal(clf(**ids).logits, logits)
    assert float(trace.verify().max()) < 1e-4


def test_an_eager_call_restores_a_model_whose_class_declines_the_switch() -> None:
    # Falcon's class is outside the attention interface: ensure_eager writes the config
    falcon = build_tiny_hf_model("falcon", attn_implementation="sdpa")
    before = falcon.config._attn_implementation
    with backends.eager(falcon):
        assert falcon.config._attn_implementation == "eager"
    assert falcon.config._attn_implementation == before == "sdpa"
    with pytest.raises(RuntimeError), backends.eager(falcon):
        raise RuntimeError("a failing call")
    assert falcon.config._attn_implementation == "sdpa"  # restored on errors too


def test_the_penalty_and_a_discovered_family_leave_the_model_as_it_was(bert_tokenizer) -> None:
    llama = build_tiny_hf_model("llama", attn_implementation="sdpa")
    model = idf.Model.from_hf(llama, bert_tokenizer)
    idf.null_attention_penalty(model, [TEXT])
    assert llama.config._attn_implementation == "sdpa"
    it = model.iter_layers(TEXT)
    assert [layer for layer, _ in it] == [0, 1]
    assert llama.config._attn_implementation == "sdpa"


def test_a_model_built_from_a_config_is_named(bert_tokenizer) -> None:
    model = idf.Model.from_hf(_classifier(), bert_tokenizer)
    assert repr(model).startswith("Model('BertForSequenceClassification', family='bert'")
    assert model.trace(TEXT).model_name == "BertForSequenceClassification"
    named = idf.Model.from_hf(_classifier(), bert_tokenizer, name="my-clf")
    assert repr(named).startswith("Model('my-clf'")


@pytest.mark.parametrize("arch", ["t5", "bart"])
def test_an_encoder_decoder_model_keeps_its_attention(bert_tokenizer, arch) -> None:
    """Encoder–decoder traces run eager for their pass only (they used to switch the
    user's model for good)."""
    from transformers import AutoModelForSeq2SeqLM

    from helpers.families import tiny_config

    if arch == "t5" and not recompute.supported():
        pytest.skip("transformers 4.x's T5 has no sdpa attention to keep (it loads eager only)")
    torch.manual_seed(0)
    hf = AutoModelForSeq2SeqLM.from_config(tiny_config(arch), attn_implementation="sdpa").eval()
    before = _settings(hf)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        logits = hf(input_ids=ids, decoder_input_ids=ids).logits
    m = idf.load_model(hf, tokenizer=bert_tokenizer)
    tr = m.trace("a few words here", "and a target")
    assert float(tr.encoder.verify().max()) < 1e-4 and float(tr.decoder.verify().max()) < 1e-4
    assert float(tr.cross.attentions.sum(-1).sub(1).abs().max()) < 1e-5  # eager's probabilities
    assert _settings(hf) == before
    if recompute.supported():
        assert "eager" not in before  # the check above could fail
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids, decoder_input_ids=ids).logits, logits)


def test_a_model_in_training_mode_stays_in_it_and_traces_without_dropout(bert_tokenizer) -> None:
    """Each pass runs in eval mode (dropout off) and puts every module's flag back: the
    user's model is not switched to eval for good."""
    # eager: transformers 4.x cannot run HTA's forward-mode pass on an sdpa-built BERT (above)
    hf = _classifier(attn_implementation="eager").train()
    hf.bert.encoder.layer[0].eval()  # a mixed state is put back as it was, module by module
    flags = [m.training for m in hf.modules()]
    assert any(flags) and not all(flags)
    m = idf.load_model(hf, tokenizer=bert_tokenizer)
    first, second = m.trace(TEXT), m.trace(TEXT)
    torch.testing.assert_close(first.attentions, second.attentions, rtol=0, atol=0)  # no dropout
    assert float(first.verify().max()) < 1e-5
    idf.hidden_token_attribution(m, TEXT, probes=2, seed=0)
    idf.effective_attention(first)
    assert [mod.training for mod in hf.modules()] == flags
