"""Task-head models and fine-tuned checkpoint directories trace through their base model."""

from __future__ import annotations

import pytest
import torch

from helpers.families import tiny_config
from identifiable.models import Model, load_model

TEXT = "The cat sat on the mat."
HEADS = [
    ("bert", "AutoModelForMaskedLM"),
    ("bert", "AutoModelForSequenceClassification"),
    ("distilbert", "AutoModelForTokenClassification"),
    ("roberta", "AutoModelForQuestionAnswering"),
    ("gpt2", "AutoModelForCausalLM"),
    ("llama", "AutoModelForCausalLM"),
    ("llama", "AutoModelForSequenceClassification"),
]


def _head_model(arch: str, auto: str):
    import transformers

    torch.manual_seed(0)
    hf = getattr(transformers, auto).from_config(tiny_config(arch), attn_implementation="eager")
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return hf.eval()


@pytest.mark.parametrize(("arch", "auto"), HEADS)
def test_task_head_unwraps_to_base(arch, auto, bert_tokenizer):
    hf = _head_model(arch, auto)
    m = Model.from_hf(hf, bert_tokenizer)
    assert m.task_model is hf and m.hf_model is hf.base_model and m.hf_model is not hf
    tr = m.trace(TEXT)
    assert tr.verify().max() < 1e-5
    # the base model's own forward gives the same attention as the task model's
    with torch.no_grad():
        out = hf(
            **bert_tokenizer(TEXT, return_tensors="pt", return_token_type_ids=False),
            output_attentions=True,
        )
    torch.testing.assert_close(tr.attentions[0], out.attentions[0][0])


def test_fine_tuned_checkpoint_directory(tmp_path, bert_tokenizer):
    hf = _head_model("bert", "AutoModelForSequenceClassification")
    hf.save_pretrained(tmp_path / "ckpt")
    bert_tokenizer.save_pretrained(tmp_path / "ckpt")
    m = load_model(str(tmp_path / "ckpt"))
    ref = Model.from_hf(hf, bert_tokenizer).trace(TEXT)
    tr = m.trace(TEXT)
    assert tr.tokens == ref.tokens
    torch.testing.assert_close(tr.values, ref.values)  # the fine-tuned weights, not fresh ones
    tr.verify()


def test_tokenizer_optional_when_the_directory_has_one(tmp_path, bert_tokenizer):
    from transformers import AutoModelForMaskedLM

    _head_model("bert", "AutoModelForMaskedLM").save_pretrained(tmp_path / "mlm")
    bert_tokenizer.save_pretrained(tmp_path / "mlm")
    hf = AutoModelForMaskedLM.from_pretrained(tmp_path / "mlm", attn_implementation="eager")
    m = Model.from_hf(hf)
    assert m.tokenizer is not None
    assert m.trace(TEXT).tokens[0] == "[CLS]"


def test_without_any_tokenizer_ids_still_trace(tmp_path):
    from identifiable.errors import IdentifiableError

    _head_model("gpt2", "AutoModelForCausalLM").save_pretrained(tmp_path / "lm")
    m = load_model(str(tmp_path / "lm"))  # no tokenizer files
    tr = m.trace([5, 6, 7, 8])
    assert tr.tokens == ["<5>", "<6>", "<7>", "<8>"]
    tr.verify()
    with pytest.raises(IdentifiableError, match="has no tokenizer"):
        m.trace("text needs a tokenizer")
