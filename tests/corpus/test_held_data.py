"""Data as the user holds it: a `datasets.Dataset` (with `column=`) or a list of texts goes
into `load_corpus` and `token_identifiability`; a missing column is one line naming the
columns there are."""

from __future__ import annotations

import pytest

import identifiable as idf
from identifiable.corpus.core import resolve_corpus
from identifiable.errors import IdentifiableError

datasets = pytest.importorskip("datasets", reason="the 'datasets' extra is not installed")

TEXTS = [
    "The river rose quickly after three days of heavy rain.",
    "Farmers moved their animals to the higher fields before night.",
    "By morning the old bridge was under water and the road was closed.",
]


def test_a_dataset_with_a_named_column() -> None:
    ds = datasets.Dataset.from_dict({"sentence": TEXTS, "label": [0, 1, 0]})
    corpus = idf.load_corpus(ds, column="sentence", unit="document")
    assert list(corpus) == TEXTS
    with pytest.raises(
        IdentifiableError, match=r"no column 'text' \(its columns: sentence, label\)"
    ):
        idf.load_corpus(ds, unit="document")


def test_a_list_of_texts_and_pairs_from_two_columns() -> None:
    assert list(idf.load_corpus(TEXTS, unit="document")) == TEXTS
    ds = datasets.Dataset.from_dict({"a": TEXTS[:2], "b": TEXTS[1:]})
    pairs = list(idf.load_corpus(ds, pair_fields=("a", "b")))
    assert pairs == [(TEXTS[0], TEXTS[1]), (TEXTS[1], TEXTS[2])]
    with pytest.raises(IdentifiableError, match="item 2 is int"):
        idf.load_corpus(["fine", 3], unit="document")


def test_experiments_read_a_dataset_by_its_text_column() -> None:
    ds = datasets.Dataset.from_dict({"text": TEXTS})
    assert list(resolve_corpus(ds, tokenizer=None)) == TEXTS  # was: rows as mappings
