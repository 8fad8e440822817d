"""A regex sentence splitter for English prose, with abbreviation handling.

No model download (nltk's punkt would need one). A boundary is sentence-final
punctuation (`.`, `!`, `?`, `…`, optionally followed by closing quotes or
brackets), then whitespace, then something that can start a sentence (a capital
letter, a digit, or an opening quote/bracket before one). A `.` boundary is
rejected when the word before it is a known abbreviation ("Dr.", "St.", "e.g."),
a single initial ("John F. Kennedy"), an abbreviation that precedes a number
("No. 5", "c. 1500", "pp. 12"), or a dotted acronym ("U.S. Army") unless the next
word is a common sentence opener ("… in the U.S. The …").
"""

from __future__ import annotations

import re

__all__ = ["split_sentences"]


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Words that are abbreviations when followed by a '.', lower-cased, without dots.
# "etc" is deliberately absent: "… and so on, etc. The next …" ends a sentence
# far more often than it continues one before a capitalised word.
_ABBREVIATIONS = _words(
    """
    mr mrs ms messrs mme mlle dr prof st mt ft gen col lt capt cmdr sgt maj adm brig
    cpl pvt lieut fr gov sen rep rev hon pres supt jr sr esq
    jan feb mar apr jun jul aug sep sept oct nov dec
    inc ltd co corp bros assn dept univ ave blvd cir
    vs v al cf viz approx ed eds trans transl repr ibid esp incl est fl
    e.g i.e a.k.a
    """
)

# Abbreviations that only continue the sentence before a number ("No. 5", "c. 1500").
_NUMBER_ABBREVIATIONS = _words("no nos vol vols pp p art fig figs ch sec op c ca nr")

# Common sentence openers: a dotted acronym followed by one of these ends a sentence.
_OPENERS = _words(
    """
    a an the in on at it its he she they we i this that these those there his her
    their however but and after before during when while although since as for
    some many most one two by from with if what who
    """
)

# Candidate boundary: terminal punctuation (group 1), whitespace, and a lookahead
# for something that can start a sentence.
_CANDIDATE = re.compile(r"([.!?…]+[\"'”’)\]]*)\s+(?=[\"'“‘(\[]*[A-Z0-9À-ÖØ-Þ])")
_INITIAL = re.compile(r"^[A-Z]$")
_ACRONYM = re.compile(r"^(?:[A-Za-z]\.)+[A-Za-z]$")


def _is_boundary(text: str, match: re.Match[str]) -> bool:
    """Decide whether a candidate boundary really ends a sentence."""
    punct = match.group(1)
    if not punct.startswith(".") or punct.startswith(".."):
        return True  # '!', '?', '…' and ellipses always end a sentence here
    start = text.rfind(" ", 0, match.start()) + 1
    word = text[start : match.start()].lstrip("\"'“‘([")
    rest = text[match.end() :]
    next_word = rest.split(" ", 1)[0].strip("\"'“‘([,;:").lower()
    key = word.lower()
    if key in _ABBREVIATIONS:
        return False
    if key in _NUMBER_ABBREVIATIONS and rest[:1].isdigit():
        return False
    if _INITIAL.match(word):
        return False
    return not (_ACRONYM.match(word) and next_word not in _OPENERS)


def split_sentences(text: str) -> list[str]:
    """Split one paragraph of prose into sentences.

    Whitespace is normalised first (runs become one space), so
    `" ".join(split_sentences(t)) == " ".join(t.split())`.

    Args:
        text: a paragraph of running text.

    Returns:
        The sentences in order, each stripped and non-empty; `[]` for blank text.
    """
    text = " ".join(text.split())
    sentences: list[str] = []
    start = 0
    for match in _CANDIDATE.finditer(text):
        if _is_boundary(text, match):
            sentences.append(text[start : match.end(1)])
            start = match.end()
    if start < len(text):
        sentences.append(text[start:])
    return sentences
