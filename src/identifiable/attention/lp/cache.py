"""Where the compiled engine is cached on disk, and what happens when that cache cannot be
used: the folder "engine" of identifiable's user cache ($IDENTIFIABLE_CACHE/engine, else
$XDG_CACHE_HOME/identifiable/engine, else ~/.cache/identifiable/engine), by the one
mechanism of `store.jitcache`.

- `folder()`: that folder, or None where it cannot be written (one warning line).
- `cached(fn)`: numba.njit(cache=True) into that folder; without one, the function
  compiles in memory for this process.
- `loads(call)`: the first call of cached functions; False (after one warning line, the
  folder's files cleared) where numba could not read them back.
- `marker(stamp)`: a file written once a compile in that folder has been loaded back;
  while it is missing the cache is cold (`loading.route`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from identifiable.store import jitcache

KIND = "engine"  # the engine's folder in the user cache
WHAT = "the interval engine"


def folder() -> Path | None:
    """The engine's cache folder, created; None (after one warning line) where it cannot
    be written."""
    return jitcache.folder(KIND, WHAT)


def cached(**options):
    """numba.njit(cache=True, **options) with the cache in `folder()`, or, where there is
    none, numba.njit(**options)."""
    return jitcache.cached(KIND, WHAT, **options)


def loads(call: Callable[[], object]) -> bool:
    """`jitcache.loads` for the engine's folder."""
    return jitcache.loads(KIND, WHAT, call)


def marker(stamp: str) -> Path | None:
    """The file that says a compile keyed `stamp` (`loading.marker_key`) was written and
    loaded back (None without a cache folder)."""
    return jitcache.marker(KIND, WHAT, stamp)


def clear() -> None:
    """Remove the engine's cache files (numba's index and data files, the markers)."""
    jitcache.clear(KIND, WHAT)
