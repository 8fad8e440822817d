"""Small synthetic corpora, and a tiny random model saved as a user's model folder."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from helpers.families import build_tiny_hf_model

WORDS = [
    "river",
    "mountain",
    "city",
    "history",
    "science",
    "music",
    "language",
    "people",
    "water",
    "energy",
    "school",
    "market",
    "garden",
    "winter",
    "summer",
    "theory",
    "animal",
    "forest",
    "ocean",
    "village",
]
"""Words of the paragraph corpora (`word_paragraphs` draws from the first `vocabulary`)."""


def small_corpus(n: int = 36) -> list[tuple[str, str]]:
    """Sentence pairs of 6-40 tokens with [CLS]/[SEP]-style structure and punctuation."""
    rng = random.Random(0)
    words = [
        "the",
        "a",
        "cat",
        "dog",
        "river",
        "city",
        "music",
        "train",
        "people",
        "house",
        "small",
        "old",
        "new",
        "red",
        "green",
        "went",
        "saw",
        "made",
        "found",
    ]

    def sentence(k: int) -> str:
        return " ".join(rng.choice(words) for _ in range(k)).capitalize() + rng.choice(
            [".", ",", "."]
        )

    return [
        (sentence(rng.randint(3, 14)) + " " + sentence(4), sentence(rng.randint(3, 12)))
        for _ in range(n)
    ]


def word_paragraphs(
    path: Path,
    *,
    seed: int,
    paragraphs: int,
    sentences: int,
    words: tuple[int, int],
    vocabulary: int = len(WORDS),
) -> Path:
    """Write `paragraphs` paragraphs of `sentences` sentences each to `path` (blank lines
    between paragraphs); a sentence is `randint(*words)` words drawn from the first
    `vocabulary` of `WORDS`, capitalised, with a full stop. Deterministic in `seed`."""
    rng = random.Random(seed)
    pool = WORDS[:vocabulary]
    paras = [
        " ".join(
            " ".join(rng.choice(pool) for _ in range(rng.randint(*words))).capitalize() + "."
            for _ in range(sentences)
        )
        for _ in range(paragraphs)
    ]
    path.write_text("\n\n".join(paras))
    return path


def save_tiny_model(folder: Path, arch: str, tokenizer: Any) -> Path:
    """`build_tiny_hf_model(arch)` and `tokenizer` saved in `folder`, as a user's model
    folder (config, safetensors, tokenizer files)."""
    build_tiny_hf_model(arch).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
