"""Plain text, JSONL, compressed files and Hugging Face datasets as corpus sources."""

from __future__ import annotations

import bz2
import gzip
import json
import sys
import types
from pathlib import Path

import pytest

from identifiable.corpus import load_corpus, load_documents
from identifiable.errors import IdentifiableError


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_lines_file_one_text_per_line(tmp_path: Path) -> None:
    # auto: no multi-line blocks between blank lines, so every line is a text
    path = write(tmp_path / "t.txt", "First text. Two sentences.\n\n  Second text  \n\n\nThird\n")
    corpus = load_corpus(path)
    assert corpus.unit == "document" and corpus.name == "t.txt"
    assert list(corpus) == ["First text. Two sentences.", "Second text", "Third"]
    assert list(load_corpus(path, unit="sentence")) == [
        "First text.",
        "Two sentences.",
        "Second text",
        "Third",
    ]


def test_lines_without_blank_lines(tmp_path: Path) -> None:
    path = write(tmp_path / "t.txt", "one\r\ntwo\nthree")
    assert list(load_corpus(path)) == ["one", "two", "three"]


def test_paragraph_file_joins_lines_within_blocks(tmp_path: Path) -> None:
    text = "One paragraph\nwrapped over lines.\n\n\nAnother one\nhere. With two.\n"
    path = write(tmp_path / "p.txt", text)
    assert list(load_corpus(path)) == [
        "One paragraph wrapped over lines.",
        "Another one here. With two.",
    ]
    assert list(load_corpus(path, format="lines")) == [
        "One paragraph",
        "wrapped over lines.",
        "Another one",
        "here. With two.",
    ]
    assert load_documents(path)[1].paragraphs == (("Another one here.", "With two."),)


def test_compressed_text_reads_like_plain(tmp_path: Path) -> None:
    path = tmp_path / "t.txt.gz"
    path.write_bytes(gzip.compress(b"alpha beta\ngamma delta\n"))
    assert list(load_corpus(path)) == ["alpha beta", "gamma delta"]


def test_jsonl_text_field_and_pairs(tmp_path: Path) -> None:
    records = [
        {"body": "First record. It has paragraphs.\n\nSecond paragraph.", "a": "x y", "b": "z"},
        {"body": "Second record.", "a": "premise", "b": "hypothesis"},
    ]
    path = write(tmp_path / "d.jsonl", "\n".join(json.dumps(r) for r in records) + "\n\n")
    corpus = load_corpus(path, field="body", unit="paragraph")
    assert list(corpus) == [
        "First record. It has paragraphs.",
        "Second paragraph.",
        "Second record.",
    ]
    pairs = load_corpus(path, pair_fields=("a", "b"))
    assert pairs.unit == "pair" and pairs.is_pairs
    assert list(pairs) == [("x y", "z"), ("premise", "hypothesis")]


def test_json_array_is_accepted(tmp_path: Path) -> None:
    path = write(tmp_path / "d.json", json.dumps([{"text": "one"}, {"text": "two"}]))
    assert list(load_corpus(path)) == ["one", "two"]


def test_user_wiki_dump(tmp_path: Path) -> None:
    dump = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">
<page><title>Kept</title><ns>0</ns><revision><text>'''Kept''' is an article of [[prose]] that is kept.</text></revision></page>
<page><title>Gone</title><ns>0</ns><redirect title="Kept"/><revision><text>#REDIRECT [[Kept]]</text></revision></page>
<page><title>Talk:Kept</title><ns>1</ns><revision><text>A talk page that is long enough to be a paragraph.</text></revision></page>
</mediawiki>"""
    path = write(tmp_path / "mini.xml", dump)
    documents = load_documents(path)
    assert [d.title for d in documents] == ["Kept"]
    assert list(load_corpus(path)) == ["Kept is an article of prose that is kept."]


def test_old_dump_without_namespace_elements(tmp_path: Path) -> None:
    page = "<page><title>{}</title><revision><text>{} is a page with enough words in it.</text></revision></page>"
    pages = "".join(page.format(t, t) for t in ["Star Wars: A New Hope", "Talk:Kept", "Kept"])
    path = tmp_path / "old.xml.bz2"
    path.write_bytes(bz2.compress(f"<mediawiki>{pages}</mediawiki>".encode()))
    assert [d.title for d in load_documents(path)] == ["Star Wars: A New Hope", "Kept"]


def fake_datasets(rows: list[dict]) -> types.ModuleType:
    module = types.ModuleType("datasets")
    calls: list[tuple] = []

    def load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        if name == "missing":
            raise FileNotFoundError("Dataset 'missing' doesn't exist on the Hub")
        return rows

    module.load_dataset = load_dataset  # type: ignore[attr-defined]
    module.calls = calls  # type: ignore[attr-defined]
    return module


def test_hf_dataset_records(monkeypatch: pytest.MonkeyPatch) -> None:
    module = fake_datasets([{"text": "Row one. Two."}, {"text": "Row two."}])
    monkeypatch.setitem(sys.modules, "datasets", module)
    corpus = load_corpus("hf:toy", config="c", split="test", unit="sentence")
    assert list(corpus) == ["Row one.", "Two.", "Row two."]
    assert corpus.name == "hf:toy"
    assert module.calls == [("toy", "c", "test")]  # type: ignore[attr-defined]
    with pytest.raises(IdentifiableError, match=r"could not load dataset 'missing'.*JSONL"):
        load_corpus("hf:missing")


def test_hf_without_datasets_installed_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(IdentifiableError, match=r"install identifiable\[datasets\]"):
        load_corpus("hf:wikitext")
