"""The CLI's output channels: what a console cannot show, and what cannot be written.

* A console whose encoding is not UTF-8 (`PYTHONIOENCODING=ascii`, a legacy Windows code
  page, `LANG=C` on an old Python) cannot show "≤" or a token in another script: such text
  is spelled in ASCII (≤ as <=, — as --) and anything else as a \\u escape, never a
  UnicodeEncodeError.
* A write that fails (`> /dev/full`, a disk that fills behind `> out.txt`, an I/O error) ends
  the command with one line on stderr and exit status 2. The last flush happens inside, so
  a failure that only shows when the buffer is written is reported too.
* A reader that went away (`| head`) ends the command quietly with status 1, as the console
  library already does for its own writes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from typing import Any

# spelled for an ASCII console: the symbols the CLI's own messages and tables use
ASCII = str.maketrans(
    {
        "≤": "<=",
        "≥": ">=",
        "—": "--",
        "–": "-",
        "−": "-",
        "…": "...",
        "×": "x",
        "·": "*",
        "→": "->",
        "←": "<-",
        "‖": "||",
        "≈": "~",
        "±": "+/-",
        "²": "^2",
        "₁": "1",
        "Σ": "sum ",
        "‘": "'",
        "’": "'",
        "“": '"',
        "”": '"',
        "é": "e",
    }
)


class ChannelError(Exception):
    """Writing to stdout or stderr failed (raised from a guarded stream)."""

    def __init__(self, name: str, fd: int | None, err: OSError) -> None:
        super().__init__(name)
        self.name, self.fd, self.err = name, fd, err

    @property
    def reader_gone(self) -> bool:
        return isinstance(self.err, BrokenPipeError) or self.err.errno == errno.EPIPE


class GuardedStream:
    """A text stream that spells what its encoding lacks and turns a failed write into
    `ChannelError`; everything else is the stream's own."""

    def __init__(self, stream: Any, name: str) -> None:
        self._stream, self._name = stream, name
        try:
            self._fd: int | None = stream.fileno()
        except (AttributeError, OSError, ValueError):
            self._fd = None

    def _fit(self, text: str) -> str:
        encoding = getattr(self._stream, "encoding", None) or "utf-8"
        try:
            text.encode(encoding)
        except UnicodeEncodeError:
            text = text.translate(ASCII)
            return text.encode(encoding, "backslashreplace").decode(encoding)
        except LookupError:
            pass
        return text

    def write(self, text: str) -> int:
        try:
            self._stream.write(self._fit(text))
        except OSError as err:
            raise ChannelError(self._name, self._fd, err) from None
        return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as err:
            raise ChannelError(self._name, self._fd, err) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _silence(fd: int | None) -> None:
    """Point a failed channel at /dev/null so that the interpreter's last flush at exit
    cannot fail again (and print "Exception ignored …")."""
    if fd is None:
        return
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """Run the CLI with guarded stdout and stderr (restored afterwards)."""
    out, err = sys.stdout, sys.stderr
    if out is not None:
        sys.stdout = GuardedStream(out, "standard output")  # type: ignore[assignment]
    if err is not None:
        sys.stderr = GuardedStream(err, "standard error")  # type: ignore[assignment]
    try:
        try:
            yield
        finally:
            if out is not None:
                sys.stdout.flush()  # a full disk often shows only here
    except ChannelError as exc:
        _silence(exc.fd)
        if exc.reader_gone:
            raise SystemExit(1) from None
        if exc.name == "standard output" and err is not None:
            with contextlib.suppress(OSError, ValueError):
                reason = exc.err.strerror or type(exc.err).__name__
                print(
                    f"error: cannot write to standard output ({reason}); free some space "
                    "or send the output elsewhere, e.g. > FILE on another disk",
                    file=err,
                    flush=True,
                )
        raise SystemExit(2) from None
    finally:
        sys.stdout, sys.stderr = out, err
