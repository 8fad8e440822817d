"""Compiled (numba) functions cached on disk in identifiable's user cache (`usercache`), one
folder per kind ("engine" for the interval engine, "posterior" for the billiard walk),
never inside the installed package and not moved by NUMBA_CACHE_DIR, which stays numba's
setting for other code.

- `folder(kind)`: that folder, or None where it cannot be written (one warning line).
- `cached(kind, **options)`: numba.njit(cache=True) into that folder; without one, the
  function compiles in memory for this process.
- `loads(kind, call)`: the first call of cached functions; False (after one warning line,
  the folder's files cleared) where numba could not read them back.
- `marker(kind, what, stamp)`: a file that says a compile keyed `stamp` loads back.
- `clear(kind)`: remove numba's files (and the "ready-" markers) from the folder.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path

from identifiable.errors import IdentifiableError
from identifiable.store.usercache import user_cache_dir

_warned: list[str] = []


def folder(kind: str, what: str) -> Path | None:
    """The folder of `kind`, created; None (after one warning line saying that `what`
    compiles in memory) where it cannot be written."""
    try:
        return user_cache_dir(kind)
    except IdentifiableError as err:
        warn_once(f"{err}; {what} compiles in memory for this process")
        return None


def available() -> bool:
    """Whether compiled code can run here (numba imports)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def marker(kind: str, what: str, stamp: str) -> Path | None:
    """The file that says a compile keyed `stamp` was written to the folder of `kind` and
    loaded back (None without a cache folder)."""
    import numba

    where = folder(kind, what)
    return None if where is None else where / f"ready-{stamp[:16]}-numba{numba.__version__}"


def warn_once(text: str) -> None:
    """One line on stderr, once per process for each text."""
    if text not in _warned:
        _warned.append(text)
        print(f"identifiable: {text}", file=sys.stderr, flush=True)


def cached(kind: str, what: str, **options):
    """numba.njit(cache=True, **options) with the cache in `folder(kind)`, or, where there
    is none, numba.njit(**options)."""
    import numba

    where = folder(kind, what)
    if where is None:
        return numba.njit(**options)

    def decorate(fn):
        kept = numba.config.CACHE_DIR
        numba.config.CACHE_DIR = str(where)  # read when the dispatcher picks its locator
        try:
            return numba.njit(cache=True, **options)(fn)
        finally:
            numba.config.CACHE_DIR = kept

    return decorate


def loads(kind: str, what: str, call: Callable[[], object]) -> bool:
    """Run `call`, the first call of functions `cached` compiled: numba loads them from the
    folder (or compiles them and writes them there). False where it could not read them
    back (damaged files: random bytes, an empty index): they are cleared, after one
    warning line, so that the next compile writes them anew."""
    try:
        call()
    except Exception as err:  # numba's unpickling of its index and data files
        warn_once(
            f"the cache of {what} in {folder(kind, what)} could not be read "
            f"({type(err).__name__}); rebuilding it"
        )
        clear(kind, what)
        return False
    return True


def clear(kind: str, what: str) -> None:
    """Remove the folder's cache files (numba's index and data files, the markers), so
    that the next call compiles anew; files that cannot be removed are left."""
    where = folder(kind, what)
    for path in where.rglob("*") if where is not None else ():
        if path.is_file() and (path.suffix in (".nbi", ".nbc") or path.name.startswith("ready-")):
            with contextlib.suppress(OSError):
                path.unlink()
