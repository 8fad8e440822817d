"""Markup cleaning of single articles: every construct the cleaner promises to handle."""

from __future__ import annotations

import pytest

from identifiable.corpus import clean_wikitext


def clean(markup: str) -> str:
    """The cleaned article as one string, paragraphs separated by blank lines."""
    return "\n\n".join(" ".join(p) for p in clean_wikitext(markup))


@pytest.mark.parametrize(
    ("markup", "expected"),
    [
        # links keep their display text, including link trails
        (
            "The [[cat]]s sat on [[Mat (floor)|the mat]] all day long today.",
            "The cats sat on the mat all day long today.",
        ),
        # nested templates vanish entirely; convert and lang keep their running text
        (
            "A {{outer|{{inner|x}}|y}}river runs {{convert|10|km|mi}} from here to there.",
            "A river runs 10 km from here to there.",
        ),
        (
            "Greek {{lang|grc|ἀναρχία}} means without any rulers at all here.",
            "Greek ἀναρχία means without any rulers at all here.",
        ),
        (
            "The hero was born {{birth date|1809|2|12}} in a small log cabin.",
            "The hero was born 12 February 1809 in a small log cabin.",
        ),
        # refs (paired and self-closing) and comments are removed with their content
        (
            'It rained<ref name="a">Source {{cite web|url=x}}</ref> hard<ref name="a"/> on the town<!-- hidden --> all night.',
            "It rained hard on the town all night.",
        ),
        # bold / italic quotes, HTML tags and entities
        (
            "'''Bold''' and ''italic'' words, H<sub>2</sub>O&nbsp;and x&amp;y are fine here.",
            "Bold and italic words, H2O and x&y are fine here.",
        ),
        # external links keep their label; bare ones go
        (
            "Read [http://example.org the guide] and [http://example.org] before the long trip.",
            "Read the guide and before the long trip.",
        ),
        # template debris in brackets is tidied
        (
            "The letter A (named {{IPAc-en|eɪ}}, plural As) is the first letter of it.",
            "The letter A (named, plural As) is the first letter of it.",
        ),
    ],
)
def test_inline_markup(markup: str, expected: str) -> None:
    assert clean(markup) == expected


def test_file_and_category_links_vanish_even_with_nested_links() -> None:
    markup = (
        "[[File:X.jpg|thumb|A caption with [[a link]] and [[b|more]] text.]]\n"
        "Prose of the article goes right here in this line.\n"
        "[[Category:Things]]\n[[fr:Chose]]"
    )
    assert clean(markup) == "Prose of the article goes right here in this line."


def test_tables_lists_headings_and_back_matter() -> None:
    markup = """Intro paragraph with enough words to be kept by the filter.
{| class="wikitable"
|-
! Head !! Other
|-
| cell {{tmpl|1}} || cell two
|}
== History ==
* a list item that is long enough to be a sentence if it were prose.
# numbered item that is also long enough to be a sentence here.
: indented remark that should also be dropped from the prose.
History paragraph one has its own sentences. It has two of them.

Second history paragraph, after a blank line, is separate.
== References ==
Smith, John. A book title that looks like a sentence. Publisher, 2001.
=== Sub of references ===
Still back matter that must not appear in the output text.
== Legacy ==
Legacy paragraph comes after the skipped back matter sections."""
    paragraphs = clean_wikitext(markup)
    assert [" ".join(p) for p in paragraphs] == [
        "Intro paragraph with enough words to be kept by the filter.",
        "History paragraph one has its own sentences. It has two of them.",
        "Second history paragraph, after a blank line, is separate.",
        "Legacy paragraph comes after the skipped back matter sections.",
    ]
    assert paragraphs[1] == ("History paragraph one has its own sentences.", "It has two of them.")


def test_sentences_with_formulae_are_dropped_not_holed() -> None:
    markup = "The mean is defined as <math>\\bar x = \\sum x_i / n</math> for all samples. It is a simple statistic of the data."
    assert clean(markup) == "It is a simple statistic of the data."


def test_short_fragments_and_unfinished_paragraphs_are_dropped() -> None:
    markup = "Caption only\n\nThe following sources cite the claim as stated:\n\nA real paragraph of prose that ends properly."
    assert clean(markup) == "A real paragraph of prose that ends properly."


def test_unbalanced_markup_never_leaks() -> None:
    markup = "Good sentence before the problem here. Broken {{template without end. Next good sentence is clean."
    text = clean(markup)
    assert "{{" not in text
    assert text.startswith("Good sentence before the problem here.")
