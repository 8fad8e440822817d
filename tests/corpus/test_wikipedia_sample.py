"""The built-in Wikipedia sample: article count, clean text, units, determinism."""

from __future__ import annotations

import re

import pytest

from identifiable.corpus import Document, load_corpus, load_documents

# Disambiguation and list pages: every line is a list item or "… may refer to:".
EMPTY_ARTICLES = ["Alien", "Ada", "Asia Minor (disambiguation)", "List of anthropologists"]
MARKUP = re.compile(
    r"\{\{|\}\}|\[\[|\]\]|\{\||\|\}|\||<ref|</|<br|<!--|''|&[a-z]+;|^=|==|"
    r"\bFile:|\bImage:|\bCategory:|https?://|\u2063"
)


@pytest.fixture(scope="module")
def documents() -> tuple[Document, ...]:
    return load_documents()


def test_106_articles_all_main_namespace_non_redirects(documents: tuple[Document, ...]) -> None:
    # The dump holds 206 pages: 100 redirects (one in the Wikipedia: namespace) and
    # 106 main-namespace articles.
    titles = [d.title for d in documents]
    assert len(titles) == 106 == len(set(titles))
    assert titles[:3] == ["Anarchism", "Autism", "Albedo"]
    assert titles[-1] == "Algorithm"
    assert "AccessibleComputing" not in titles  # the first page, a redirect
    assert [d.title for d in documents if not d.paragraphs] == EMPTY_ARTICLES


def test_text_is_clean_prose(documents: tuple[Document, ...]) -> None:
    sentences = [s for d in documents for s in d.sentences]
    dirty = [s for s in sentences if MARKUP.search(s)]
    assert dirty == []
    for document in documents:
        for paragraph in document.paragraphs:
            assert sum(len(s.split()) for s in paragraph) >= 8
            assert re.search(r"[.!?…][\"'”’)\]]*$", paragraph[-1])
            assert all(s == " ".join(s.split()) and s for s in paragraph)


def test_first_paragraph_reads_as_the_article_does(documents: tuple[Document, ...]) -> None:
    first = documents[0].paragraphs[0]
    assert first[0] == (
        "Anarchism is a political philosophy that advocates self-governed societies "
        "based on voluntary institutions."
    )
    assert len(first) == 4


def test_units_and_counts() -> None:
    sentences, paragraphs = load_corpus(), load_corpus(unit="paragraph")
    articles = load_corpus(unit="document")
    assert sentences.unit == "sentence" and sentences.name == "wikipedia-sample"
    assert len(articles) == 106 - len(EMPTY_ARTICLES)
    assert 4000 < len(paragraphs) < len(sentences)
    assert len(sentences) > 15000
    assert " ".join(paragraphs) == " ".join(sentences)  # same text, cut differently
    assert all(isinstance(s, str) for s in sentences)


def test_parsing_is_cached_and_deterministic() -> None:
    first, second = load_corpus(unit="paragraph"), load_corpus(unit="paragraph")
    assert first.items == second.items
    assert first.fingerprint == second.fingerprint
    assert load_documents() is load_documents()  # parsed once per process
