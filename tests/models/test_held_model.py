"""`load_model` takes the model a user already holds, as they hold it: a task-head model and
its tokenizer, wrapped where it is; anything else is one line that names what to pass."""

from __future__ import annotations

import pytest
import torch

import identifiable as idf
from identifiable.errors import IdentifiableError

TEXT = "the quick brown fox jumps over the lazy dog while the cat sleeps by the fire"


def _classifier():
    from transformers import AutoConfig, AutoModelForSequenceClassification

    cfg = AutoConfig.for_model(
        "bert", vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=128, pad_token_id=0, num_labels=3,
    )  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_config(cfg).eval()


def test_a_held_task_head_model_with_its_tokenizer(bert_tokenizer) -> None:
    clf = _classifier()
    before = {k: v.clone() for k, v in clf.state_dict().items()}
    model = idf.load_model(clf, tokenizer=bert_tokenizer)
    trace = model.trace(TEXT)
    assert trace.n_layers == 2 and trace.tokens[0] == "[CLS]"
    assert float(trace.verify().max()) < 1e-4
    # the user's weights are untouched and the task head still answers as before
    assert all(torch.equal(before[k], v) for k, v in clf.state_dict().items())
    ids = bert_tokenizer(TEXT, return_tensors="pt")
    with torch.no_grad():
        assert clf(**ids).logits.shape == (1, 3)
    assert next(clf.parameters()).device.type == "cpu"


def test_a_held_model_refuses_load_options_it_cannot_apply(bert_tokenizer) -> None:
    with pytest.raises(IdentifiableError, match="a model you hold is used as it is"):
        idf.load_model(_classifier(), tokenizer=bert_tokenizer, dtype=torch.float16)


def test_anything_else_is_one_short_line() -> None:
    with pytest.raises(IdentifiableError) as err:
        idf.load_model(object())
    message = str(err.value)
    assert "load_model(hf_model, tokenizer=tok)" in message and "\n" not in message
    assert "object at 0x" not in message  # no repr pasted into the message
