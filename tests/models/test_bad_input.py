"""Bad input: one clear IdentifiableError (or warning), never a deep traceback."""

from __future__ import annotations

import warnings

import pytest

from helpers.families import needs_recompute
from identifiable.errors import IdentifiableError
from identifiable.models import Model, TruncationWarning, load_model


@pytest.mark.parametrize("text", ["", "   \n\t", ("fine", " "), ("", "fine")])
def test_empty_text(tiny_model, text):
    with pytest.raises(IdentifiableError, match="empty"):
        tiny_model("bert").trace(text)


def test_not_a_text(tiny_model):
    with pytest.raises(IdentifiableError, match="text pair"):
        tiny_model("bert").trace(("a", "b", "c"))


def test_too_long_is_truncated_with_warning(tiny_model):
    m = tiny_model("bert")  # 128 positions
    text = "word " * 200
    with pytest.warns(TruncationWarning, match="dropped 74 "):
        tr = m.trace(text)
    assert tr.n_tokens == 128 and tr.truncated == 74
    tr.verify()


def test_too_long_errors_without_truncation(tiny_model):
    with pytest.raises(IdentifiableError, match="202 tokens but the model takes at most 128"):
        tiny_model("bert").trace("word " * 200, truncate=False)


def test_roberta_position_offset(tiny_model):
    m = tiny_model("roberta")  # 130 position embeddings, 2 reserved
    assert m.info.max_positions == 128
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TruncationWarning)
        m.trace("word " * 300).verify()


def test_unknown_architecture(bert_tokenizer):
    from helpers.families import build_tiny_hf_model

    # every registered encoder–decoder family is traced or refused by name (the family
    # table): a BART under a model type no spec names stands for one outside the table
    hf = build_tiny_hf_model("bart")
    hf.config.model_type = "my-seq2seq"
    with pytest.raises(IdentifiableError, match=r"'my-seq2seq' is not supported.*Seq2SeqSpec") as e:
        Model.from_hf(hf, bert_tokenizer)
    assert "\n" not in str(e.value)


def test_missing_path():
    with pytest.raises(IdentifiableError, match="does not exist"):
        load_model("./no/such/model")


def test_directory_without_model(tmp_path):
    with pytest.raises(IdentifiableError, match=r"could not load the model at .*config.json") as e:
        load_model(str(tmp_path))
    assert ".." not in str(e.value)  # transformers' own sentence ends in a full stop


def test_offline_hub_id(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        IdentifiableError, match=r"download it first .* or pass a local model directory"
    ):
        load_model("some-org/some-model-that-is-not-cached")


@needs_recompute
def test_sdpa_model_is_traced_under_sdpa_or_switched_to_eager(bert_tokenizer):
    """An sdpa BERT traces under sdpa (maps recomputed, proved on a probe) and rests on
    eager; an sdpa Falcon, whose attention bypasses the interface, is switched with a warning."""
    import warnings

    from helpers.families import build_tiny_hf_model

    hf = build_tiny_hf_model("bert", attn_implementation="sdpa")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = Model.from_hf(hf, bert_tokenizer)
    assert m.attention == "sdpa" and m.recompute_error < 1e-6
    assert hf.config._attn_implementation == "sdpa"  # the user's own, kept between calls
    m.trace("it still works").verify()
    falcon = build_tiny_hf_model("falcon", attn_implementation="sdpa")
    with pytest.warns(
        UserWarning, match="cannot be recomputed under sdpa.*switched the model to eager"
    ):
        f = Model.from_hf(falcon, bert_tokenizer)
    assert f.attention == "eager"
    f.trace("it still works").verify()
