"""Clark-style pairs: exact token limits, a spread of lengths, consecutive text, seeds."""

from __future__ import annotations

from typing import Any

import pytest

from identifiable.corpus import Document, load_corpus, load_documents, make_pairs, token_lengths
from identifiable.corpus.pairs import _split_point, iter_pairs
from identifiable.errors import IdentifiableError


@pytest.fixture(scope="module")
def documents() -> tuple[Document, ...]:
    return load_documents()[:12]


def check_pairs(
    pairs: list[tuple[str, str]], documents, tokenizer, low: int, high: int
) -> list[int]:
    """Every pair encodes to low…high tokens and is consecutive text of one document."""
    lengths = token_lengths(tokenizer, pairs)
    assert min(lengths) >= low and max(lengths) <= high
    running = [" ".join(d.sentences) for d in documents]
    for a, b in pairs:
        assert a and b and a == a.strip() and b == b.strip()
        assert any(f"{a} {b}" in text for text in running), (a, b)
    return lengths


def test_pairs_respect_the_limit_and_spread(documents, minilm_tokenizer) -> None:
    pairs = make_pairs(documents, minilm_tokenizer, max_tokens=128, min_tokens=12, seed=0)
    assert len(pairs) > 300
    lengths = check_pairs(pairs, documents, minilm_tokenizer, 12, 128)
    # lengths from well below the head width 32 to well above it, up to the limit
    for low, high in [(12, 24), (25, 32), (33, 64), (65, 96), (97, 128)]:
        share = sum(low <= n <= high for n in lengths) / len(lengths)
        assert share > 0.05, (low, high, share)
    assert max(lengths) >= 120


def test_pairs_split_at_paragraph_breaks(documents, minilm_tokenizer) -> None:
    pairs = make_pairs(documents, minilm_tokenizer, max_tokens=128)
    breaks = {
        (d.paragraphs[i][-1], d.paragraphs[i + 1][0])
        for d in documents
        for i in range(len(d.paragraphs) - 1)
    }
    clark = [(a, b) for a, b in pairs if any(a.endswith(x) and b.startswith(y) for x, y in breaks)]
    assert len(clark) > 10  # a = end of paragraph 1, b = start of paragraph 2


def test_split_point() -> None:
    assert _split_point([False, False, True, False], [5, 5, 5, 5]) == 2  # paragraph break
    assert _split_point([False, True, False], [1, 1, 30]) == 1
    assert _split_point([False] * 4, [10, 2, 2, 2]) == 1  # else nearest the token middle
    assert _split_point([False] * 3, [2, 2, 10]) == 2


@pytest.mark.parametrize(
    ("paragraphs", "expected"),
    [
        (
            (("Alpha beta gamma.", "Delta epsilon."), ("Zeta eta.", "Theta iota.")),
            ("Alpha beta gamma. Delta epsilon.", "Zeta eta. Theta iota."),
        ),
        (
            (("Alpha beta gamma delta epsilon zeta eta theta.", "Iota.", "Kappa."),),
            ("Alpha beta gamma delta epsilon zeta eta theta.", "Iota. Kappa."),
        ),
    ],
)
def test_whole_document_becomes_one_pair(minilm_tokenizer, paragraphs, expected) -> None:
    # every target length is at least the document's length, so one pair takes it all
    length = token_lengths(minilm_tokenizer, [expected])[0]
    document = Document("t", paragraphs)
    for seed in range(3):
        pairs = make_pairs(
            [document], minilm_tokenizer, min_tokens=length, max_tokens=64, seed=seed
        )
        assert pairs == [expected]


@pytest.mark.parametrize("limit", [48, 20])
def test_small_limits(documents, minilm_tokenizer, limit: int) -> None:
    pairs = make_pairs(documents[:3], minilm_tokenizer, max_tokens=limit, min_tokens=8)
    lengths = check_pairs(pairs, documents, minilm_tokenizer, 8, limit)
    assert len(pairs) > 20 and max(lengths) >= limit - 3


def test_bpe_tokenizer_pairs_fit(documents, bpe_tokenizer) -> None:
    assert bpe_tokenizer.num_special_tokens_to_add(pair=True) == 4
    pairs = make_pairs(documents[:4], bpe_tokenizer, max_tokens=64, min_tokens=10)
    lengths = check_pairs(pairs, documents, bpe_tokenizer, 10, 64)
    assert max(lengths) >= 56


class NoOffsets:
    """A tokenizer without offset mappings (like a slow tokenizer): the word-sum path."""

    is_fast = False

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.model_max_length = inner.model_max_length

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        assert "return_offsets_mapping" not in kwargs
        return self.inner(*args, **kwargs)

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return self.inner.num_special_tokens_to_add(pair=pair)


@pytest.mark.parametrize("name", ["minilm_tokenizer", "bpe_tokenizer"])
def test_tokenizer_without_offsets(documents, request, name: str) -> None:
    inner = request.getfixturevalue(name)
    pairs = make_pairs(documents[:2], NoOffsets(inner), max_tokens=64, min_tokens=10)
    assert len(pairs) > 20
    check_pairs(pairs, documents, inner, 10, 64)


def test_deterministic_under_seed(documents, minilm_tokenizer) -> None:
    def run(seed: int, n: int = 3) -> list[tuple[str, str]]:
        return make_pairs(documents[:n], minilm_tokenizer, seed=seed)

    first = run(0)
    assert first == run(0)
    assert first != run(1)
    # each document draws its own stream, so fewer documents give a prefix
    two = run(0, 2)
    assert first[: len(two)] == two and len(first) > len(two)
    assert list(iter_pairs(documents[:3], minilm_tokenizer, seed=0)) == first


def test_load_corpus_pairs_lazy_equals_full(minilm_tokenizer) -> None:
    lazy = load_corpus(unit="pair", tokenizer=minilm_tokenizer, limit=50)
    assert lazy.is_pairs and len(lazy) == 50
    assert all(isinstance(p, tuple) and len(p) == 2 for p in lazy)
    again = load_corpus(unit="pair", tokenizer=minilm_tokenizer, limit=50)
    assert lazy.fingerprint == again.fingerprint and lazy.items == again.items
    shorter = load_corpus(unit="pair", tokenizer=minilm_tokenizer, limit=50, max_tokens=64)
    assert max(token_lengths(minilm_tokenizer, list(shorter))) <= 64
    assert shorter.fingerprint != lazy.fingerprint


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"max_tokens": 10, "min_tokens": 20}, "min_tokens ≤ max_tokens"),
        ({"max_tokens": 128, "min_tokens": 4}, "min_tokens ≤ max_tokens"),
        ({"max_tokens": 1024}, "exceeds the tokenizer's maximum length 512"),
    ],
)
def test_bad_bounds(documents, minilm_tokenizer, kwargs: dict, fragment: str) -> None:
    with pytest.raises(IdentifiableError, match=fragment):
        make_pairs(documents[:1], minilm_tokenizer, **kwargs)
