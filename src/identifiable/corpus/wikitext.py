"""Turn one article's MediaWiki markup into clean paragraphs of sentences.

Steps, in order (each is a regex pass; nested constructs are removed innermost
first, repeating until nothing changes, so no Python character loop is needed):

1. Drop comments, `<ref>` footnotes, and block tags whose content is not prose
   (`<math>`, `<gallery>`, `<poem>`, `<code>`, …). Formulae and code become a
   marker, and sentences containing a marker are dropped later: a sentence with
   a hole where its formula was is not natural text.
2. Resolve `[[links]]` and `{{templates}}` innermost first, alternating, because
   each nests in the other (`{{lang|es|[[La Voz]]}}`, `[[File:x|{{small|y}}]]`).
   Links keep their display text; File/Image/Category/interlanguage links go.
   Templates go, except a few that carry running text (convert, lang, nowrap,
   dates, …). Tables `{| … |}` go with their content.
3. External links keep their label; bold/italic quotes, HTML tags and
   `__MAGIC__` words go; HTML entities are decoded.
4. Lines: headings end a paragraph, and the "See also / References / …"
   sections are skipped; list items, table rows and indented lines go.
5. Each paragraph is split into sentences; sentences still holding a marker or
   markup residue are dropped; a paragraph is kept if it has at least
   `MIN_PARAGRAPH_WORDS` words and ends like a sentence.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

from identifiable.corpus.sentences import split_sentences

__all__ = ["MIN_PARAGRAPH_WORDS", "clean_wikitext"]

MIN_PARAGRAPH_WORDS = 8
_HOLE = "\u2063"  # invisible separator: marks removed formulae/code inside a sentence

_COMMENT = re.compile(r"<!--.*?(?:-->|$)", re.S)
_REF_SELF = re.compile(r"<ref\b[^>]*?/\s*>", re.I)
_REF_PAIR = re.compile(r"<ref\b[^>]*>.*?(?:</ref\s*>|$)", re.I | re.S)
_DROP_BLOCK = re.compile(
    r"<(gallery|poem|timeline|imagemap|references|score|graph|mapframe|table)\b[^>]*>"
    r".*?</\1\s*>",
    re.I | re.S,
)
_HOLE_BLOCK = re.compile(
    r"<(math|chem|ce|code|source|syntaxhighlight|pre|hiero)\b[^>]*>.*?</\1\s*>", re.I | re.S
)
_LINK = re.compile(r"\[\[((?:[^\[\]]|\[(?!\[)|\](?!\]))*)\]\]([a-z]*)")
_TEMPLATE = re.compile(r"\{\{([^{}]*)\}\}")
_TABLE = re.compile(r"\{\|(?:(?!\{\|)[\s\S])*?\|\}")
_EXTERNAL = re.compile(r"\[(?:https?:|ftp:|//)[^\s\]]*(?:\s+([^\]]*))?\]")
_QUOTES = re.compile(r"'''''|'''|''")
_TAG = re.compile(r"</?[a-zA-Z][^<>]*>")
_MAGIC = re.compile(r"__[A-Z]+__")
_HEADING = re.compile(r"^(=+)\s*(.*?)\s*\1\s*$")
_RESIDUE = re.compile(r"\{\{|\}\}|\[\[|\]\]|\{\||\|\}|\||<[a-zA-Z/!]|__|" + _HOLE)
_SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]]*$")

_SKIP_SECTIONS = frozenset(
    {
        "see also",
        "references",
        "external links",
        "further reading",
        "notes",
        "bibliography",
        "sources",
        "footnotes",
        "citations",
        "notes and references",
        "references and notes",
        "works cited",
        "literature",
        "selected bibliography",
        "selected works",
        "works",
        "publications",
        "discography",
        "filmography",
        "gallery",
    }
)  # back matter: lists of titles and links, not running prose
_DROP_NAMESPACES = ("file:", "image:", "category:", "media:")
_INTERLANGUAGE = re.compile(r"^[a-z]{2,3}(?:-[a-z]+)?:")
_MONTHS = "January February March April May June July August September October November December"
_MONTH = dict(enumerate(_MONTHS.split(), start=1))
_UNITS = {"C": "°C", "F": "°F", "km2": "km²", "m2": "m²", "sqmi": "sq mi", "mi2": "sq mi"}
_CONNECTORS = frozenset(["to", "-", "–", "and", "or", "by", "x", "×", "+", "and(-)", "to(-)"])


def _link(match: re.Match[str]) -> str:
    """`[[target|text]]trail` → `texttrail`; non-article links vanish."""
    inner, trail = match.group(1), match.group(2)
    target, _, label = inner.partition("|")
    low = target.strip().lower()
    if low.startswith(_DROP_NAMESPACES) or (_INTERLANGUAGE.match(low) and not label):
        return ""
    if label:
        # [[File:…|thumb|caption]] was handled above; a plain pipe link keeps the last part
        text = label.rsplit("|", 1)[-1]
    else:
        text = target.lstrip(":").split("#")[0] or target.lstrip(":")
        if ":" in text and not label:
            text = text.split(":", 1)[1]  # [[wikt:anarchy]] → anarchy
    return text + trail


def _date(args: list[str]) -> str:
    """`{{birth date|1809|2|12}}` → `12 February 1809` (tolerates partial dates)."""
    nums = [a.strip() for a in args if a.strip().isdigit()]
    if len(nums) >= 3 and 1 <= int(nums[1]) <= 12:
        return f"{int(nums[2])} {_MONTH[int(nums[1])]} {nums[0]}"
    return nums[0] if nums else _HOLE


def _convert(args: list[str]) -> str:
    """`{{convert|6|ft|4|in|cm}}` → `6 ft 4 in`; `{{convert|2|and|5|km}}` → `2 and 5 km`."""
    out: list[str] = []
    i = 0
    while i + 1 < len(args):
        out.append(args[i])
        while i + 2 < len(args) and args[i + 1] in _CONNECTORS:
            out += [args[i + 1], args[i + 2]]
            i += 2
        out.append(_UNITS.get(args[i + 1], args[i + 1]))
        i += 2
        if not (i < len(args) and re.fullmatch(r"-?[\d.,]+", args[i])):
            break
    return " ".join(out) if out else _HOLE


def _template(match: re.Match[str]) -> str:
    """Keep the running text of a few content templates; drop every other template."""
    parts = [p.strip() for p in match.group(1).split("|")]
    name = parts[0].lower().replace("_", " ")
    args = [p for p in parts[1:] if "=" not in p]  # positional arguments only
    if name.startswith("formatnum:"):
        return parts[0].split(":", 1)[1].strip()
    simple: dict[str, Callable[[list[str]], str]] = {
        "convert": _convert,
        "cvt": _convert,
        "lang": lambda a: a[1] if len(a) > 1 else "",
        "transl": lambda a: a[-1] if a else "",
        "nihongo": lambda a: a[0] if a else "",
        "ndash": lambda a: "–",
        "mdash": lambda a: "—",
        "snd": lambda a: " – ",
        "'": lambda a: "'",
        "circa": lambda a: "c. " + (a[0] if a else ""),
        "c.": lambda a: "c. " + (a[0] if a else ""),
    }
    if name in simple:
        return simple[name](args)
    if name.startswith("lang-"):
        return args[0] if args else ""
    if name in {"nowrap", "small", "smaller", "big", "nobr", "flag", "flagcountry", "math"}:
        return args[0] if args else ""
    if name.startswith(("birth date", "death date", "start date", "end date", "dts")):
        return _date(args)
    if name in {"inflation", "formatprice", "age", "frac", "sfrac", "mvar", "ipa", "val"}:
        return _HOLE  # a value we cannot reproduce: drop the sentence instead
    return ""


def _resolve_nested(text: str) -> str:
    """Resolve links, templates and tables innermost first until nothing changes."""
    while True:
        new = _LINK.sub(_link, text)
        new = _TEMPLATE.sub(_template, new)
        new = _TABLE.sub("", new)
        if new == text:
            return new
        text = new


_DEBRIS = (
    (re.compile(r"\(\s*[,;:]?\s*\)|\[\s*\]"), ""),  # emptied brackets
    (re.compile(r"\(\s*[,;:]?\s+"), "("),  # "( , born" → "(born"
    (re.compile(r"\s*[,;:]\s*\)"), ")"),
    (re.compile(r"\s+([,.;:!?)])"), r"\1"),  # "Greek , i.e." → "Greek, i.e."
    (re.compile(r",\s*(?=[,.])"), ""),
)


def _tidy(paragraph: str) -> str:
    """Remove the punctuation debris that deleted templates leave behind."""
    paragraph = " ".join(paragraph.split())
    for pattern, replacement in _DEBRIS:
        paragraph = pattern.sub(replacement, paragraph)
    return " ".join(paragraph.split())


def _paragraph_blocks(text: str) -> list[str]:
    """Group prose lines into paragraph texts, skipping lists, tables and back matter."""
    blocks: list[str] = []
    current: list[str] = []
    skip_level = 0  # heading level of a skipped section, 0 when not skipping
    for raw in text.split("\n"):
        line = raw.strip()
        heading = _HEADING.match(line)
        if heading or not line or line[0] in "*#:;|!{}=":
            if current:
                blocks.append(" ".join(current))
                current = []
            if heading:
                level = len(heading.group(1))
                if skip_level and level > skip_level:
                    continue
                title = heading.group(2).strip().lower()
                skip_level = level if title in _SKIP_SECTIONS else 0
            continue
        if not skip_level:
            current.append(line)
    if current:
        blocks.append(" ".join(current))
    return blocks


def clean_wikitext(markup: str) -> list[tuple[str, ...]]:
    """Clean one article's wikitext into paragraphs of sentences.

    Args:
        markup: the article's raw MediaWiki source.

    Returns:
        The kept paragraphs in article order, each a tuple of its sentences
        (clean text: no templates, links, tables, refs, tags or quote markup).
    """
    text = _COMMENT.sub("", markup)
    text = _REF_SELF.sub("", text)
    text = _REF_PAIR.sub("", text)
    text = _DROP_BLOCK.sub("", text)
    text = _HOLE_BLOCK.sub(_HOLE, text)
    text = _EXTERNAL.sub(lambda m: m.group(1) or "", text)
    text = _resolve_nested(text)
    text = _QUOTES.sub("", text)
    text = re.sub(r"<br\s*/?>", " ", text, flags=re.I)
    text = _TAG.sub("", text)
    text = _MAGIC.sub("", text)
    text = html.unescape(text)
    paragraphs: list[tuple[str, ...]] = []
    for block in _paragraph_blocks(text):
        sentences = tuple(s for s in split_sentences(_tidy(block)) if not _RESIDUE.search(s))
        words = sum(len(s.split()) for s in sentences)
        if sentences and words >= MIN_PARAGRAPH_WORDS and _SENTENCE_END.search(sentences[-1]):
            paragraphs.append(sentences)
    return paragraphs
