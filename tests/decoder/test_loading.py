"""GGUF files load like any checkpoint: a file, a folder holding one, a folder plus
gguf_file=; dequantized once by transformers, cached, and recorded as dequantized."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.cli import run_main
from helpers.gguf_files import write_tiny_gguf
from identifiable.attention import sink_mass
from identifiable.errors import IdentifiableError
from identifiable.models import Trace, load_model
from identifiable.models.dequantize import MANIFEST, dequantized
from identifiable.models.fingerprint import model_fingerprint
from identifiable.models.gguf import read_header

pytest.importorskip("gguf", reason="the 'decoder' extra (gguf) is not installed")

TEXT = "the cat and the dog sat on the hat and the mat"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding one tiny Q4_1 GGUF file (2 Llama layers, byte-level BPE)."""
    folder = tmp_path_factory.mktemp("gguf") / "tiny-llama"
    folder.mkdir()
    return write_tiny_gguf(folder / "tiny.Q4_1.gguf")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache of this test's own, so that what it builds or breaks stays here."""
    monkeypatch.setenv("IDENTIFIABLE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "gguf"


def test_header(tiny: Path) -> None:
    header = read_header(tiny)
    assert header.architecture == "llama" and header.quantization == "Q4_1"
    # 2 layers × 7 matrices + the embedding are Q4_1; 2 × 2 + 1 norms are F32
    assert header.tensor_types == {"F32": 5, "Q4_1": 15}
    assert header.tokenizer_model == "gpt2" and "tokenizer.ggml.merges" in header.keys


def test_a_file_a_folder_and_gguf_file_give_transformers_weights(tiny: Path, cache: Path) -> None:
    """The weights are exactly what transformers' own GGUF loading gives, whichever way the
    file is named; the tokenizer encodes as AutoTokenizer's does."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    by_file = load_model(tiny)
    by_folder = load_model(tiny.parent)
    by_name = load_model(tiny.parent, gguf_file=tiny.name)
    assert by_file.fingerprint == by_folder.fingerprint == by_name.fingerprint
    ref = AutoModelForCausalLM.from_pretrained(str(tiny.parent), gguf_file=tiny.name)
    theirs, mine = ref.model.state_dict(), by_file.hf_model.state_dict()
    assert sorted(theirs) == sorted(mine)
    for name, value in theirs.items():
        assert torch.equal(value, mine[name]), name
    tok = AutoTokenizer.from_pretrained(str(tiny.parent), gguf_file=tiny.name)
    assert type(tok) is type(by_file.tokenizer)
    assert tok(TEXT)["input_ids"] == by_file.tokenizer(TEXT)["input_ids"]
    tr = by_file.trace(TEXT)
    assert float(tr.verify().max()) < tr.tolerance


def test_the_weights_are_recorded_as_dequantized(tiny: Path, cache: Path, tmp_path) -> None:
    m = load_model(tiny)
    assert m.info.dequantized_from == "GGUF Q4_1"
    tr = m.trace(TEXT)
    assert tr.dequantized_from == "GGUF Q4_1"
    assert Trace.load(tr.save(tmp_path / "trace.idf")).dequantized_from == "GGUF Q4_1"
    assert sink_mass(tr).dequantized_from == "GGUF Q4_1"
    record = m.hf_model.config.dequantized_from
    assert record["file"] == tiny.name and record["tensor_types"] == {"F32": 5, "Q4_1": 15}
    before = model_fingerprint(m.hf_model)
    record["quantization"] = "Q8_0"  # the same weights, said to come from another type
    assert model_fingerprint(m.hf_model) != before


def test_a_second_load_reads_the_cache(tiny: Path, cache: Path) -> None:
    first = dequantized(tiny, progress=False)
    second = dequantized(tiny, progress=False)
    assert first.built and not second.built and first.folder == second.folder
    assert first.folder.parent == cache
    names = {p.name for p in first.folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", MANIFEST} <= names
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temporaries left
    manifest = json.loads((first.folder / MANIFEST).read_text())
    assert manifest["quantization"] == "Q4_1" and manifest["tokenizer_problem"] is None


def test_another_quantization_type(tmp_path: Path, cache: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.Q8_0.gguf", quant="Q8_0")
    m = load_model(path)
    assert m.info.dequantized_from == "GGUF Q8_0"
    assert float(m.trace(TEXT).verify().max()) < 1e-5


def test_several_gguf_files_in_a_folder_are_refused(tmp_path: Path, cache: Path) -> None:
    write_tiny_gguf(tmp_path / "a.gguf")
    write_tiny_gguf(tmp_path / "b.gguf", quant="Q8_0")
    with pytest.raises(IdentifiableError, match=r"holds 2 GGUF files \(a.gguf, b.gguf\)"):
        load_model(tmp_path)
    with pytest.raises(IdentifiableError, match="is not a file in"):
        load_model(tmp_path, gguf_file="c.gguf")
    assert load_model(tmp_path, gguf_file="b.gguf").info.dequantized_from == "GGUF Q8_0"


def test_the_cli_takes_a_gguf_file(tiny: Path, cache: Path, capsys) -> None:
    rc, out, err = run_main(["attention", TEXT, "--model", str(tiny)], capsys)
    assert rc == 0, err
    assert "(weights dequantized from GGUF Q4_1)" in out
