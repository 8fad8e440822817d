"""The compiled engine's state, by name: what `lockstep.run_chains` is given and what each
simplex chain holds (numba compiles the named tuples and the record fields below into
plain loads and stores, as it did the positional tuples they replace).

A chain keeps one basis of P = {x ≥ 0 : A x = b_row} and walks through LP tasks (row,
key j, sense s: maximise s·x_j), each warm-started from the basis the previous task left
(docs/certified_attention.md). A lock step of C slots holds C chains; `Slots` holds
their arrays (each `[C, …]`), `Chain` one slot's views of them.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

# One chain's integers (a record per slot; field by field, see `Chain`).
STATE = np.dtype(
    [
        ("chain", np.int64),  # the chain in this slot
        ("ptr", np.int64),  # its next task
        ("row", np.int64),  # the row of its current task
        ("brow", np.int64),  # the row whose b gives x_B (≠ row while catching up)
        ("j", np.int64),  # the objective's key (−1: no task left)
        ("s", np.int64),  # the objective's sense (+1 max, −1 min)
        ("fresh", np.int64),  # d is the current objective's (else `fresh_d`)
        ("steps", np.int64),  # pivots in this LP
        ("degen", np.int64),  # consecutive degenerate pivots (Bland's rule past 2m)
        ("since", np.int64),  # pivots since the last refactor of B⁻¹
        ("wait", np.int64),  # 1: the LP goes to HiGHS
        ("restart", np.int64),  # 1: it came back; start clean on the next task
        ("mode", np.int64),  # this step's pivot: 0 none, 1 primal, 2 dual
        ("enter", np.int64),  # this step's entering key
        ("leave", np.int64),  # this step's leaving basis row
        ("zrow", np.int64),  # the chain's first row in the step's shared product
        ("drift", np.int64),  # updates of d from single-precision products since fresh
        ("span", np.int64),  # keys below span are the row's (row order; key order: n)
    ]
)

# The slots' arrays (`new_slots`); a `Chain` has the same fields, one slot's row of each:
# basis `[m]` keys in basis order; pos `[n]` each key's basis row (−1: non-basic);
# blocked `[n]` keys that may not enter (basic, or outside the row's key set); binv
# `[m, m]` B⁻¹; xb `[m]` x_B; d `[n]` reduced costs of the objective (0 at basic keys);
# gamma `[n]` steepest-edge weights 1 + ‖B⁻¹A_k‖²; state the `STATE` record; scratch:
# prow `[m]` the new row r of B⁻¹ (a pivot's first half), v `[m]` B⁻ᵀα_q (steepest
# edge), col `[m]` the entering column B⁻¹A_q, ratios `[m]` the primal ratios, rho `[n]`
# the pivot's new tableau row, av `[n]` Aᵀv, scores `[n]` the scores of the entering
# key's choice (primal d²/γ, dual ratios), trow `[n]` a tableau row computed for this
# chain (the dual pivot row of a row with its own A, refined reduced costs, γ's rows at
# a refactor), xr, yr `[m]` refined x_B and e_pᵀB⁻¹, rx, ry `[m]` their residuals.
Slots = namedtuple(
    "Slots",
    "basis pos blocked binv xb d gamma state prow v col ratios rho av scores trow xr yr rx ry",
)
Chain = namedtuple(
    "Chain",
    "basis pos blocked binv xb d gamma state prow v col ratios rho av scores trow xr yr rx ry",
)

# A (`[1 or R, m, n]`), Aᵀ (`[1 or R, n, m]`), b `[R, m]`, allowed `[R, n]`, A in single
# precision in panels `[P or 0, m, 16]` (`panels.pack`) and as Aᵀ `[n or 0, m]` (for BLAS).
Problem = namedtuple("Problem", "a at b allowed a32 at32")
# What the chains share: bounds lower, upper, what visited points prove zero_seen,
# seen_max `[R, n]`, Σa total `[R]`, a feasible basis per row start `[R, m]`, and the
# counts solved, pivots `[R]`.
Shared = namedtuple("Shared", "lower upper zero_seen seen_max total start solved pivots")
# Per chain its first row, sense `[N]` and task offsets `[N + 1]`; per task its row and
# key `[T]`; per row the open keys of row order's pool `[R, n]`.
Tasks = namedtuple("Tasks", "first_row sense offsets rows keys pool")
# The certificates kept: row, key, sense `[V]`, final basis and x_B `[V, m]`.
Certs = namedtuple("Certs", "rows keys senses bases values")
# One record: certificates kept, LPs settled, every how many LPs one is kept, the next
# chain to start.
COUNTERS = np.dtype(
    [("kept", np.int64), ("settled", np.int64), ("stride", np.int64), ("next_chain", np.int64)]
)
# The settings (`EngineOptions`): the pivot cap per LP, pivots between refactors,
# steepest-edge pricing (else Dantzig's), row order's pool rule (0: key order), certify
# on refined values, the span from which the shared second product is single precision,
# d's updates in single precision before it is recomputed, the gain under which it is,
# and whether the single-precision product takes the packed A (`panels`) or BLAS.
Config = namedtuple("Config", "cap refactor steep pool refine single drift_steps drift_gain packed")
# A lock step's buffers: an [m, m] work matrix, the shared products' left factors y1
# `[C, m]`, y2 `[2C, m]` (and y2s in single precision, whole tiles), their outputs.
Buffers = namedtuple("Buffers", "work y1 y2 y2s z z32")


def new_slots(n_slots: int, m: int, n: int) -> Slots:
    """Empty chain states for `n_slots` slots of a lock step of m constraints, n keys."""
    state = np.zeros(n_slots, dtype=STATE)
    state["j"] = -1  # empty: takes the next chain
    state["span"] = n  # every key, until `_load` gives a row-order chain its own
    ints = lambda *shape: np.zeros((n_slots, *shape), dtype=np.int64)  # noqa: E731
    vm = lambda: np.zeros((n_slots, m))  # noqa: E731
    vn = lambda: np.zeros((n_slots, n))  # noqa: E731
    return Slots(
        ints(m),
        np.full((n_slots, n), -1, dtype=np.int64),
        np.ones((n_slots, n), dtype=bool),
        np.zeros((n_slots, m, m)),
        vm(),
        vn(),
        np.ones((n_slots, n)),
        state,
        vm(),
        vm(),
        vm(),
        vm(),
        vn(),
        vn(),
        vn(),
        vn(),
        vm(),
        vm(),
        vm(),
        vm(),
    )


def new_counters(stride: int) -> np.ndarray:
    counters = np.zeros(1, dtype=COUNTERS)
    counters["stride"] = stride
    return counters


def chain(slots: Slots, c: int) -> Chain:
    """Slot c's `Chain` from Python (its state a record that writes through to slots)."""
    return Chain(*(getattr(slots, field)[c] for field in Slots._fields))
