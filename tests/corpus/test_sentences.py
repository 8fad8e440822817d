"""The regex sentence splitter: boundaries, abbreviations, initials, quotes."""

from __future__ import annotations

import pytest

from identifiable.corpus import split_sentences


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("One. Two! Three? Four", ["One.", "Two!", "Three?", "Four"]),
        ("Dr. Smith met Mrs. Jones. They talked.", ["Dr. Smith met Mrs. Jones.", "They talked."]),
        ("John F. Kennedy spoke. Crowds came.", ["John F. Kennedy spoke.", "Crowds came."]),
        (
            "Built c. 1500 by Brig. Gen. Hull. It fell.",
            ["Built c. 1500 by Brig. Gen. Hull.", "It fell."],
        ),
        ("See No. 5 on p. 12 of Vol. 3. Done.", ["See No. 5 on p. 12 of Vol. 3.", "Done."]),
        ("It was a yes. No. That was it.", ["It was a yes.", "No.", "That was it."]),
        ("The U.S. Army won. The war ended.", ["The U.S. Army won.", "The war ended."]),
        ("He moved to the U.S. The war ended.", ["He moved to the U.S.", "The war ended."]),
        ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
        ("It rose (sharply.) Then fell.", ["It rose (sharply.)", "Then fell."]),
        ("Pi is 3.14 exactly. Or not.", ["Pi is 3.14 exactly.", "Or not."]),
        ("Fruit, e.g. apples, i.e. food. Good.", ["Fruit, e.g. apples, i.e. food.", "Good."]),
        ("Wait... What happened? Nothing.", ["Wait...", "What happened?", "Nothing."]),
        ("lower case. after a period stays", ["lower case. after a period stays"]),
        ("In 1999. 2000 came next.", ["In 1999.", "2000 came next."]),
        ("Smith et al. Showed it. Yes.", ["Smith et al. Showed it.", "Yes."]),
    ],
)
def test_split_cases(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def test_whitespace_is_normalised_and_rejoins_exactly() -> None:
    text = "  First  line\n goes on.\tSecond\n\nline.  "
    sentences = split_sentences(text)
    assert sentences == ["First line goes on.", "Second line."]
    assert " ".join(sentences) == " ".join(text.split())


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_blank_text_has_no_sentences(text: str) -> None:
    assert split_sentences(text) == []
