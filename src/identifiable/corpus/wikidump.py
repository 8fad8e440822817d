"""Stream a MediaWiki XML export (optionally bz2/gzip-compressed) into Documents.

Only main-namespace articles are kept; redirects and pages of other namespaces
(Talk:, Wikipedia:, File:, …) are skipped. Parsing streams with
`xml.etree.ElementTree.iterparse` and clears each page after use, so memory stays
flat for large dumps when `max_documents` bounds the result.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from identifiable.corpus.document import Document
from identifiable.corpus.fileio import CORRUPT_ERRORS, ReadLimits, bounded_stream
from identifiable.corpus.wikitext import clean_wikitext
from identifiable.errors import IdentifiableError

__all__ = ["parse_wiki_dump"]

# What a truncated or damaged dump raises while it is parsed.
_READ_ERRORS: tuple[type[BaseException], ...] = (*CORRUPT_ERRORS, ET.ParseError, ValueError)

_NAMESPACE_NAMES = (
    "talk user wikipedia project file image mediawiki template help category portal "
    "book draft module timedtext gadget special media"
)
_NAMESPACES = frozenset(
    f"{name}{suffix}" for name in _NAMESPACE_NAMES.split() for suffix in ("", " talk")
)


def _local(tag: str) -> str:
    """Strip the XML namespace: `{http://www.mediawiki.org/…}page` → `page`."""
    return tag.rsplit("}", 1)[-1]


def _child_text(element: ET.Element, name: str) -> str | None:
    for child in element:
        if _local(child.tag) == name:
            return child.text or ""
    return None


def _page(element: ET.Element) -> tuple[str, str] | None:
    """Return `(title, wikitext)` of a main-namespace article, or None to skip the page."""
    title = _child_text(element, "title") or ""
    namespace = _child_text(element, "ns")
    if any(_local(child.tag) == "redirect" for child in element):
        return None
    text = ""
    for child in element:
        if _local(child.tag) == "revision":
            text = _child_text(child, "text") or ""
    if namespace is not None and namespace.strip() != "0":
        return None
    if namespace is None and title.split(":", 1)[0].strip().lower() in _NAMESPACES:
        return None  # old exports without <ns>: the title's prefix names the namespace
    if text.lstrip()[:9].upper() == "#REDIRECT":
        return None
    return title, text


def parse_wiki_dump(
    path: Path, *, max_documents: int | None = None, limits: ReadLimits | None = None
) -> tuple[Document, ...]:
    """Parse a MediaWiki XML export into clean Documents, in file order.

    Args:
        path: an `.xml`, `.xml.bz2` or `.xml.gz` export.
        max_documents: stop after this many articles (None: all).
        limits: the most bytes the dump may decompress to (default: the limits in force,
            see `identifiable.corpus.fileio.read_limits`).

    Returns:
        One Document per article, including articles whose every paragraph was
        filtered out (they have no paragraphs), so counts match the dump.

    Raises:
        IdentifiableError: the file is truncated, corrupt or not a MediaWiki export.
    """
    documents: list[Document] = []
    try:
        with bounded_stream(path, limits) as stream:
            root_checked = False
            for event, element in ET.iterparse(stream, events=("start", "end")):
                if not root_checked:
                    root_checked = True
                    if _local(element.tag) != "mediawiki":
                        raise IdentifiableError(
                            f"{path} is XML but not a MediaWiki export (root <{_local(element.tag)}>); "
                            "pass a Wikipedia pages-articles dump, or a .txt/.jsonl file"
                        )
                if event != "end" or _local(element.tag) != "page":
                    continue
                page = _page(element)
                element.clear()
                if page is not None:
                    title, markup = page
                    documents.append(Document(title, tuple(clean_wikitext(markup))))
                    if max_documents is not None and len(documents) >= max_documents:
                        break
    except _READ_ERRORS as exc:
        raise IdentifiableError(
            f"cannot read wiki dump {path}: {exc}. The file is truncated or corrupt; "
            "download it again or pass another file"
        ) from exc
    return tuple(documents)
