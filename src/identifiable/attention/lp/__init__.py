"""The certificate engine: min and max of each key's weight over the polytope of valid
attention rows, every bound certified (docs/certified_attention.md).

One entry, `bound_keys(problem, options) -> IntervalSolution`, with the problem and every
setting of the engine in two frozen records (`BoundProblem`, `EngineOptions`). Behind it
are the compiled lock step (numba: `solve`, `groups`, `lockstep`, `kernel`, `panels`,
`crossover`) and the HiGHS backend (`hot`); every result passes the independent check of
`verify` (`failures`). Nothing outside this package imports its modules
(tests/house/test_layering.py): they are free to change behind this interface.
"""

from pathlib import Path

from identifiable.attention.lp.highs import polish, solve_lp
from identifiable.attention.lp.options import (
    BoundProblem,
    EngineOptions,
    OutOfTime,
    batch_bytes,
    llc_bytes,
)
from identifiable.attention.lp.solve import OPT_TOL, IntervalSolution, bound_keys, engine_available
from identifiable.attention.lp.verify import (
    Certificates,
    Tolerances,
    failures,
    outer_failures,
    vertex,
)


def cache_folder() -> Path | None:
    """The compiled engine's folder in the user cache (`store.usercache`), or None where it
    cannot be written (the engine then compiles in memory)."""
    from identifiable.attention.lp import cache

    return cache.folder()


def ensure_compiled() -> None:
    """Compile (or load from the disk cache) the compiled engine now, with a status line
    when it compiles; callers with a time budget call this first."""
    from identifiable.attention.lp import loading

    loading.ensure_compiled()


__all__ = [
    "OPT_TOL",
    "BoundProblem",
    "Certificates",
    "EngineOptions",
    "IntervalSolution",
    "OutOfTime",
    "Tolerances",
    "batch_bytes",
    "bound_keys",
    "cache_folder",
    "engine_available",
    "ensure_compiled",
    "failures",
    "llc_bytes",
    "outer_failures",
    "polish",
    "solve_lp",
    "vertex",
]
