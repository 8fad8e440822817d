"""Model.fingerprint sees every weight (models/fingerprint.py)."""

from __future__ import annotations

import torch

from helpers.families import build_tiny_hf_model
from identifiable.models import Model
from identifiable.models.fingerprint import model_fingerprint, tensor_digest


def _fresh(bert_tokenizer) -> Model:
    return Model.from_hf(build_tiny_hf_model("bert"), bert_tokenizer, name="tiny-bert")


def test_an_in_place_edit_of_one_weight_gives_a_new_key(bert_tokenizer) -> None:
    m = _fresh(bert_tokenizer)
    before = m.fingerprint
    assert m.fingerprint == before  # stable
    emb = m.hf_model.embeddings.position_embeddings.weight
    saved = emb.detach().clone()
    with torch.no_grad():
        emb.add_(1.0)  # the edit the old sampling fingerprint missed
    after = m.fingerprint
    assert after != before
    with torch.no_grad():
        emb.copy_(saved)
    assert m.fingerprint == before  # the same bytes give the same key again


def test_one_value_deep_inside_a_tensor_changes_the_key_even_through_data(bert_tokenizer) -> None:
    """Writes through `.data` do not bump torch's version counter; the hash still sees them."""
    m = _fresh(bert_tokenizer)
    before = m.fingerprint
    w = m.hf_model.encoder.layer[1].intermediate.dense.weight
    version = w._version
    w.data.view(-1)[-1] += 1e-3  # the last value: beyond any sampled prefix
    assert w._version == version
    assert m.fingerprint != before


def test_buffers_dtype_and_config_count(bert_tokenizer) -> None:
    m = _fresh(bert_tokenizer)
    before = model_fingerprint(m.hf_model)
    half = build_tiny_hf_model("bert").to(torch.float64)
    assert model_fingerprint(half) != before  # same values, another dtype
    other = build_tiny_hf_model("bert")
    other.config.layer_norm_eps = 1e-6
    assert model_fingerprint(other) != before
    assert model_fingerprint(build_tiny_hf_model("bert")) == before  # same seed, same key


def test_tensor_digest_reads_every_byte_in_chunks(monkeypatch) -> None:
    import identifiable.models.fingerprint as fp

    t = torch.arange(1000, dtype=torch.float32)
    whole = tensor_digest(t)
    monkeypatch.setattr(fp, "_CHUNK", 64)  # 16 values per chunk
    assert tensor_digest(t) == whole
    t2 = t.clone()
    t2[999] = -1
    assert tensor_digest(t2) != whole
    assert tensor_digest(t.to(torch.bfloat16)) != tensor_digest(t.to(torch.float16))
    assert tensor_digest(torch.zeros(0)) == tensor_digest(torch.zeros(0, 3))
