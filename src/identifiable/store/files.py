"""Atomic output files: every file appears whole or not at all.

A run killed mid-write, or a full disk, must never leave a half-written
`index.html` (or table, or figure) that looks finished. Each writer renders the
bytes in memory, writes them to a hidden temporary file in the target folder,
fsyncs, then `os.replace`s it over the target (atomic on POSIX within one
filesystem). Any OS error becomes an `IdentifiableError` that says what to do.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import hashlib
import io
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from identifiable.errors import IdentifiableError

if TYPE_CHECKING:
    import pandas as pd

_CHUNK = 1 << 20


def _file_mode() -> int:
    """0o666 less the process umask: what a plain open() would give (mkstemp uses 0o600)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _raw_write(fd: int, data: memoryview) -> int:
    """One `write(2)`; a seam so tests can simulate a full disk."""
    return os.write(fd, data)


# What a disk-full message advises: a resumable run (`OutputFolder.run`) says --resume,
# every other writer just "rerun the same command" (view, trace, tokens have no --resume).
_RETRY: contextvars.ContextVar[str] = contextvars.ContextVar(
    "identifiable_retry", default="rerun the same command"
)


@contextlib.contextmanager
def retry_advice(text: str) -> Iterator[None]:
    """Within the block, a full disk's message ends with `text` (what to rerun)."""
    token = _RETRY.set(text)
    try:
        yield
    finally:
        _RETRY.reset(token)


# mkstemp(prefix=".NAME.", suffix=".tmp"): a dot, the target's name, 8 random characters
_TEMPORARY = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")


def is_temporary(name: str) -> bool:
    """Whether a file name is one of our temporary files (`.index.html.k3j_9xq2.tmp`)."""
    return bool(_TEMPORARY.match(name))


def remove_temporaries(root: Path) -> list[Path]:
    """Delete the temporary files a killed writer left under `root` (a folder of ours: the
    work folder of a run, before its manifest); links are never followed."""
    removed = []
    for dirpath, _dirs, filenames in os.walk(root, followlinks=False):
        for name in filenames:
            path = Path(dirpath) / name
            if is_temporary(name) and not path.is_symlink():
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def _explain(err: OSError, path: Path, hint: str = "choose another --out") -> IdentifiableError:
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return IdentifiableError(
            f"disk full while writing {path}: free some space, then {_RETRY.get()}"
        )
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return IdentifiableError(f"cannot write {path}: permission denied; {hint}")
    if err.errno == errno.ENOENT:
        return IdentifiableError(f"cannot write {path}: its folder does not exist; {hint}")
    return IdentifiableError(f"cannot write {path}: {err.strerror or err}")


def atomic_write_with(
    path: str | Path,
    write: Callable[[int, Path], None],
    *,
    parents: bool = True,
    hint: str = "choose another --out",
) -> Path:
    """The one atomic writer: `write(fd, temporary)` fills a temporary file beside `path`,
    which is then fsynced and renamed over `path`.

    `write` may write through the open descriptor `fd` or reopen `temporary` by name (a
    library that only saves to a path, such as safetensors). On any error the temporary
    file is removed; an OS error becomes one line (disk full, permission, missing folder).
    `parents=False` refuses a missing folder instead of creating it (a user's file path);
    `hint` ends the one-line error with what to do.
    """
    path = Path(path)
    try:
        if parents:
            path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise _explain(err, path, hint) from None
    try:
        try:
            os.fchmod(fd, _file_mode())
            write(fd, Path(tmp))
        finally:
            os.close(fd)
        synced = os.open(tmp, os.O_RDONLY)  # the file `write` left at that name
        try:
            os.fsync(synced)
        finally:
            os.close(synced)
        os.replace(tmp, path)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise _explain(err, path, hint) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_bytes(
    path: str | Path, data: bytes, *, parents: bool = True, hint: str = "choose another --out"
) -> Path:
    """Write `data` to `path` atomically (see `atomic_write_with`)."""

    def write(fd: int, _tmp: Path) -> None:
        view = memoryview(data)
        while view:
            written = _raw_write(fd, view[:_CHUNK])
            view = view[written:]

    return atomic_write_with(path, write, parents=parents, hint=hint)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """UTF-8 text version of `atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def table_bytes(df: pd.DataFrame) -> tuple[bytes, bytes]:
    """(CSV, Parquet) encodings of a table, rendered in memory."""
    csv = df.to_csv(index=False, float_format="%.6g").encode("utf-8")
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return csv, buf.getvalue()


def write_table(df: pd.DataFrame, stem: str | Path) -> list[Path]:
    """Write `stem.csv` and `stem.parquet`; returns the two paths."""
    stem = Path(stem)
    csv, parquet = table_bytes(df)
    return [
        atomic_write_bytes(stem.with_suffix(".csv"), csv),
        atomic_write_bytes(stem.with_suffix(".parquet"), parquet),
    ]
