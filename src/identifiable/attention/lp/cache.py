"""Where the compiled engine is cached on disk, and what happens when that cache cannot be
used: identifiable's own folder in the user's cache directory (never inside the installed
package, and not moved by NUMBA_CACHE_DIR, which stays numba's setting for other code).

- `folder()`: $IDENTIFIABLE_CACHE_DIR/engine, else $XDG_CACHE_HOME/identifiable/engine,
  else ~/.cache/identifiable/engine.
- `cached(fn)`: numba.njit(cache=True) into that folder; where it cannot be written, the
  engine compiles in memory for this process, after one warning line.
- `READY`: a marker written once a compile in that folder has been loaded back; while it
  is missing the cache is cold (`compiled.state`).
- `clear()`: the engine's files go, after a damaged cache failed to load.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

_warned: list[str] = []


def folder() -> Path:
    """The engine's cache folder (see the module docstring); not created here."""
    root = os.environ.get("IDENTIFIABLE_CACHE_DIR")
    if root:
        return Path(root).expanduser() / "engine"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "identifiable" / "engine"


def usable(path: Path) -> bool:
    """Whether the folder exists or can be made, and takes a file."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def warn_once(text: str) -> None:
    """One line on stderr, once per process for each text."""
    if text not in _warned:
        _warned.append(text)
        print(f"identifiable: {text}", file=sys.stderr, flush=True)


def cached(**options):
    """numba.njit(cache=True, **options) with the cache in `folder()`, or, where that
    cannot be written, without a disk cache (one warning line)."""
    import numba

    where = folder()
    if not usable(where):
        warn_once(f"the engine's cache folder {where} cannot be written; compiling in memory "
                  "for this process (set IDENTIFIABLE_CACHE_DIR to a writable folder)")  # fmt: skip
        return numba.njit(**options)

    def decorate(fn):
        kept = numba.config.CACHE_DIR
        numba.config.CACHE_DIR = str(where)  # read when the dispatcher picks its locator
        try:
            return numba.njit(cache=True, **options)(fn)
        finally:
            numba.config.CACHE_DIR = kept

    return decorate


def marker(stamp: str) -> Path:
    """The file that says a compile of sources `stamp` was written and loaded back."""
    import numba

    return folder() / f"ready-{stamp[:16]}-numba{numba.__version__}"


def clear() -> None:
    """Remove the engine's cache files (numba's index and data files, the markers), so
    that the next call compiles anew; files that cannot be removed are left."""
    for path in folder().rglob("*"):
        if path.is_file() and (path.suffix in (".nbi", ".nbc") or path.name.startswith("ready-")):
            with contextlib.suppress(OSError):
                path.unlink()
