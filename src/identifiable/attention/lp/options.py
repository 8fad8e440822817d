"""The one entry's arguments: the problem (`BoundProblem`) and every setting of the engine
(`EngineOptions`), each tuning constant with a one-line reason; the measurements behind
them are in benchmarks/records/engine.md."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

_LLC_PATH = "/sys/devices/system/cpu/cpu0/cache"
_LLC_DEFAULT = 8 << 20  # where the cache cannot be read: a batch of 2 MB (see `batch_bytes`)


class OutOfTime(Exception):
    """Raised by the backends when their deadline (wall clock, `time.time()`) has passed."""


@dataclass(frozen=True)
class BoundProblem:
    """Rows whose key bounds are asked for: the polytope P_r = {x ≥ 0 : A_r x = A_r a_r}
    of each row r over its key set (docs/certified_attention.md).

    Attributes:
        aq: `[R, m, n]` (or `[1, m, n]`, shared by all rows) A = Qᵀ per row, Q an
            orthonormal basis of col([T, 1]) over the row's keys (rows of equal m; columns
            of keys outside the key set are 0 unless the rows share A).
        raw: `[R, n]` raw weights a, 0 outside the key set.
        allowed: `[R, n]` bool, each row's key set.
        movable: `[R, n]` bool, the keys whose bounds take an LP (the others keep a_j).
        what: names the rows in messages (e.g. "layer 2, head 3").
    """

    aq: np.ndarray
    raw: np.ndarray
    allowed: np.ndarray
    movable: np.ndarray
    what: str = ""

    @property
    def shared(self) -> bool:
        """Whether all rows share one A."""
        return self.aq.shape[0] == 1


def llc_bytes(path: str = _LLC_PATH) -> int:
    """The size of cpu0's last-level cache (sysfs `indexN/size`, e.g. "32768K"), or
    `_LLC_DEFAULT` where it cannot be read. (glibc's sysconf can report the whole
    package's L3 on a virtual machine, 384 MB against the 32 MB its cores share.)"""
    best = 0
    try:
        for entry in os.listdir(path):
            if not entry.startswith("index"):
                continue
            with open(os.path.join(path, entry, "size")) as fh:
                text = fh.read().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * scale)
    except (OSError, ValueError):
        return _LLC_DEFAULT
    return best or _LLC_DEFAULT


def batch_bytes(llc: int) -> int:
    """B⁻¹ bytes of one lock step for a last-level cache of `llc` bytes: a quarter of it,
    2–8 MB (each pivot reads its chain's B⁻¹ twice; past the cache those passes slow)."""
    return min(8 << 20, max(2 << 20, llc // 4))


@dataclass(frozen=True)
class EngineOptions:
    """How `bound_keys` works; the defaults are what benchmarks/records/engine.md measured.

    Attributes:
        backend: "auto" (the compiled engine where it is ready, else HiGHS), "engine"
            (the compiled lock step) or "highs" (one HiGHS model per row, `hot`).
        threads: lock steps (HiGHS: models) run in up to this many threads.
        order: "auto", "key" or "row": how LPs are laid out as chains (`bound_keys`).
        chains_per_row: row order: chains per row, all in the lock step.
        block: key order: rows per chain (None: all rows in one chain).
        keep_vertices: return the vertex that settled each bound (witnesses).
        verify: "sample" (`verify_sample` LPs of each group), "all" or "off": the
            independent check (`verify`) of the bounds and those LPs' final bases.
        verify_sample: LPs of each lock-step group that verify="sample" checks.
        deadline: a wall-clock time (`time.time()`); past it, `OutOfTime`.
        refactor_every, refactor_per_m: pivots between fresh factorisations of B⁻¹,
            max(refactor_every, refactor_per_m · m); only the drift that steers pivots
            depends on it (every optimum is certified on refined values).
        pivots_per_lp, pivots_per_m: an LP still open after max(pivots_per_lp,
            pivots_per_m · m) pivots goes to HiGHS (primal pivots grow with m).
        min_block: key order, minima: rows per chain (few minima are left, often one
            key over many rows: short chains keep the lock step busy).
        single_min_keys: the shared second product (ρ and Aᵀv: they steer, never bound)
            runs in single precision from this many keys on (A packed once, `panels`).
        drift_steps, drift_gain: d, updated from single-precision products (round-off ~1e-7
            of ‖ρ‖), is recomputed in double after drift_steps updates and whenever the
            best key gains less than drift_gain, so that round-off neither ends an LP nor
            steers more than a few pivots.
        steps_per_call: lock steps between checks of the deadline.
        thread_chains: chains per thread at least (fewer make the products too small).
        thread_copy_bytes: the threads' own copies of what visited points prove, in all.
        pool_rule: row order: a chain's next key is the open key basic at its vertex
            (1) or the lowest open key (2).
        refine: certify optima on refined values (else refactor at every optimum).
        chain_bytes: B⁻¹ bytes of one lock step (None: from the last-level cache,
            `batch_bytes`); a thread's group gets half of it.
        packed_product: the single-precision product takes A packed once in panels
            (`panels`, a register-tiled kernel) rather than BLAS's sgemm.
        borrow: the compiled lock step drops numba's reference counts on the arrays it
            is given for the call (`lockstep.borrowed`) rather than keeping them.
    """

    backend: str = "auto"
    threads: int = 1
    order: str = "auto"
    chains_per_row: int = 1
    block: int | None = None
    keep_vertices: bool = False
    verify: str = "sample"
    verify_sample: int = 8
    deadline: float | None = None
    refactor_every: int = 25
    refactor_per_m: int = 16
    pivots_per_lp: int = 400
    pivots_per_m: int = 8
    min_block: int = 16
    single_min_keys: int = 128
    drift_steps: int = 32
    drift_gain: float = 1e-6
    steps_per_call: int = 16
    thread_chains: int = 8
    thread_copy_bytes: int = 2**28
    pool_rule: int = 1
    refine: bool = True
    chain_bytes: int | None = None
    packed_product: bool = True
    borrow: bool = True

    def __post_init__(self) -> None:
        choices = {
            "backend": ("auto", "engine", "highs"),
            "order": ("auto", "key", "row"),
            "verify": ("sample", "all", "off"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, not {getattr(self, name)!r}")

    def batch(self, groups: int) -> int:
        """B⁻¹ bytes of the lock step of one of `groups` thread groups."""
        whole = self.chain_bytes or batch_bytes(llc_bytes())
        return whole if groups == 1 else whole // 2
