"""Where identifiable may write a folder: the rules every output and cache folder shares.

Nothing here follows a symbolic link (`lstat` throughout), and nothing writes except the
probe of `probe_writable`, a temporary file removed at once.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from identifiable.errors import IdentifiableError


def is_link(path: Path) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def exists(path: Path) -> bool:
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def refused_location(out: Path) -> str | None:
    resolved = Path(os.path.realpath(out))
    if resolved == Path(resolved.anchor):
        return "the filesystem root"
    with contextlib.suppress(RuntimeError, KeyError):
        if resolved == Path(os.path.realpath(Path.home())):
            return "your home directory"
    cwd = Path(os.path.realpath(Path.cwd()))
    if resolved == cwd:
        return "the current directory"
    if resolved in cwd.parents:
        return "an ancestor of the current directory"
    return None


def probe(folder: Path) -> None:
    """Create and remove a temporary file in `folder`; raises the OSError if it cannot be
    written (`os.access` says yes for root on a read-only filesystem or /proc)."""
    import tempfile

    fd, path = tempfile.mkstemp(prefix=".identifiable-probe-", dir=folder)
    os.close(fd)
    os.unlink(path)


def probe_writable(folder: Path, option: str) -> None:
    """Refuse, before any work, a folder that could not be created or written: its nearest
    existing ancestor must be a folder that takes a file (`probe`)."""
    where = Path(os.path.abspath(folder))
    while not exists(where) and where != where.parent:
        where = where.parent
    if not is_real_dir(where):
        what = "a symbolic link" if is_link(where) else "a file"
        raise IdentifiableError(
            f"{option} {folder}: {where} is {what}, not a folder; choose another {option}"
        )
    try:
        probe(where)
    except OSError as err:
        raise IdentifiableError(
            f"{option} {folder} cannot be written ({err.strerror or err} in {where}); "
            f"choose another {option}"
        ) from None


def check_place(folder: Path, option: str, what: str) -> None:
    """The places rule of every folder we write (`what`: "an output folder", "a cache"):
    not /, HOME, the current folder or one of its ancestors, a symbolic link or a file."""
    refused = refused_location(folder)
    if refused:
        raise IdentifiableError(
            f"{option} {folder} is {refused}; {what} must be a folder of its own"
        )
    if is_link(folder):
        raise IdentifiableError(
            f"{option} {folder} is a symbolic link; pass the folder it points to "
            f"({os.path.realpath(folder)}) or another {option}"
        )
    if exists(folder) and not is_real_dir(folder):
        raise IdentifiableError(f"{option} {folder} is a file; give a folder")
