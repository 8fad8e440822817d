"""The Wikipedia sample ships with the package: no gensim needed, same bytes as gensim's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from identifiable.corpus import load_corpus
from identifiable.corpus.sources import wikipedia_sample_path
from identifiable.store.files import sha256_file

SHA256 = "a53f4648dec40467ebdc"  # prefix of the file's SHA-256 (gensim 4.4.0's test data)


def test_the_sample_is_package_data_with_its_notice(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gensim" else real(name, *a)
    )
    path = wikipedia_sample_path()
    assert path.parent.name == "data" and path.name == "enwiki-sample.xml.bz2"
    assert sha256_file(path).startswith(SHA256)
    notice = (Path(path).parent / "enwiki-sample.NOTICE.md").read_text("utf-8")
    assert "Wikipedia contributors" in notice
    assert "Attribution-ShareAlike 3.0" in notice
    corpus = load_corpus(limit=3)
    assert len(corpus) == 3
