"""Streaming extraction (bounded, whole sequences, deterministic) and the on-disk cache."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import pytest
import torch

from identifiable.errors import IdentifiableError
from identifiable.experiments.tokens import extract
from identifiable.tokens.cache import (
    CacheCorruptWarning,
    CacheMismatchError,
    cache_paths,
    corpus_fingerprint,
    load_pairs,
    save_pairs,
)
from identifiable.tokens.extract import collect_token_pairs

L, D = 3, 8


def fake_trace(seed: int, n: int, truncated: int = 0) -> SimpleNamespace:
    g = torch.Generator().manual_seed(seed)
    return SimpleNamespace(
        hidden_states=torch.randn(L + 1, n, D, generator=g),
        input_ids=torch.randint(0, 100, (n,), generator=g),
        truncated=truncated,
    )


class FakeModel:
    """Just enough of `identifiable.models.Model` for `extract`: deterministic traces per text."""

    def __init__(self, fingerprint: str = "model-a") -> None:
        self.fingerprint = fingerprint
        self.calls = 0

    def trace_many(self, texts, batch_size: int = 8):
        self.calls += 1
        for text in texts:
            yield fake_trace(sum(map(ord, text)), n=len(text.split()) + 2)


TEXTS = [f"text number {i} " + "word " * (i % 7) for i in range(30)]


def test_collect_keeps_whole_sequences_in_order_and_stops_at_the_cap():
    traces = [fake_trace(i, n) for i, n in enumerate([5, 7, 4, 6])]
    pairs = collect_token_pairs(traces, max_tokens=18)  # 5 + 7 + 4 = 16 fit, 6 more would not
    assert pairs.n_tokens == 16 and pairs.n_sequences == 3 and pairs.n_layers == L
    assert pairs.seq_ids.tolist() == [0] * 5 + [1] * 7 + [2] * 4
    assert pairs.positions[5:12].tolist() == list(range(7))
    assert torch.equal(pairs.states[5:12].transpose(0, 1), traces[1].hidden_states)
    assert torch.equal(pairs.layer(0, torch.arange(5)), traces[0].hidden_states[0])
    assert torch.equal(pairs.input_ids[12:], traces[2].input_ids)


def test_collect_streams_an_endless_corpus_in_bounded_memory():
    endless = (fake_trace(i, 10) for i in itertools.count())
    pairs = collect_token_pairs(endless, max_tokens=95, dtype=torch.float16)
    assert pairs.n_tokens == 90 and pairs.states.dtype == torch.float16
    assert pairs.states.shape == (90, L + 1, D)


def test_collect_counts_truncated_sequences():
    pairs = collect_token_pairs([fake_trace(0, 4, truncated=3), fake_trace(1, 4)], max_tokens=100)
    assert pairs.n_truncated == 1


@pytest.mark.parametrize(
    ("traces", "cap", "message"),
    [
        ([], 10, "no tokens collected"),
        ([fake_trace(0, 20)], 10, "first sequence is longer than max_tokens=10"),
        ([fake_trace(0, 3)], 0, "max_tokens must be a positive number"),
    ],
)
def test_collect_bad_input(traces, cap, message):
    with pytest.raises(IdentifiableError, match=message):
        collect_token_pairs(traces, max_tokens=cap)


def test_collect_rejects_traces_of_different_models():
    other = SimpleNamespace(
        hidden_states=torch.zeros(L + 1, 3, D + 1), input_ids=torch.zeros(3), truncated=0
    )
    with pytest.raises(IdentifiableError, match="traces disagree in shape"):
        collect_token_pairs([fake_trace(0, 3), other], max_tokens=100)


def test_cache_round_trip_and_corruption_detection(tmp_path):
    pairs = collect_token_pairs([fake_trace(i, 6) for i in range(5)], max_tokens=100)
    settings = {"model": "m", "corpus": "c", "max_tokens": 100}
    data, manifest = cache_paths(tmp_path, settings)
    save_pairs(pairs, data, manifest, settings)
    assert json.loads(manifest.read_text())["n_tokens"] == 30
    assert not list(tmp_path.glob(".*tmp"))
    loaded = load_pairs(data, manifest, settings)
    assert loaded is not None
    for name in ("states", "seq_ids", "input_ids", "positions"):
        assert torch.equal(getattr(loaded, name), getattr(pairs, name))
    # flip one byte of the data: checksum fails, warning, None (the caller rebuilds)
    raw = bytearray(data.read_bytes())
    raw[-5] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.warns(CacheCorruptWarning, match="sha256 does not match"):
        assert load_pairs(data, manifest, settings) is None
    manifest.write_text("{not json")
    with pytest.warns(CacheCorruptWarning, match="unreadable manifest"):
        assert load_pairs(data, manifest, settings) is None


def test_cache_written_with_other_settings_is_refused(tmp_path):
    pairs = collect_token_pairs([fake_trace(i, 6) for i in range(3)], max_tokens=100)
    settings = {"model": "m", "corpus": "c", "max_tokens": 100}
    data, manifest = cache_paths(tmp_path, settings)
    save_pairs(pairs, data, manifest, settings)
    other = {**settings, "model": "n"}
    assert cache_paths(tmp_path, other)[0] != data  # another model looks up another file
    with pytest.raises(CacheMismatchError, match="differs in: model"):
        load_pairs(data, manifest, other)  # a file copied or renamed by hand


def test_corpus_fingerprint():
    assert corpus_fingerprint(["a", "b"]) == corpus_fingerprint(["a", "b"])
    assert corpus_fingerprint(["a", "b"]) != corpus_fingerprint(["ab"])
    assert corpus_fingerprint([("a", "b")]) != corpus_fingerprint(["a", "b"])
    assert corpus_fingerprint(SimpleNamespace(fingerprint="abc", __iter__=None)) == "abc"
    assert corpus_fingerprint(iter(["a"])) is None  # hashing would consume it


def test_extract_uses_the_cache_and_never_reuses_another_models(tmp_path):
    model = FakeModel("model-a")
    first, info = extract(model, TEXTS, max_tokens=120, cache_dir=tmp_path)
    assert model.calls == 1 and not info["cache_hit"]
    again, info = extract(model, TEXTS, max_tokens=120, cache_dir=tmp_path)
    assert model.calls == 1 and info["cache_hit"]  # no forward pass this time
    assert torch.equal(again.states, first.states)
    other = FakeModel("model-b")
    _, info_b = extract(other, TEXTS, max_tokens=120, cache_dir=tmp_path)
    assert other.calls == 1 and not info_b["cache_hit"] and info_b["cache"] != info["cache"]
    _, info_n = extract(model, TEXTS, max_tokens=60, cache_dir=tmp_path)  # other settings
    assert not info_n["cache_hit"] and model.calls == 2


def test_extract_rebuilds_a_corrupt_cache(tmp_path):
    model = FakeModel()
    first, info = extract(model, TEXTS, max_tokens=120, cache_dir=tmp_path)
    path = tmp_path / info["cache"].rsplit("/", 1)[-1]
    path.write_bytes(path.read_bytes()[:-10])  # truncated file
    with pytest.warns(CacheCorruptWarning):
        rebuilt, info = extract(model, TEXTS, max_tokens=120, cache_dir=tmp_path)
    assert model.calls == 2 and not info["cache_hit"]
    assert torch.equal(rebuilt.states, first.states)  # deterministic
    _, info = extract(model, TEXTS, max_tokens=120, cache_dir=tmp_path)
    assert info["cache_hit"]


def test_extract_refuses_to_cache_a_one_shot_iterator(tmp_path):
    with pytest.raises(IdentifiableError, match="cannot cache a one-shot iterator"):
        extract(FakeModel(), iter(TEXTS), max_tokens=50, cache_dir=tmp_path)
    pairs, _ = extract(FakeModel(), iter(TEXTS), max_tokens=50)  # fine without a cache
    assert pairs.n_tokens <= 50
