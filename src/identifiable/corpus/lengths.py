"""Token lengths and balanced sampling by length bucket.

Lengths count every token the model sees, special tokens included
(`[CLS] a [SEP] b [SEP]` for a BERT pair). The tokenizer is any Hugging Face
tokenizer (e.g. `model.tokenizer`); this module only calls it.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from typing import Any

from identifiable.errors import IdentifiableError

__all__ = [
    "DEFAULT_BUCKETS",
    "Item",
    "bucket_by_length",
    "check_tokenizer",
    "normalize_buckets",
    "token_lengths",
    "tokenizer_fingerprint",
]

Item = str | tuple[str, str]
DEFAULT_BUCKETS: tuple[tuple[int, int], ...] = ((1, 16), (17, 32), (33, 64), (65, 128))
_ENCODE = {  # lengths only: skip the masks, never truncate, no max-length warnings
    "add_special_tokens": True,
    "return_attention_mask": False,
    "return_token_type_ids": False,
    "verbose": False,
}
_CHUNK = 512  # texts per tokenizer call: bounds memory, keeps the fast tokenizer busy


def check_tokenizer(tokenizer: Any) -> None:
    """Raise IdentifiableError unless `tokenizer` looks like a Hugging Face tokenizer."""
    if not callable(tokenizer) or not hasattr(tokenizer, "num_special_tokens_to_add"):
        raise IdentifiableError(
            f"expected a Hugging Face tokenizer (e.g. model.tokenizer), got {type(tokenizer).__name__}"
        )


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A stable hash of what decides token lengths: class, vocabulary and special tokens."""
    check_tokenizer(tokenizer)
    vocab = sorted(tokenizer.get_vocab().items())
    identity = [
        type(tokenizer).__name__,
        vocab,
        sorted(map(str, tokenizer.all_special_tokens)),
        tokenizer.num_special_tokens_to_add(pair=False),
        tokenizer.num_special_tokens_to_add(pair=True),
    ]
    return hashlib.sha256(json.dumps(identity, ensure_ascii=False).encode()).hexdigest()[:16]


def token_lengths(tokenizer: Any, items: Sequence[Item]) -> list[int]:
    """Encoded length of each text or pair, special tokens included, never truncated.

    Args:
        tokenizer: a Hugging Face tokenizer.
        items: texts, or `(a, b)` pairs (all of one kind).

    Returns:
        `[len(items)]` token counts.
    """
    check_tokenizer(tokenizer)
    lengths: list[int] = []
    for start in range(0, len(items), _CHUNK):
        chunk = items[start : start + _CHUNK]
        if chunk and isinstance(chunk[0], tuple):
            first, second = [p[0] for p in chunk], [p[1] for p in chunk]
            ids = tokenizer(first, second, **_ENCODE)["input_ids"]
        else:
            ids = tokenizer(list(chunk), **_ENCODE)["input_ids"]
        lengths.extend(len(row) for row in ids)
    return lengths


def normalize_buckets(buckets: Sequence[Any]) -> tuple[tuple[int, int], ...]:
    """Accept `[(1, 16), (17, 32), …]` (inclusive bounds) or upper edges `[16, 32, …]`.

    Upper edges `[16, 32, 64]` mean `(1, 16), (17, 32), (33, 64)`.

    Raises:
        IdentifiableError: empty, reversed, overlapping or non-integer buckets.
    """
    out: list[tuple[int, int]] = []
    low = 1
    for bucket in buckets:
        if isinstance(bucket, int) and not isinstance(bucket, bool):
            out.append((low, bucket))
        elif (
            isinstance(bucket, Sequence)
            and len(bucket) == 2
            and all(isinstance(b, int) and not isinstance(b, bool) for b in bucket)
        ):
            out.append((bucket[0], bucket[1]))
        else:
            raise IdentifiableError(
                f"bad length bucket {bucket!r}; give (low, high) token counts like "
                "[(1, 16), (17, 32)] or upper edges like [16, 32, 64, 128]"
            )
        low = out[-1][1] + 1
    if not out:
        raise IdentifiableError(
            "no length buckets given; e.g. [(1, 16), (17, 32), (33, 64), (65, 128)]"
        )
    for previous, (lo, hi) in zip([(0, 0), *out[:-1]], out, strict=True):
        if lo < 1 or lo > hi or lo <= previous[1]:
            raise IdentifiableError(
                f"length buckets must be ascending, non-overlapping and ≥ 1; got {list(out)}"
            )
    return tuple(out)


def bucket_by_length(
    lengths: Sequence[int],
    buckets: Sequence[tuple[int, int]] = DEFAULT_BUCKETS,
    *,
    per_bucket: int | None = None,
    seed: int = 0,
) -> list[int]:
    """Pick a balanced random sample of item indices: `per_bucket` from each length bucket.

    Items longer or shorter than every bucket are left out.

    Args:
        lengths: `[N]` token lengths (see `token_lengths`).
        buckets: inclusive `(low, high)` bounds, ascending.
        per_bucket: items per bucket; None takes the size of the smallest bucket.
        seed: seeds the sample (same seed, same indices).

    Returns:
        Indices into `lengths`: bucket by bucket, ascending, and in corpus order
        within a bucket.

    Raises:
        IdentifiableError: a bucket is empty, or holds fewer than `per_bucket` items.
    """
    buckets = normalize_buckets(buckets)
    members: list[list[int]] = [[] for _ in buckets]
    for index, length in enumerate(lengths):
        for b, (lo, hi) in enumerate(buckets):
            if lo <= length <= hi:
                members[b].append(index)
                break
    sizes = {f"{lo}-{hi}": len(m) for (lo, hi), m in zip(buckets, members, strict=True)}
    if per_bucket is None:
        per_bucket = min(sizes.values())
        if per_bucket == 0:
            raise IdentifiableError(
                f"a length bucket is empty (items per bucket: {sizes}); choose other "
                "buckets, another unit, or a larger corpus"
            )
    if per_bucket < 1:
        raise IdentifiableError(f"per_bucket must be ≥ 1, got {per_bucket}")
    short = {k: v for k, v in sizes.items() if v < per_bucket}
    if short:
        raise IdentifiableError(
            f"too few items for {per_bucket} per length bucket (items per bucket: {sizes}); "
            f"lower per_bucket to at most {min(sizes.values())} or change the buckets"
        )
    rng = random.Random(f"buckets:{seed}")
    return [i for m in members for i in sorted(rng.sample(m, per_bucket))]
