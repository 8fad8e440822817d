"""`Document`: one article or text of a corpus, as paragraphs of sentences."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Document"]


@dataclass(frozen=True)
class Document:
    """One article (Wikipedia), line or paragraph (text files) or record (JSONL).

    Attributes:
        title: the article title, or `"<file>:<line>"` for file sources.
        paragraphs: the paragraphs in order, each a tuple of its sentences.
            A paragraph's text is its sentences joined by single spaces.
    """

    title: str
    paragraphs: tuple[tuple[str, ...], ...]

    @property
    def paragraph_texts(self) -> tuple[str, ...]:
        """Each paragraph as one string."""
        return tuple(" ".join(p) for p in self.paragraphs)

    @property
    def sentences(self) -> tuple[str, ...]:
        """All sentences of the document in order."""
        return tuple(s for p in self.paragraphs for s in p)

    @property
    def text(self) -> str:
        """The whole document, paragraphs separated by a blank line."""
        return "\n\n".join(self.paragraph_texts)
