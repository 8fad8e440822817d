"""Text a tokenizer can take: no lone surrogates.

Python strings may hold surrogate code points (U+D800..U+DFFF) that are not Unicode text:
JSON escapes such as "\\ud800" decode to them, and so do bytes the shell passed as
arguments that are not UTF-8 (PEP 383). Tokenizers refuse them with a TypeError, and
replacing them would analyse a text the user did not write, so every text is checked here
once, where it enters (a corpus record, `Model.encode`), and refused in one line.
"""

from __future__ import annotations

import re

from identifiable.errors import IdentifiableError

_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(text: str) -> int | None:
    """The index of the first surrogate code point in `text`, or None."""
    found = _SURROGATE.search(text)
    return None if found is None else found.start()


def check_unicode(text: str, what: str, fix: str = "pass valid Unicode text") -> None:
    """Refuse `text` (described as `what`, e.g. "text" or "notes.jsonl:3, field 'text'")
    when it holds a lone surrogate; `fix` says what to do."""
    at = lone_surrogate(text)
    if at is not None:
        raise IdentifiableError(
            f"{what} holds a lone surrogate (U+{ord(text[at]):04X} at character {at}), which is "
            f"not Unicode text and no tokenizer can encode; {fix}"
        )
