"""The Corpus object: sequence protocol, limit, shuffle, and fingerprints."""

from __future__ import annotations

from pathlib import Path

import pytest

from identifiable.corpus import Corpus, load_corpus


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "t.txt"
    path.write_text(
        "\n".join(f"Text number {i}. It has two sentences." for i in range(20)), encoding="utf-8"
    )
    return path


def test_sequence_protocol(text_file: Path) -> None:
    corpus = load_corpus(text_file)
    assert isinstance(corpus, Corpus) and len(corpus) == 20
    assert corpus[0] == "Text number 0. It has two sentences." == next(iter(corpus))
    assert corpus[-1].startswith("Text number 19.")
    assert corpus[1:3] == tuple(list(corpus)[1:3])
    assert not corpus.is_pairs
    assert "Text number" not in repr(corpus)  # repr stays short on big corpora
    with pytest.raises(AttributeError):
        corpus.unit = "pair"  # type: ignore[misc]
    assert {corpus: 1}[load_corpus(text_file)] == 1  # hashable, equal by content


def test_limit_and_shuffle(text_file: Path) -> None:
    full = load_corpus(text_file, unit="sentence")
    assert list(load_corpus(text_file, unit="sentence", limit=5)) == list(full)[:5]
    shuffled = load_corpus(text_file, unit="sentence", shuffle=True, seed=1)
    assert sorted(shuffled) == sorted(full) and list(shuffled) != list(full)
    assert shuffled.items == load_corpus(text_file, unit="sentence", shuffle=True, seed=1).items
    assert shuffled.items != load_corpus(text_file, unit="sentence", shuffle=True, seed=2).items


def test_fingerprint_is_stable_and_keyed_on_content(text_file: Path, tmp_path: Path) -> None:
    base = load_corpus(text_file)
    assert base.fingerprint == load_corpus(text_file).fingerprint
    assert len(base.fingerprint) == 16
    copy = tmp_path / "elsewhere.txt"
    copy.write_bytes(text_file.read_bytes())
    assert load_corpus(copy).fingerprint == base.fingerprint  # same content, same key
    copy.write_text(text_file.read_text() + "\nOne more line.", encoding="utf-8")
    changed = load_corpus(copy)
    assert len(changed) == 21 and changed.fingerprint != base.fingerprint  # edits are seen


def test_fingerprint_changes_with_every_shaping_option(text_file: Path, minilm_tokenizer) -> None:
    variants = {
        "base": {},
        "unit": {"unit": "sentence"},
        "limit": {"limit": 3},
        "shuffle": {"shuffle": True},
        "shuffle-seed": {"shuffle": True, "seed": 5},
        "format": {"format": "paragraphs"},
        "max_tokens": {"tokenizer": minilm_tokenizer, "max_tokens": 100},
        "min_tokens": {"tokenizer": minilm_tokenizer, "min_tokens": 2},
        "buckets": {"tokenizer": minilm_tokenizer, "buckets": [64]},
    }
    prints = {name: load_corpus(text_file, **kw).fingerprint for name, kw in variants.items()}
    assert len(set(prints.values())) == len(prints), prints
    # a seed that shapes nothing does not change the key (no needless cache misses)
    assert load_corpus(text_file, seed=9).fingerprint == prints["base"]


def test_wikipedia_fingerprints_differ_by_unit() -> None:
    prints = {load_corpus(unit=u).fingerprint for u in ("sentence", "paragraph", "document")}
    assert len(prints) == 3
