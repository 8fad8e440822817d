"""load_model: device_map reaches from_pretrained; remote code needs trust_remote_code."""

from __future__ import annotations

import json

import pytest

from helpers.families import build_tiny_hf_model
from identifiable.errors import IdentifiableError
from identifiable.models import load_model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-bert")
    build_tiny_hf_model("bert").save_pretrained(folder)
    return folder


def test_device_map_reaches_from_pretrained(saved, monkeypatch):
    import transformers

    seen = {}
    original = transformers.AutoModel.from_pretrained

    def spy(*args, **kwargs):
        seen.update(kwargs)
        kwargs.pop("device_map", None)  # no accelerator here: load normally
        return original(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", spy)
    m = load_model(str(saved), device_map="auto", tokenizer=False)
    from identifiable.models.recompute import supported

    # None: transformers' default (sdpa), whose maps are recomputed; 4.x: eager
    assert seen["device_map"] == "auto"
    assert seen["attn_implementation"] == (None if supported() else "eager")
    m.trace([101, 2000, 2001, 102]).verify()
    seen.clear()
    load_model(str(saved), tokenizer=False)
    assert "device_map" not in seen


def test_remote_code_without_trust_is_one_line(saved, tmp_path):
    folder = tmp_path / "remote"
    folder.mkdir()
    for f in saved.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = "my-custom-bert"
    cfg["auto_map"] = {"AutoConfig": "configuration_custom.CustomConfig"}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(IdentifiableError) as exc:
        load_model(str(folder))
    msg = str(exc.value)
    assert "\n" not in msg and ("trust_remote_code" in msg or "trust-remote-code" in msg)
