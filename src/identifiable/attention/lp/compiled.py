"""The compiled engine's entry, `run_chains`, cached on disk (`cache.py`), and when it runs.

numba keys a cached function by its own bytecode and its own file's time stamp, not by
the functions it calls, so an edit to `kernel.py` alone would load a stale engine. The
closure over the sources' hash (`SOURCES`) puts every file compiled into it into the key.

A process never waits for a compile it did not ask for (`route`): where the cache is
warm it loads it (about a second); where it is cold, a background process compiles it
(`start_warming`, `warm.py`) while calls that HiGHS answers in a few seconds go to HiGHS,
and larger ones wait for the compile with a status line. A cache that fails to load
(damaged files) is cleared and rebuilt, after one warning line.
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

from identifiable.attention.lp import cache, crossover, kernel, lockstep, panels, state
from identifiable.attention.lp.lockstep import SINGULAR, borrowed
from identifiable.errors import IdentifiableError
from identifiable.utils.progress import status

# every file whose code is compiled into `run_chains`
SOURCES = (lockstep.__file__, kernel.__file__, panels.__file__, state.__file__, __file__)
# HiGHS answers while the engine compiles when it should take at most this long
# (`highs_seconds`); a larger problem waits for the compile
HIGHS_WHILE_COMPILING_S = 3.0
_WARMING_STALE_S = 900  # a compile marker older than this is taken as abandoned


def sources_hash() -> str:
    """sha256 of `SOURCES`: the cache key of `run_chains`."""
    digest = hashlib.sha256()
    for path in SOURCES:
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()


def _compile(stamp: str, borrow: bool = True):
    """`run_chains`, cached on disk (`cache.cached`; compile and load times:
    benchmarks/records/engine.md); borrow=False keeps numba's reference counts (the
    variant `EngineOptions.borrow` measures against)."""

    @cache.cached(nogil=True, error_model="numpy", fastmath=kernel.FASTMATH)
    def run_chains(prob, shared, slots, tasks, certs, counters, cfg, budget):
        """Run the chains of `tasks` in the lock step of `slots` for up to `budget` steps
        (arguments: `state.py`; counters is a `state.COUNTERS` array of one).

        Returns DONE (every chain finished), PAUSED (budget spent: call again), FALLBACK
        (some slots wait: the caller solves their LPs, see `lockstep.waiting`, and calls
        again) or SINGULAR (a basis matrix was singular).
        """
        if len(stamp) == 0:  # never: keeps the sources' hash in the cache key (above)
            return SINGULAR
        if borrow:  # a constant of the closure: numba compiles one branch
            prob, shared, slots = borrowed(prob), borrowed(shared), borrowed(slots)
            tasks, certs = borrowed(tasks), borrowed(certs)
        return lockstep.run_steps(prob, shared, slots, tasks, certs, counters, cfg, budget)

    return run_chains


STAMP = sources_hash()
run_chains = _compile(STAMP)
_COUNTED: list = []  # `run_chains` with reference counts, compiled on first use


def entry(borrow: bool):
    """`run_chains`, or its variant that keeps numba's reference counts."""
    if borrow:
        return run_chains
    if not _COUNTED:
        _COUNTED.append(_compile(STAMP, borrow=False))
    return _COUNTED[0]


_ready: list[bool] = []  # [True] once `run_chains` is compiled or loaded in this process


