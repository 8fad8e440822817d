"""Clark-style text pairs `(a, b)`: consecutive text of one document, ≤ N tokens.

Clark et al. (2019), and Brunner et al. after them, feed BERT Wikipedia segments
of at most 128 tokens formatted `[CLS] p1 [SEP] p2 [SEP]`. The tokenizer adds the
specials later; here we choose the texts. For identifiability the length matters
(attention is identifiable only while n ≤ d_v, e.g. 32), so each pair draws a
target length T uniformly from `[min_tokens, max_tokens]` and fills it:

- if two or more whole sentences fit in T, `(a, b)` are the longest run of
  consecutive sentences that fits, split at the first paragraph break inside the
  run (Clark's p1/p2), else at the sentence break nearest the middle;
- otherwise (T is shorter than two sentences) `a` is the first sentence when it
  fits and `b` the longest word prefix of the next one that fits; if not even one
  sentence fits, the longest word prefix of it that fits is cut into two halves.

Token counts come from one batched tokenizer call per document (word prefixes
from the fast tokenizer's offsets), and every pair is then checked by encoding
it: `min_tokens ≤ len(tokenizer(a, b)) ≤ T` always holds. Sentences are used
once (pairs do not overlap).
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterator, Sequence
from typing import Any

from identifiable.corpus.document import Document
from identifiable.corpus.lengths import check_tokenizer, token_lengths
from identifiable.errors import IdentifiableError

__all__ = ["iter_pairs", "iter_pairs_with_lengths", "make_pairs"]


def _prefix_counts(tokenizer: Any, sentences: list[str]) -> list[list[int]]:
    """`counts[s][k]`: tokens (no specials) of the first k words of sentence s.

    Fast tokenizers give exact prefix counts from character offsets in one call;
    slow ones fall back to summing per-word counts (verified later anyway).
    """
    if getattr(tokenizer, "is_fast", False):
        encoded = tokenizer(
            sentences, add_special_tokens=False, return_offsets_mapping=True, verbose=False
        )
        counts = []
        for sentence, offsets in zip(sentences, encoded["offset_mapping"], strict=True):
            starts = [start for start, _ in offsets]
            ends, position = [], 0
            for word in sentence.split(" "):
                position += len(word)
                ends.append(position)
                position += 1
            counts.append([0, *(bisect.bisect_left(starts, end) for end in ends)])
        return counts
    words = [s.split() for s in sentences]
    flat = [w for ws in words for w in ws]
    ids = tokenizer(flat, add_special_tokens=False, verbose=False)["input_ids"] if flat else []
    counts, i = [], 0
    for ws in words:
        running = [0]
        for row in ids[i : i + len(ws)]:
            running.append(running[-1] + len(row))
        counts.append(running)
        i += len(ws)
    return counts


def _split_point(first_of_paragraph: list[bool], counts: list[int]) -> int:
    """Where `b` starts in a run of ≥ 2 sentences: a paragraph break, else the middle."""
    for k in range(1, len(counts)):
        if first_of_paragraph[k]:
            return k
    half, running, best, best_gap = sum(counts) / 2, 0, 1, float("inf")
    for k in range(1, len(counts)):
        running += counts[k - 1]
        if abs(running - half) < best_gap:
            best, best_gap = k, abs(running - half)
    return best


def _candidates(
    document: Document,
    counts: list[list[int]],
    specials: int,
    rng: random.Random,
    bounds: tuple[int, int],
) -> Iterator[tuple[str, str, int]]:
    """Yield `(a, b, target)` chosen from estimated counts; the caller verifies them."""
    sentences = document.sentences
    firsts, position = set(), 0
    for paragraph in document.paragraphs:
        firsts.add(position)
        position += len(paragraph)
    sizes = [c[-1] for c in counts]
    i = 0
    while i < len(sentences):
        target = rng.randint(*bounds)
        budget = target - specials
        j, total = i, 0
        while j < len(sentences) and total + sizes[j] <= budget:
            total += sizes[j]
            j += 1
        if j - i >= 2:
            k = i + _split_point([s in firsts for s in range(i, j)], sizes[i:j])
            yield " ".join(sentences[i:k]), " ".join(sentences[k:j]), target
            i = j
            continue
        if j - i == 1 and j < len(sentences):
            # whole first sentence as a, the longest word prefix of the next as b
            words = bisect.bisect_right(counts[j], budget - sizes[i]) - 1
            if words >= 1:
                yield sentences[i], " ".join(sentences[j].split()[:words]), target
                i = j + 1
                continue
        # otherwise (even sentence i alone is too long, or nothing follows it):
        # the two halves of its longest word prefix that fits
        words = bisect.bisect_right(counts[i], budget) - 1
        if words >= 2:
            tokens = sentences[i].split()
            half = (words + 1) // 2
            yield " ".join(tokens[:half]), " ".join(tokens[half:words]), target
        i += 1


def _trim(tokenizer: Any, a: str, b: str, target: int) -> tuple[str, str, int] | None:
    """Drop words from the end of the pair until it encodes to ≤ target tokens.

    Needed only where the estimated counts undershoot the pair's encoding, e.g.
    byte-level BPE splits a word that starts `b` differently once it has lost its
    leading space; returns `(a, b, length)` or None.
    """
    a_words, b_words = a.split(), b.split()
    while a_words and b_words:
        a, b = " ".join(a_words), " ".join(b_words)
        length = token_lengths(tokenizer, [(a, b)])[0]
        if length <= target:
            return a, b, length
        if len(b_words) > 1:
            b_words.pop()
        else:  # b is one word: the split moves left, so a + b stays consecutive text
            b_words = [a_words.pop()]
    return None


def _check_bounds(tokenizer: Any, min_tokens: int, max_tokens: int) -> int:
    """Validate the length bounds; return the number of special tokens of a pair."""
    check_tokenizer(tokenizer)
    specials = tokenizer.num_special_tokens_to_add(pair=True)
    if not (specials + 2 <= min_tokens <= max_tokens):
        raise IdentifiableError(
            f"pair lengths need {specials + 2} ≤ min_tokens ≤ max_tokens (two words plus "
            f"the special tokens); got min_tokens={min_tokens}, max_tokens={max_tokens}"
        )
    model_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(model_max, int) and max_tokens > model_max:
        raise IdentifiableError(
            f"max_tokens={max_tokens} exceeds the tokenizer's maximum length {model_max}; "
            f"use max_tokens ≤ {model_max}"
        )
    return specials


def _generate(
    documents: Sequence[Document], tokenizer: Any, specials: int, bounds: tuple[int, int], seed: int
) -> Iterator[tuple[str, str, int]]:
    for index, document in enumerate(documents):
        if not document.paragraphs:
            continue
        rng = random.Random(f"pairs:{seed}:{index}")
        counts = _prefix_counts(tokenizer, list(document.sentences))
        found = list(_candidates(document, counts, specials, rng, bounds))
        lengths = token_lengths(tokenizer, [(a, b) for a, b, _ in found])
        for (a, b, target), length in zip(found, lengths, strict=True):
            if length > target:
                trimmed = _trim(tokenizer, a, b, target)
                if trimmed is None:
                    continue
                a, b, length = trimmed
            if length >= bounds[0]:
                yield a, b, length


def iter_pairs_with_lengths(
    documents: Sequence[Document],
    tokenizer: Any,
    *,
    max_tokens: int = 128,
    min_tokens: int = 12,
    seed: int = 0,
) -> Iterator[tuple[str, str, int]]:
    """Lazily build Clark-style pairs, document by document (see the module docstring).

    Args:
        documents: the source documents, in order.
        tokenizer: a Hugging Face tokenizer; lengths are its pair encodings.
        max_tokens: N, the largest encoded pair length (specials included).
        min_tokens: the smallest encoded pair length kept.
        seed: seeds the target lengths; document k draws from its own stream, so
            its pairs do not depend on the documents before it.

    Returns:
        An iterator of `(a, b, n)` in document order, n = the encoded length
        (`min_tokens ≤ n ≤ max_tokens`), measured, not estimated.

    Raises:
        IdentifiableError: at once (not when iterated) for bad bounds, or N
            beyond the tokenizer's maximum length.
    """
    specials = _check_bounds(tokenizer, min_tokens, max_tokens)
    return _generate(documents, tokenizer, specials, (min_tokens, max_tokens), seed)


def iter_pairs(
    documents: Sequence[Document],
    tokenizer: Any,
    *,
    max_tokens: int = 128,
    min_tokens: int = 12,
    seed: int = 0,
) -> Iterator[tuple[str, str]]:
    """`iter_pairs_with_lengths` without the lengths: `(a, b)` pairs."""
    found = iter_pairs_with_lengths(
        documents, tokenizer, max_tokens=max_tokens, min_tokens=min_tokens, seed=seed
    )
    return ((a, b) for a, b, _ in found)


def make_pairs(
    documents: Sequence[Document],
    tokenizer: Any,
    *,
    max_tokens: int = 128,
    min_tokens: int = 12,
    seed: int = 0,
) -> list[tuple[str, str]]:
    """All pairs of `iter_pairs` as a list."""
    return list(
        iter_pairs(documents, tokenizer, max_tokens=max_tokens, min_tokens=min_tokens, seed=seed)
    )
