"""The compiled engine's entry, `run_chains`, cached on disk (`cache.py`; when it is loaded
or compiled: `loading.py`).

numba keys a cached function by its own bytecode and its own file's time stamp, not by
the functions it calls, so an edit to `kernel.py` alone would load a stale engine. The
closure over the sources' hash (`SOURCES`) puts every file compiled into it into the key.
This file is one of them: what does not run compiled lives elsewhere.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from identifiable.attention.lp import cache, crossover, kernel, lockstep, panels, state
from identifiable.attention.lp.lockstep import SINGULAR, borrowed

# every file whose code is compiled into `run_chains`
SOURCES = (lockstep.__file__, kernel.__file__, panels.__file__, state.__file__, __file__)


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


def _tiny() -> tuple:
    """The smallest problem `run_chains` takes (m = n = 1): compiling on it compiles the
    types every problem has."""
    m = n = 1
    ints = np.zeros(1, dtype=np.int64)
    prob = state.Problem(
        np.zeros((1, m, n)),
        np.zeros((1, n, m)),
        np.zeros((1, m)),
        np.ones((1, n), bool),
        np.zeros((2, m, panels.WIDTH), np.float32),
        np.zeros((n, m), np.float32),
    )
    shared = state.Shared(
        np.zeros((1, n)),
        np.zeros((1, n)),
        np.zeros((1, n), bool),
        np.zeros((1, n)),
        np.zeros(1),
        np.zeros((1, m), dtype=np.int64),
        ints.copy(),
        ints.copy(),
    )
    tasks = state.Tasks(ints[:0], ints[:0], ints.copy(), ints[:0], ints[:0], np.zeros((1, n), bool))
    certs = state.Certs(
        ints[:0], ints[:0], ints[:0], np.zeros((0, m), dtype=np.int64), np.zeros((0, m))
    )
    config = state.Config(1, 1, 0, 0, 1, 1, 1, 1e-6, 1)
    return prob, shared, state.new_slots(1, m, n), tasks, certs, state.new_counters(1), config


def call_tiny() -> None:
    """Call the engine's cached functions once (loading or compiling them)."""
    run_chains(*_tiny(), 1)
    prob = _tiny()[0]
    ints = np.zeros(1, dtype=np.int64)
    crossover._walker()(prob.a, np.ones((1, 1)), prob.allowed, ints.reshape(1, 1), ints[:0])
