"""`load_corpus` and `Corpus`: the single entry point of `identifiable.corpus`."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, overload

from identifiable.corpus.document import Document
from identifiable.corpus.lengths import (
    Item,
    bucket_by_length,
    check_tokenizer,
    normalize_buckets,
    token_lengths,
    tokenizer_fingerprint,
)
from identifiable.corpus.pairs import iter_pairs_with_lengths
from identifiable.corpus.sources import (
    WIKIPEDIA_SAMPLE,
    SourceData,
    SourceOptions,
    is_dataset,
    read_source,
)
from identifiable.errors import IdentifiableError
from identifiable.utils.checks import count, expect
from identifiable.utils.progress import status, watching
from identifiable.utils.seeds import SEED_MAX

__all__ = ["CORPUS_VERSION", "UNITS", "Corpus", "load_corpus", "load_documents", "resolve_corpus"]

# Bump when cleaning, splitting or pairing changes, so caches keyed on fingerprints expire.
CORPUS_VERSION = 1
UNITS = ("sentence", "paragraph", "document", "pair")
_PAIR_CACHE: dict[tuple[Any, ...], tuple[tuple[str, str, int], ...]] = {}
_PAIR_CACHE_SIZE = 8


@dataclass(frozen=True)
class Corpus(Sequence[Item]):
    """An immutable, ordered collection of texts (or `(a, b)` text pairs).

    Attributes:
        name: the source ("wikipedia-sample", a file name, "hf:NAME").
        unit: "sentence", "paragraph", "document" or "pair".
        items: the texts, or pairs when `unit == "pair"`.
        fingerprint: 16 hex digits; equal exactly when content and every option
            that shapes the items are equal (safe as a cache key).
        options: what the fingerprint hashes (source content hash, unit, …).
    """

    name: str
    unit: str
    items: tuple[Item, ...] = field(repr=False)
    fingerprint: str
    options: Mapping[str, Any] = field(repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("name", "unit", "fingerprint"):
            expect(getattr(self, name), str, name, "a string")
        expect(self.items, tuple, "items", "a tuple of texts or (text, text) pairs")

    @property
    def is_pairs(self) -> bool:
        return self.unit == "pair"

    def __hash__(self) -> int:  # the options dict is unhashable; the fingerprint says it all
        return hash(self.fingerprint)

    def __iter__(self) -> Iterator[Item]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    @overload
    def __getitem__(self, index: int) -> Item: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Item, ...]: ...
    def __getitem__(self, index: int | slice) -> Item | tuple[Item, ...]:
        return self.items[index]


def load_documents(source: str | Path = WIKIPEDIA_SAMPLE, **options: Any) -> tuple[Document, ...]:
    """The Documents of a source (see `load_corpus` for `source` and read options)."""
    read = SourceOptions(fmt=options.pop("format", "auto"), **options)
    return read_source(source, read).documents


def _check_options(
    unit: str | None,
    tokenizer: Any,
    counted: dict[str, Any],
    per_bucket: int | None,
    pair_fields: Sequence[str] | None,
) -> None:
    """Reject option combinations that cannot work, before reading anything."""
    if unit is not None and unit not in UNITS:
        raise IdentifiableError(f"unknown unit {unit!r}; use one of {', '.join(UNITS)}")
    for name in ("limit", "max_tokens", "min_tokens", "per_bucket"):
        value = counted.get(name) if name != "per_bucket" else per_bucket
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1
        ):
            raise IdentifiableError(f"{name} must be a positive integer, got {value!r}")
    needs = [n for n in ("max_tokens", "min_tokens", "buckets") if counted.get(n) is not None]
    if unit == "pair" and pair_fields is None:
        needs.append("unit='pair'")
    if needs and tokenizer is None:
        raise IdentifiableError(f"{', '.join(needs)} count tokens: pass tokenizer=model.tokenizer")
    if per_bucket is not None and counted.get("buckets") is None:
        raise IdentifiableError("per_bucket needs buckets, e.g. buckets=[16, 32, 64, 128]")
    if tokenizer is not None:
        check_tokenizer(tokenizer)


def _tokenizing(progress: bool | None, name: str) -> AbstractContextManager[Any]:
    """A spinner with elapsed time on stderr while texts are tokenised (10–15 s for the
    default corpus); `progress=None` shows it only when a person is watching (a terminal
    or Jupyter), False never."""
    shown = bool(progress or (progress is None and watching()))
    return status(f"tokenising corpus {name!r} …", enabled=shown)


def _cached_pairs(
    data: SourceData, tokenizer: Any, bounds: tuple[int, int], seed: int
) -> tuple[tuple[str, str, int], ...]:
    """All `(a, b, length)` of a source, memoised on (content, tokenizer, bounds, seed)."""
    key = (data.identity, tokenizer_fingerprint(tokenizer), bounds, seed)
    if key not in _PAIR_CACHE:
        if len(_PAIR_CACHE) >= _PAIR_CACHE_SIZE:
            _PAIR_CACHE.pop(next(iter(_PAIR_CACHE)))  # oldest first
        min_t, max_t = bounds
        found = iter_pairs_with_lengths(
            data.documents, tokenizer, max_tokens=max_t, min_tokens=min_t, seed=seed
        )
        _PAIR_CACHE[key] = tuple(found)
    return _PAIR_CACHE[key]


def _units(documents: Sequence[Document], unit: str) -> list[Item]:
    if unit == "sentence":
        return [s for d in documents for s in d.sentences]
    if unit == "paragraph":
        return [p for d in documents for p in d.paragraph_texts]
    return [d.text for d in documents if d.paragraphs]


def _select_by_length(
    items: list[Item],
    tokenizer: Any,
    token_range: tuple[int | None, int | None],
    buckets: Sequence[Any] | None,
    per_bucket: int | None,
    seed: int,
    spec: dict[str, Any],
    lengths: list[int] | None = None,
) -> list[Item]:
    """Keep items within the token range, then a balanced sample per length bucket.

    `lengths` (one per item) are measured here unless the caller already has them.
    """
    if lengths is None:
        lengths = token_lengths(tokenizer, items)
    low, high = token_range
    keep = [i for i, n in enumerate(lengths) if (low or 1) <= n <= (high or n)]
    items, lengths = [items[i] for i in keep], [lengths[i] for i in keep]
    spec["token_range"] = list(token_range)
    if buckets is not None:
        bounds = normalize_buckets(buckets)
        chosen = bucket_by_length(lengths, bounds, per_bucket=per_bucket, seed=seed)
        items = [items[i] for i in chosen]
        spec |= {"buckets": bounds, "per_bucket": len(chosen) // len(bounds)}
    return items


def _corpus(name: str, unit: str, items: list[Item], spec: dict[str, Any]) -> Corpus:
    """The Corpus of `items`, fingerprinted by its `spec`; one line if nothing is left."""
    if not items:
        raise IdentifiableError(
            f"corpus {name!r} yielded no {unit}s with these options; relax "
            "max_tokens/min_tokens/buckets or use another unit or source"
        )
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    return Corpus(name, unit, tuple(items), digest, spec)


def _built_pairs(
    data: SourceData,
    tokenizer: Any,
    bounds: tuple[int, int],
    seed: int,
    limit: int | None,
    progress: bool | None,
) -> tuple[list[Item], list[int]]:
    """Pairs of consecutive text within `bounds` tokens, and their lengths: all of them
    (cached per source), or only the first `limit` (built lazily, no more than that)."""
    if limit is None:
        with _tokenizing(progress, data.name):
            found = _cached_pairs(data, tokenizer, bounds, seed)
    else:
        lazy = iter_pairs_with_lengths(
            data.documents, tokenizer, min_tokens=bounds[0], max_tokens=bounds[1], seed=seed
        )
        with _tokenizing(progress, data.name):
            found = tuple(islice(lazy, limit))
    return [(a, b) for a, b, _ in found], [n for _, _, n in found]


def _cut(
    data: Any,
    unit: str | None,
    tokenizer: Any,
    tokens: tuple[int | None, int | None],
    seed: int,
    first: int | None,
    spec: dict[str, Any],
    progress: bool | None = None,
) -> tuple[str, list[Item], list[int] | None]:
    """(unit, items, lengths) of `data`: the pairs it holds, pairs built from its documents
    with (min, max) `tokens` (default 12, 128; the first `first`, None for all; their
    lengths are known, so nothing is tokenised twice; `spec` records the bounds), or the
    documents cut into `unit`s (lengths None)."""
    if data.pairs is not None:
        if unit not in (None, "pair"):
            raise IdentifiableError(
                f"pair_fields yields pairs; use unit='pair' (got {unit!r}) or field=…"
            )
        return "pair", list(data.pairs), None
    if unit == "pair":
        bounds = (tokens[0] or 12, tokens[1] or 128)
        spec["pair_tokens"] = list(bounds)
        items, lengths = _built_pairs(data, tokenizer, bounds, seed, first, progress)
        return "pair", items, lengths
    unit = unit or ("sentence" if data.kind == "wiki" else "document")
    return unit, _units(data.documents, unit), None


def load_corpus(
    source: Any = WIKIPEDIA_SAMPLE,
    *,
    unit: str | None = None,
    limit: int | None = None,
    seed: int = 0,
    shuffle: bool = False,
    tokenizer: Any = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    buckets: Sequence[Any] | None = None,
    per_bucket: int | None = None,
    format: str = "auto",
    field: str = "text",
    pair_fields: Sequence[str] | None = None,
    split: str = "train",
    config: str | None = None,
    max_bytes: int | None = None,
    max_line_bytes: int | None = None,
    progress: bool | None = None,
    column: str | None = None,
) -> Corpus:
    """Load texts or text pairs; the package docstring documents every option.

    `source` is a corpus name, a file, "hf:NAME", a `datasets.Dataset` you hold (its
    `column`, default "text"; `column` is another name for `field`) or a list of texts.

    Steps, in order: read the source → cut into `unit`s (or build pairs) →
    keep items of `min_tokens … max_tokens` tokens → balanced sample per length
    bucket → shuffle → first `limit`. `progress`: a spinner on stderr while texts are
    tokenised (None: only in a terminal or Jupyter; False: never).

    Raises:
        IdentifiableError: bad options, unknown source, unreadable or corrupt
            file, or nothing left to yield.
    """
    counted = {
        "limit": limit,
        "max_tokens": max_tokens,
        "min_tokens": min_tokens,
        "buckets": buckets,
    }
    _check_options(unit, tokenizer, counted, per_bucket, pair_fields)
    count(seed, "seed", "--seed", minimum=0, maximum=SEED_MAX)
    read = SourceOptions(
        fmt=format,
        field=column if column is not None else field,
        pair_fields=tuple(pair_fields) if pair_fields is not None else None,
        split=split,
        config=config,
        max_bytes=max_bytes,
        max_line_bytes=max_line_bytes,
    )
    data = read_source(source, read)
    if not data.documents and not data.pairs:
        raise IdentifiableError(f"corpus {data.name!r} contains no text; pass a file with some")

    spec: dict[str, Any] = {"version": CORPUS_VERSION, "source": data.identity, "kind": data.kind}
    everything = shuffle or buckets is not None or limit is None
    first = None if everything else limit
    bounds = (min_tokens, max_tokens)
    unit, items, lengths = _cut(data, unit, tokenizer, bounds, seed, first, spec, progress)
    uses_seed = shuffle or buckets is not None or lengths is not None
    if lengths is not None:  # built pairs: every pair is within bounds
        min_tokens, max_tokens = None, None
    spec["unit"] = unit
    counts_tokens = bool(max_tokens or min_tokens or buckets is not None)
    if counts_tokens or "pair_tokens" in spec:
        spec["tokenizer"] = tokenizer_fingerprint(tokenizer)
    if counts_tokens:
        with _tokenizing(progress if lengths is None else False, data.name):
            items = _select_by_length(
                items, tokenizer, (min_tokens, max_tokens), buckets, per_bucket, seed, spec, lengths
            )
    if shuffle:
        random.Random(f"shuffle:{seed}").shuffle(items)
    spec |= {"shuffle": shuffle, "limit": limit, "seed": seed if uses_seed else None}
    return _corpus(data.name, unit, items[:limit] if limit is not None else items, spec)


def resolve_corpus(
    corpus: Any, tokenizer: Any, *, max_tokens: int = 128, shuffle: bool = False, seed: int = 0
) -> Corpus | Iterable[Item]:
    """The one corpus resolver of the experiments: a corpus name or path becomes the
    paper's data, pairs of consecutive text of at most `max_tokens` tokens
    (`load_corpus(name, unit="pair", ...)`, shuffled under `seed` when `shuffle`); any
    other iterable of texts or `(text, text)` pairs is returned as given (a one-shot
    iterator stays unread).

    Raises:
        IdentifiableError: `corpus` is None or bytes.
    """
    if isinstance(corpus, str | Path):
        return load_corpus(
            str(corpus),
            unit="pair",
            tokenizer=tokenizer,
            max_tokens=max_tokens,
            shuffle=shuffle,
            seed=seed,
        )
    if is_dataset(corpus):  # rows are mappings: their text column, as documents
        return load_corpus(corpus, unit="document")
    if corpus is None or isinstance(corpus, bytes):
        raise IdentifiableError(
            "corpus must be an iterable of texts (str) or text pairs (str, str)"
        )
    return corpus
