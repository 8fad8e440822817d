"""Opening corpus files: transparent decompression and clear errors."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import lzma
from pathlib import Path
from typing import BinaryIO

from identifiable.errors import IdentifiableError

__all__ = ["file_digest", "open_binary", "peek", "read_text"]

_OPENERS = {".bz2": bz2.open, ".gz": gzip.open, ".xz": lzma.open}


def open_binary(path: Path) -> BinaryIO:
    """Open `path` for reading bytes, decompressing `.bz2`, `.gz` and `.xz` by suffix."""
    opener = _OPENERS.get(path.suffix.lower())
    return opener(path, "rb") if opener else open(path, "rb")  # type: ignore[return-value]


def file_digest(path: Path) -> str:
    """SHA-256 of the file's bytes as stored (compressed or not): its content identity."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _read(path: Path, size: int = -1) -> bytes:
    try:
        with open_binary(path) as stream:
            return stream.read(size)
    except (OSError, EOFError, lzma.LZMAError) as exc:
        raise IdentifiableError(
            f"cannot read corpus file {path}: {exc}. The file is unreadable, truncated "
            "or corrupt; check it or pass another file"
        ) from exc


def peek(path: Path, size: int = 512) -> bytes:
    """The first `size` (decompressed) bytes, to sniff the format."""
    return _read(path, size)


def read_text(path: Path) -> str:
    """Read a (possibly compressed) UTF-8 text file whole.

    Raises:
        IdentifiableError: unreadable, truncated/corrupt archive, or not UTF-8 text.
    """
    data = _read(path)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise IdentifiableError(
            f"corpus file {path} is not UTF-8 text (invalid byte at line {line}); "
            "convert it to UTF-8 or pass a .txt/.jsonl file"
        ) from exc
