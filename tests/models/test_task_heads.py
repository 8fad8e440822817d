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
    with pytest.raises(IdentifiableError, match="tokenizer=False to trace token ids only"):
        load_model(str(tmp_path / "lm"))  # no tokenizer files: refused at load
    m = load_model(str(tmp_path / "lm"), tokenizer=False)
    tr = m.trace([5, 6, 7, 8])
    assert tr.tokens == ["<5>", "<6>", "<7>", "<8>"]
    tr.verify()
    with pytest.raises(IdentifiableError, match="has no tokenizer"):
        m.trace("text needs a tokenizer")


def test_a_checkpoint_with_a_head_loads_without_transformers_report(
    tmp_path, bert_tokenizer, capfd
):
    """The classifier's weights are not the base model's: left out, without the report
    transformers prints for them ("classifier.weight | UNEXPECTED")."""
    import warnings

    _head_model("bert", "AutoModelForSequenceClassification").save_pretrained(tmp_path / "ckpt")
    bert_tokenizer.save_pretrained(tmp_path / "ckpt")
    capfd.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is missing, so nothing to warn about
        load_model(str(tmp_path / "ckpt"))
    out = capfd.readouterr()
    assert "UNEXPECTED" not in out.err + out.out and "classifier" not in out.err + out.out


def test_weights_missing_from_a_checkpoint_are_named_in_one_warning(tmp_path, bert_tokenizer):
    from safetensors.torch import load_file, save_file

    _head_model("bert", "AutoModelForMaskedLM").base_model.save_pretrained(tmp_path / "cut")
    bert_tokenizer.save_pretrained(tmp_path / "cut")
    weights = load_file(tmp_path / "cut" / "model.safetensors")
    gone = [k for k in weights if k.endswith("attention.self.value.weight")]
    assert gone
    save_file(
        {k: v for k, v in weights.items() if k not in gone},
        tmp_path / "cut" / "model.safetensors",
        metadata={"format": "pt"},
    )
    with pytest.warns(UserWarning, match=rf"': {len(gone)} weights of the base model") as seen:
        load_model(str(tmp_path / "cut"))
    assert "value.weight" in str(seen[0].message)
