"""The compiled engine in this process: loaded from its disk cache (`cache.py`), or
compiled, and on first use the route while it compiles.

A process never waits for a compile it did not ask for (`route`): where the cache holds
the engine it loads it (about a second); where it is cold or damaged, a background
process compiles it (`start_warming`, `warm.py`) while calls that HiGHS answers in a few
seconds go to HiGHS, and larger ones wait for the compile with a status line. A cache
that fails to load (damaged files) is cleared and rebuilt, after one warning line.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from identifiable.attention.lp import cache, compiled, crossover
from identifiable.attention.lp.compiled import STAMP, call_tiny
from identifiable.errors import IdentifiableError
from identifiable.utils.progress import status

# HiGHS answers while the engine compiles when it should take at most this long
# (`highs_seconds`); a larger problem waits for the compile
HIGHS_WHILE_COMPILING_S = 3.0
_WARMING_STALE_S = 900  # a compile flag older than this is taken as abandoned
_warmers: list[subprocess.Popen] = []  # the background compiles this process started
_ready: list[bool] = []  # [True] once the engine is compiled or loaded in this process


def ensure_compiled(quiet: bool = False) -> None:
    """Load the engine from its disk cache, or compile it now (a status line on stderr
    while it compiles). A cache that fails to load is cleared and rebuilt after one
    warning line. Callers with a time budget call this first, so that the budget counts
    the work, not the compiler."""
    if _ready:
        return
    if not (_marked() and cache.loads(call_tiny)):
        with status("compiling the interval engine (once; cached on disk)", enabled=not quiet):
            if not cache.loads(call_tiny):  # damaged files without a marker: cleared
                _compile_or_refuse()
    _loaded()


def _compile_or_refuse() -> None:
    try:
        call_tiny()
    except Exception as err:
        raise IdentifiableError(
            f"the interval engine could not be compiled ({type(err).__name__}: {err}); "
            "bound with the HiGHS backend meanwhile"
        ) from None


def marker_key() -> str:
    """The marker's key: the sources' hash, and the time stamp and size of the two files
    whose functions numba caches, which key its index (a reinstall that keeps the sources
    but not their time stamps makes numba compile anew: the cache counts as cold)."""
    files = (compiled.__file__, crossover.__file__)
    stamps = [f"{os.stat(f).st_mtime}:{os.stat(f).st_size}" for f in files]
    return hashlib.sha256("|".join([STAMP, *stamps]).encode()).hexdigest()


def _marked() -> bool:
    """Whether the cache folder's marker says it holds this engine."""
    mark = cache.marker(marker_key())
    return mark is not None and mark.exists()


def _loaded() -> None:
    """The engine is in this process; the marker says its cache loads (where the folder
    can be written)."""
    mark = cache.marker(marker_key())
    if mark is not None:
        with contextlib.suppress(OSError):
            mark.touch()
    _ready.append(True)


def warming_file() -> Path | None:
    """The file that says a background compile of this engine runs (its process id)."""
    where = cache.folder()
    return None if where is None else where / f"compiling-{STAMP[:16]}"


def start_warming() -> None:
    """Start a background process that compiles the engine into its cache, unless one
    runs (`warming`); the flag file holds its process id."""
    flag = warming_file()
    if flag is None or warming():
        return  # no cache folder to compile into: `ensure_compiled` compiles in memory
    try:
        flag.write_text(str(os.getpid()))  # taken before the process starts
    except OSError:
        return
    warmer = subprocess.Popen(
        [sys.executable, "-m", "identifiable.attention.lp.warm", "--quiet"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    _warmers.append(warmer)
    with contextlib.suppress(OSError):
        flag.write_text(str(warmer.pid))


def warming() -> bool:
    """Whether a background compile of this engine runs: the flag file's process is alive
    (a flag older than _WARMING_STALE_S, or left by a process that died, is not)."""
    flag = warming_file()
    if flag is None:
        return False
    try:
        pid, age = int(flag.read_text()), time.time() - flag.stat().st_mtime
    except (OSError, ValueError):
        return False
    for warmer in _warmers:  # this process's own: poll, so that a finished one is reaped
        if warmer.pid == pid:
            return warmer.poll() is None
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except OSError:
        pass  # another user's process: it exists
    return age < _WARMING_STALE_S


def wait_for_warming(limit_s: float = 600.0) -> None:
    """Wait (with a status line) until the background compile has filled the cache, then
    load it; compile here if it has not after `limit_s` or if it died."""
    with status("compiling the interval engine in the background (once; cached on disk)"):
        t0 = time.time()
        while not _marked() and warming() and time.time() - t0 < limit_s:
            time.sleep(0.25)
    ensure_compiled()


def highs_seconds(n_keys: np.ndarray, m: int) -> float:
    """HiGHS's time for rows of n_keys keys each (m constraints), from the side-by-side
    figures (benchmarks/records/engine.md): about 2k LPs a row of k keys, each about
    1.5e-6 s per m·k."""
    k = np.asarray(n_keys, dtype=np.float64)
    return float((2.0 * k * m * k).sum() * 1.5e-6)


def route(n_keys: np.ndarray, m: int) -> str:
    """ "engine" or "highs" for a problem of rows with n_keys movable keys: the engine
    where it is loaded or its cache loads; on a cold or damaged cache a background compile
    starts, HiGHS answers a problem it can do in HIGHS_WHILE_COMPILING_S, and a larger one
    waits for the compile."""
    if _ready:
        return "engine"
    if _marked() and cache.loads(call_tiny):
        _loaded()
        return "engine"
    start_warming()
    if highs_seconds(n_keys, m) <= HIGHS_WHILE_COMPILING_S:
        return "highs"
    wait_for_warming()
    return "engine"
