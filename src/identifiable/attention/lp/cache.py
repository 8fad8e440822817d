"""Where the compiled engine is cached on disk, and what happens when that cache cannot be
used: the folder "engine" of identifiable's user cache (`store.usercache`:
$IDENTIFIABLE_CACHE/engine, else $XDG_CACHE_HOME/identifiable/engine, else
~/.cache/identifiable/engine), never inside the installed package, and not moved by
NUMBA_CACHE_DIR, which stays numba's setting for other code.

- `folder()`: that folder, or None where it cannot be written (one warning line).
- `cached(fn)`: numba.njit(cache=True) into that folder; without one, the function
  compiles in memory for this process.
- `loads(call)`: the first call of cached functions; False (after one warning line, the
  folder's files cleared) where numba could not read them back.
- `marker(stamp)`: a file written once a compile in that folder has been loaded back;
  while it is missing the cache is cold (`loading.route`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path

from identifiable.errors import IdentifiableError
from identifiable.store.usercache import user_cache_dir

KIND = "engine"  # the engine's folder in the user cache
_warned: list[str] = []


def folder() -> Path | None:
    """The engine's cache folder, created; None (after one warning line) where it cannot
    be written."""
    try:
        return user_cache_dir(KIND)
    except IdentifiableError as err:
        warn_once(f"{err}; the interval engine compiles in memory for this process")
        return None


def warn_once(text: str) -> None:
    """One line on stderr, once per process for each text."""
    if text not in _warned:
        _warned.append(text)
        print(f"identifiable: {text}", file=sys.stderr, flush=True)


def cached(**options):
    """numba.njit(cache=True, **options) with the cache in `folder()`, or, where there is
    none, numba.njit(**options)."""
    import numba

    where = folder()
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


def loads(call: Callable[[], object]) -> bool:
    """Run `call`, the first call of functions `cached` compiled: numba loads them from the
    folder (or compiles them and writes them there). False where it could not read them
    back (damaged files: random bytes, an empty index): they are cleared, after one
    warning line, so that the next compile writes them anew."""
    try:
        call()
    except Exception as err:  # numba's unpickling of its index and data files
        warn_once(
            f"the engine's cache in {folder()} could not be read ({type(err).__name__}); "
            "rebuilding it"
        )
        clear()
        return False
    return True


def marker(stamp: str) -> Path | None:
    """The file that says a compile keyed `stamp` (`loading.marker_key`) was written and
    loaded back (None without a cache folder)."""
    import numba

    where = folder()
    return None if where is None else where / f"ready-{stamp[:16]}-numba{numba.__version__}"


def clear() -> None:
    """Remove the engine's cache files (numba's index and data files, the markers), so
    that the next call compiles anew; files that cannot be removed are left."""
    where = folder()
    for path in where.rglob("*") if where is not None else ():
        if path.is_file() and (path.suffix in (".nbi", ".nbc") or path.name.startswith("ready-")):
            with contextlib.suppress(OSError):
                path.unlink()
