"""Balanced samples per token-length bucket."""

from __future__ import annotations

from pathlib import Path

import pytest

from identifiable.corpus import (
    DEFAULT_BUCKETS,
    bucket_by_length,
    load_corpus,
    load_documents,
    token_lengths,
)
from identifiable.corpus.lengths import normalize_buckets
from identifiable.errors import IdentifiableError

LENGTHS = [5, 20, 40, 70, 3, 18, 33, 128, 129, 16, 17, 64, 65, 1, 30, 50, 100, 200]


def bucket_of(length: int) -> int:
    return next(i for i, (lo, hi) in enumerate(DEFAULT_BUCKETS) if lo <= length <= hi)


def test_balanced_sorted_and_out_of_range_dropped() -> None:
    chosen = bucket_by_length(LENGTHS, per_bucket=3, seed=0)
    assert len(chosen) == 12 and len(set(chosen)) == 12
    buckets = [bucket_of(LENGTHS[i]) for i in chosen]
    assert buckets == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    for b in range(4):
        indices = chosen[3 * b : 3 * b + 3]
        assert indices == sorted(indices)  # corpus order within a bucket
    assert not {8, 17} & set(chosen)  # 129 and 200 tokens fit no bucket


def test_default_per_bucket_is_the_smallest_bucket() -> None:
    # bucket sizes: 1-16: 4, 17-32: 4, 33-64: 4, 65-128: 4
    assert len(bucket_by_length(LENGTHS)) == 16


def test_seed_determinism() -> None:
    lengths = list(range(1, 129)) * 5
    first = bucket_by_length(lengths, per_bucket=10, seed=7)
    assert first == bucket_by_length(lengths, per_bucket=10, seed=7)
    assert first != bucket_by_length(lengths, per_bucket=10, seed=8)


def test_bucket_forms() -> None:
    assert normalize_buckets([16, 32, 64, 128]) == DEFAULT_BUCKETS
    assert normalize_buckets([(1, 10), (20, 30)]) == ((1, 10), (20, 30))


@pytest.mark.parametrize(
    ("buckets", "kwargs", "fragment"),
    [
        ([(1, 16), (10, 32)], {}, "non-overlapping"),
        ([32, 16], {}, "ascending"),
        ([(5, 1)], {}, "ascending"),
        (["x"], {}, "bad length bucket"),
        ([], {}, "no length buckets"),
        ([(1, 16), (300, 400)], {}, "a length bucket is empty"),
        ([16, 32], {"per_bucket": 5}, "lower per_bucket to at most 4"),
        ([16], {"per_bucket": 0}, "per_bucket must be"),
    ],
)
def test_bad_buckets(buckets, kwargs, fragment: str) -> None:
    with pytest.raises(IdentifiableError, match=fragment):
        bucket_by_length(LENGTHS, buckets, **kwargs)


def test_load_corpus_buckets_with_real_tokens(tmp_path: Path, minilm_tokenizer) -> None:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
    lines = [" ".join(words[: 1 + i % 10] * (1 + i // 10)) for i in range(60)]
    path = tmp_path / "t.txt"
    path.write_text("\n".join(lines), encoding="utf-8")
    corpus = load_corpus(path, tokenizer=minilm_tokenizer, buckets=[8, 16, 32, 64], per_bucket=4)
    lengths = token_lengths(minilm_tokenizer, list(corpus))
    assert [bucket for bucket in (min(i // 4, 3) for i in range(16))] == [
        next(b for b, hi in enumerate([8, 16, 32, 64]) if n <= hi) for n in lengths
    ]
    again = load_corpus(path, tokenizer=minilm_tokenizer, buckets=[8, 16, 32, 64], per_bucket=4)
    assert again.items == corpus.items and again.fingerprint == corpus.fingerprint
    other = load_corpus(
        path, tokenizer=minilm_tokenizer, buckets=[8, 16, 32, 64], per_bucket=4, seed=1
    )
    assert other.items != corpus.items and other.fingerprint != corpus.fingerprint


def test_pairs_by_bucket(tmp_path: Path, minilm_tokenizer) -> None:
    # ten Wikipedia articles as a paragraphs file: the whole sample takes seconds
    text = "\n\n".join(p for d in load_documents()[:10] for p in d.paragraph_texts)
    path = tmp_path / "wiki10.txt"
    path.write_text(text, encoding="utf-8")
    buckets = [16, 32, 64, 128]
    corpus = load_corpus(
        path, unit="pair", tokenizer=minilm_tokenizer, buckets=buckets, per_bucket=20
    )
    lengths = token_lengths(minilm_tokenizer, list(corpus))
    assert [bucket_of(n) for n in lengths] == [0] * 20 + [1] * 20 + [2] * 20 + [3] * 20
    assert corpus.options["per_bucket"] == 20
