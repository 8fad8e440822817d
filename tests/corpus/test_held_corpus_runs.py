"""`reproduce` and `compare` take the data a user holds: a `datasets.Dataset` (its `column=`,
or `pair_fields=`) or a list of texts, read row by row as given. A Dataset run is the run of
the same texts given as a list (same corpus fingerprint, same tables); a missing column is
one line listing the columns, before anything is written."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest

from helpers.families import build_tiny_hf_model
from identifiable.errors import IdentifiableError

datasets = pytest.importorskip("datasets", reason="datasets is the optional extra `datasets`")

WORDS = ["river", "mountain", "city", "history", "science", "music", "people", "water"]


def _pairs(n: int = 24) -> list[tuple[str, str]]:
    rng = random.Random(3)

    def sentence() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))).capitalize() + "."

    return [(sentence(), sentence()) for _ in range(n)]


@pytest.fixture(scope="module")
def tiny(bert_tokenizer):
    from identifiable.models import Model

    return Model.from_hf(build_tiny_hf_model("bert"), bert_tokenizer, name="tiny-bert")


def test_reproduce_reads_a_dataset_as_its_texts(tmp_path, tiny) -> None:
    from identifiable import reproduce
    from identifiable.runs.reproduce import given_corpus

    pairs = _pairs()
    ds = datasets.Dataset.from_dict(
        {"premise": [a for a, _ in pairs], "hypothesis": [b for _, b in pairs], "id": range(24)}
    )
    from_ds = reproduce(
        tiny, ds, tmp_path / "ds", budget="smoke", progress=False,
        pair_fields=("premise", "hypothesis"),
    )  # fmt: skip
    from_list = reproduce(tiny, pairs, tmp_path / "list", budget="smoke", progress=False)
    info = from_ds.summary["settings"]["corpus"]
    assert info["items"] == 24
    assert info["fingerprint"] == from_list.summary["settings"]["corpus"]["fingerprint"]
    tables = sorted(p.name for p in (from_ds.out_dir / "tables").glob("*.parquet"))
    assert tables == sorted(p.name for p in (from_list.out_dir / "tables").glob("*.parquet"))
    assert len(tables) >= 5
    for name in tables:  # the same texts give the same numbers
        pd.testing.assert_frame_equal(
            pd.read_parquet(from_ds.out_dir / "tables" / name),
            pd.read_parquet(from_list.out_dir / "tables" / name),
        )
    assert (from_ds.out_dir / "index.html").is_file()
    # one text column: each row is one text, as given
    texts = datasets.Dataset.from_dict({"sentence": [f"{a} {b}" for a, b in pairs] + [" "]})
    assert given_corpus(texts, "sentence", None) == [f"{a} {b}" for a, b in pairs]
    # a column that is not there: one line naming the columns, and no folder written
    with pytest.raises(IdentifiableError, match=r"no column 'text' \(its columns: sentence\)"):
        reproduce(tiny, texts, tmp_path / "none", budget="smoke", progress=False)
    assert not (tmp_path / "none").exists()


def test_compare_takes_a_dataset(tmp_path, bert_tokenizer) -> None:
    from identifiable import compare

    a = tmp_path / "two"
    build_tiny_hf_model("bert").save_pretrained(a)
    bert_tokenizer.save_pretrained(a)
    b = tmp_path / "other"
    build_tiny_hf_model("bert", seed=1).save_pretrained(b)
    bert_tokenizer.save_pretrained(b)
    ds = datasets.Dataset.from_dict({"body": [f"{x} {y}" for x, y in _pairs()]})
    with pytest.raises(IdentifiableError, match="no column 'text'"):
        compare([str(a), str(b)], ds, tmp_path / "bad", budget="smoke", progress=False)
    assert not (tmp_path / "bad").exists()
    result = compare(
        [str(a), str(b)], ds, tmp_path / "cmp", budget="smoke", progress=False, column="body"
    )
    counts = result.tables["token_counts"]
    assert counts["texts"].nunique() == 1 and int(counts["texts"].iloc[0]) > 0
    sub = sorted((tmp_path / "cmp" / "models").iterdir())
    fingerprints = {
        json.loads((s / "summary.json").read_text())["settings"]["corpus"]["fingerprint"]
        for s in sub
    }
    assert len(sub) == 2 and len(fingerprints) == 1