def _tiny() -> tuple:
    """The smallest problem `run_chains` takes (m = n = 1): compiling on it compiles the
    types every problem has."""
    m = n = 1
    ints = np.zeros(1, dtype=np.int64)
    prob = state.Problem(np.zeros((1, m, n)), np.zeros((1, n, m)), np.zeros((1, m)),
                         np.ones((1, n), bool), np.zeros((2, m, panels.WIDTH), np.float32),
                         np.zeros((n, m), np.float32))  # fmt: skip
    shared = state.Shared(np.zeros((1, n)), np.zeros((1, n)), np.zeros((1, n), bool),
                          np.zeros((1, n)), np.zeros(1), np.zeros((1, m), dtype=np.int64),
                          ints.copy(), ints.copy())  # fmt: skip
    tasks = state.Tasks(ints[:0], ints[:0], ints.copy(), ints[:0], ints[:0],
                        np.zeros((1, n), bool))  # fmt: skip
    certs = state.Certs(ints[:0], ints[:0], ints[:0], np.zeros((0, m), dtype=np.int64),
                        np.zeros((0, m)))  # fmt: skip
    config = state.Config(1, 1, 0, 0, 1, 1, 1, 1e-6, 1)
    return prob, shared, state.new_slots(1, m, n), tasks, certs, state.new_counters(1), config


def _call_tiny() -> None:
    run_chains(*_tiny(), 1)
    prob = _tiny()[0]
    ints = np.zeros(1, dtype=np.int64)
    crossover._walker()(prob.a, np.ones((1, 1)), prob.allowed, ints.reshape(1, 1), ints[:0])


def ensure_compiled(quiet: bool = False) -> None:
    """Load the engine from its disk cache, or compile it now (a status line on stderr
    while it compiles). A cache that fails to load is cleared and rebuilt after one
    warning line. Callers with a time budget call this first, so that the budget counts
    the work, not the compiler."""
    if _ready:
        return
    cold = not cache.marker(STAMP).exists()
    with status("compiling the interval engine (once; cached on disk)", enabled=cold and not quiet):
        try:
            _call_tiny()
        except Exception as err:  # numba's cache files could not be read back
            cache.warn_once(f"the engine's cache in {cache.folder()} could not be read "
                            f"({type(err).__name__}); rebuilding it")  # fmt: skip
            cache.clear()
            try:
                _call_tiny()
            except Exception as again:
                raise IdentifiableError(
                    f"the interval engine could not be compiled ({type(again).__name__}: "
                    f"{again}); bound with the HiGHS backend meanwhile"
                ) from None
    _mark_ready()
    _ready.append(True)


def _mark_ready() -> None:
    """Write the marker that says this cache loads (where the folder can be written)."""
    with contextlib.suppress(OSError):
        cache.marker(STAMP).touch()


def warm() -> bool:
    """Whether this process has the engine, or its disk cache holds it."""
    return bool(_ready) or cache.marker(STAMP).exists()


def warming_file() -> Path:
    return cache.folder() / f"compiling-{STAMP[:16]}"


def start_warming() -> None:
    """Start a background process that compiles the engine into its cache (once: a
    marker file says one is running)."""
    flag = warming_file()
    try:
        if flag.exists() and time.time() - flag.stat().st_mtime < _WARMING_STALE_S:
            return
        flag.parent.mkdir(parents=True, exist_ok=True)
        flag.write_text(str(os.getpid()))
    except OSError:
        return  # no cache folder to compile into: `ensure_compiled` compiles in memory
    subprocess.Popen([sys.executable, "-m", "identifiable.attention.lp.warm", "--quiet"],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip


def wait_for_warming(limit_s: float = 600.0) -> None:
    """Wait (with a status line) until the background compile has filled the cache, then
    load it; compile here if it has not after `limit_s` or if it died."""
    flag = warming_file()
    with status("compiling the interval engine in the background (once; cached on disk)"):
        t0 = time.time()
        while not cache.marker(STAMP).exists() and time.time() - t0 < limit_s:
            if not flag.exists():
                break
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
    where it is loaded or its cache is warm; on a cold cache a background compile starts,
    HiGHS answers a problem it can do in HIGHS_WHILE_COMPILING_S, and a larger one waits
    for the compile."""
    if warm():
        return "engine"
    start_warming()
    if highs_seconds(n_keys, m) <= HIGHS_WHILE_COMPILING_S:
        return "highs"
    wait_for_warming()
    return "engine"
