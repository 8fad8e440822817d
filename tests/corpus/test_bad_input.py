"""Every bad input gives one clear IdentifiableError that says what to do."""

from __future__ import annotations

import bz2
import gzip
from pathlib import Path

import pytest

from identifiable.corpus import load_corpus, wikipedia_sample_path
from identifiable.errors import IdentifiableError


def error_of(*args, **kwargs) -> str:
    with pytest.raises(IdentifiableError) as info:
        load_corpus(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message  # the CLI prints it on one line
    return message


def test_missing_file_and_unknown_source(tmp_path: Path) -> None:
    message = error_of(tmp_path / "nope.txt")
    assert "not found" in message and "wikipedia-sample" in message
    assert "not found" in error_of("wikipedia-sampel")  # a typo of the built-in name
    assert "not a file" in error_of(tmp_path)


def test_truncated_wiki_dump(tmp_path: Path) -> None:
    data = wikipedia_sample_path().read_bytes()
    path = tmp_path / "enwiki-cut.xml.bz2"
    path.write_bytes(data[: len(data) // 2])
    assert "truncated or corrupt" in error_of(path)


def test_corrupt_compressed_text(tmp_path: Path) -> None:
    cut = tmp_path / "cut.txt.bz2"
    cut.write_bytes(bz2.compress(b"some text\n" * 1000)[:-20])
    assert "truncated or corrupt" in error_of(cut)
    garbage = tmp_path / "garbage.txt.gz"
    garbage.write_bytes(b"this is not gzip data at all")
    assert "truncated or corrupt" in error_of(garbage)


def test_broken_xml_and_foreign_xml(tmp_path: Path) -> None:
    broken = tmp_path / "dump.xml"
    broken.write_text("<mediawiki><page><title>x</title>", encoding="utf-8")
    assert "truncated or corrupt" in error_of(broken)
    other = tmp_path / "other.xml"
    other.write_text("<rss><item>hello</item></rss>", encoding="utf-8")
    assert "not a MediaWiki export" in error_of(other)


def test_invalid_jsonl_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "fine"}\n\n{"text": broken}\n', encoding="utf-8")
    message = error_of(path)
    assert "line 3" in message and "invalid JSON" in message


def test_jsonl_field_problems(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"body": "x"}\n', encoding="utf-8")
    message = error_of(path)
    assert "no field 'text'" in message and "body" in message and "d.jsonl:1" in message
    path.write_text('{"text": 3}\n', encoding="utf-8")
    assert "not text" in error_of(path)
    path.write_text('["a list"]\n', encoding="utf-8")
    assert "expected a JSON object" in error_of(path)
    path.write_text('{"text": "x"}\n', encoding="utf-8")
    assert "no field 'q'" in error_of(path, pair_fields=("q", "r"))


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin.txt"
    path.write_bytes("line one\ncaf\xe9\n".encode("latin-1"))
    message = error_of(path)
    assert "not UTF-8" in message and "line 2" in message


@pytest.mark.parametrize("content", [b"", b"  \n\n\t\n"])
def test_empty_corpus(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "empty.txt"
    path.write_bytes(content)
    assert "contains no text" in error_of(path)
    gz = tmp_path / "empty.jsonl.gz"
    gz.write_bytes(gzip.compress(content))
    assert "contains no text" in error_of(gz)


def test_nothing_left_after_filters(tmp_path: Path, minilm_tokenizer) -> None:
    path = tmp_path / "t.txt"
    path.write_text("a b c d e f g h i j k l m n o p\n", encoding="utf-8")
    assert "yielded no documents" in error_of(path, tokenizer=minilm_tokenizer, max_tokens=4)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"unit": "word"}, "unknown unit 'word'"),
        ({"format": "csv"}, "unknown corpus format 'csv'"),
        ({"limit": 0}, "limit must be a positive integer"),
        ({"limit": 2.5}, "limit must be a positive integer"),
        ({"unit": "pair"}, "pass tokenizer=model.tokenizer"),
        ({"max_tokens": 64}, "pass tokenizer=model.tokenizer"),
        ({"buckets": [16, 32]}, "pass tokenizer=model.tokenizer"),
        ({"per_bucket": 3}, "per_bucket needs buckets"),
        ({"tokenizer": "bert"}, "expected a Hugging Face tokenizer"),
        ({"format": "lines"}, "is a wiki dump"),
        ({"pair_fields": ("a",)}, "two field names"),
    ],
)
def test_bad_options(kwargs: dict, fragment: str) -> None:
    assert fragment in error_of(**kwargs)


def test_pair_fields_need_records(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("hello\n", encoding="utf-8")
    assert "needs JSONL records" in error_of(text, pair_fields=("a", "b"))
    records = tmp_path / "p.jsonl"
    records.write_text('{"a": "x", "b": "y"}\n', encoding="utf-8")
    assert "use unit='pair'" in error_of(records, pair_fields=("a", "b"), unit="sentence")
