"""Opening corpus files: transparent decompression, bounded reads and clear errors.

Every read is streamed and bounded, so that a hostile or broken file (a 1 MiB
`.gz` that inflates to gigabytes, a file that is one endless line) fails with one
line instead of exhausting memory:

- `max_bytes` (default 256 MiB): the most bytes a corpus file may decompress to.
- `max_line_bytes` (default 1 MiB): the longest line of a text or JSON Lines file.

Both can be raised per call (`load_corpus(..., max_bytes=…, max_line_bytes=…)`), for a
block of code (`with read_limits(max_bytes=…):`, which `reproduce` and the CLI's
`--max-corpus-mib` / `--max-line-kib` use), and peak memory grows with them.
"""

from __future__ import annotations

import bz2
import codecs
import contextlib
import contextvars
import gzip
import hashlib
import io
import lzma
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

from identifiable.errors import IdentifiableError

__all__ = [
    "DEFAULT_LIMITS",
    "ReadLimits",
    "bounded_stream",
    "current_limits",
    "file_digest",
    "open_binary",
    "peek",
    "read_limits",
    "read_text",
]

_OPENERS: dict[str, Callable[[Path, str], Any]] = {
    ".bz2": bz2.open,
    ".gz": gzip.open,
    ".xz": lzma.open,
}
_CHUNK = 1 << 20
# What a damaged archive raises while inflating; all mean "unreadable file".
CORRUPT_ERRORS: tuple[type[BaseException], ...] = (OSError, EOFError, lzma.LZMAError, zlib.error)


@dataclass(frozen=True)
class ReadLimits:
    """Bounds on reading one corpus file.

    Attributes:
        max_bytes: the most bytes the file may decompress to.
        max_line_bytes: the longest line (text and JSON Lines files), in bytes.
    """

    max_bytes: int = 256 << 20
    max_line_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_line_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise IdentifiableError(f"{name} must be a positive integer, got {value!r}")


DEFAULT_LIMITS = ReadLimits()
_LIMITS: contextvars.ContextVar[ReadLimits] = contextvars.ContextVar(
    "identifiable_read_limits", default=DEFAULT_LIMITS
)


def current_limits(max_bytes: int | None = None, max_line_bytes: int | None = None) -> ReadLimits:
    """The limits in force (see `read_limits`), with the given ones replaced."""
    limits = _LIMITS.get()
    changes = {
        k: v
        for k, v in (("max_bytes", max_bytes), ("max_line_bytes", max_line_bytes))
        if v is not None
    }
    return replace(limits, **changes) if changes else limits


@contextlib.contextmanager
def read_limits(
    max_bytes: int | None = None, max_line_bytes: int | None = None
) -> Iterator[ReadLimits]:
    """Raise (or lower) the corpus read limits for the code inside the block."""
    token = _LIMITS.set(current_limits(max_bytes, max_line_bytes))
    try:
        yield _LIMITS.get()
    finally:
        _LIMITS.reset(token)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


def too_big(path: Path, limits: ReadLimits) -> IdentifiableError:
    return IdentifiableError(
        f"corpus file {path} decompresses to more than {_mib(limits.max_bytes)}; if that is "
        "intended, raise the limit (--max-corpus-mib, or max_bytes=… in Python)"
    )


def open_binary(path: Path) -> BinaryIO:
    """Open `path` for reading bytes, decompressing `.bz2`, `.gz` and `.xz` by suffix."""
    opener = _OPENERS.get(path.suffix.lower())
    stream: BinaryIO = opener(path, "rb") if opener else open(path, "rb")  # noqa: SIM115
    return stream


class _Bounded(io.RawIOBase):
    """A read-only stream that fails with one line once more than `limit` bytes were read."""

    def __init__(self, raw: BinaryIO, path: Path, limits: ReadLimits) -> None:
        self._raw, self._path, self._limits, self.total = raw, path, limits, 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        room = self._limits.max_bytes - self.total + 1  # one byte more reveals an excess
        data = self._raw.read(min(size, room) if size is not None and size >= 0 else room)
        self.total += len(data)
        if self.total > self._limits.max_bytes:
            raise too_big(self._path, self._limits)
        return data

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._raw.close()
        super().close()


def bounded_stream(path: Path, limits: ReadLimits | None = None) -> _Bounded:
    """`open_binary(path)` that stops at `limits.max_bytes` decompressed bytes."""
    return _Bounded(open_binary(path), path, limits or current_limits())


def file_digest(path: Path) -> str:
    """SHA-256 of the file's bytes as stored (compressed or not): its content identity."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def corrupt(path: Path, exc: BaseException) -> IdentifiableError:
    return IdentifiableError(
        f"cannot read corpus file {path}: {exc}. The file is unreadable, truncated "
        "or corrupt; check it or pass another file"
    )


def peek(path: Path, size: int = 512) -> bytes:
    """The first `size` (decompressed) bytes, to sniff the format."""
    try:
        with open_binary(path) as stream:
            return stream.read(size)
    except CORRUPT_ERRORS as exc:
        raise corrupt(path, exc) from exc


def _read_bounded(path: Path, limits: ReadLimits) -> str:
    """The decompressed text, streamed and decoded chunk by chunk; fails early past either
    limit. Peak memory is about twice the text (its pieces, then the joined string)."""
    pieces: list[str] = []
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    line, number = 0, 1  # bytes in the current line, its 1-based number
    try:
        with bounded_stream(path, limits) as stream:
            while chunk := stream.read(_CHUNK):
                parts = chunk.split(b"\n")
                lengths = [line + len(parts[0]), *map(len, parts[1:])]
                if max(lengths) > limits.max_line_bytes:
                    at = number + next(
                        i for i, n in enumerate(lengths) if n > limits.max_line_bytes
                    )
                    raise IdentifiableError(
                        f"corpus file {path}: line {at} is longer than "
                        f"{limits.max_line_bytes / 1024:g} KiB; split it into shorter texts, or "
                        "raise the limit (--max-line-kib, or max_line_bytes=… in Python)"
                    )
                try:
                    pieces.append(decoder.decode(chunk))
                except UnicodeDecodeError as exc:
                    bad = number + chunk[: max(exc.start, 0)].count(b"\n")
                    raise IdentifiableError(
                        f"corpus file {path} is not UTF-8 text (invalid byte at line {bad}); "
                        "convert it to UTF-8 or pass a .txt/.jsonl file"
                    ) from exc
                line, number = lengths[-1], number + len(parts) - 1
                del parts, lengths, chunk
            try:
                pieces.append(decoder.decode(b"", final=True))
            except UnicodeDecodeError as exc:
                raise IdentifiableError(
                    f"corpus file {path} is not UTF-8 text (it ends inside a character, "
                    f"line {number}); convert it to UTF-8 or pass a .txt/.jsonl file"
                ) from exc
    except IdentifiableError:
        raise
    except CORRUPT_ERRORS as exc:
        raise corrupt(path, exc) from exc
    return "".join(pieces)


def read_text(path: Path, limits: ReadLimits | None = None) -> str:
    """Read a (possibly compressed) UTF-8 text file whole, within `limits`.

    Raises:
        IdentifiableError: unreadable, truncated/corrupt archive, past a limit, or not
            UTF-8 text.
    """
    return _read_bounded(path, limits or current_limits())
