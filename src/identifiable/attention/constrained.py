"""Constrained effective attention: the valid attention row closest to a reference.

The paper's effective attention removes from a row a its component in the left
null space LN(T): a_eff = a Q_T Q_Tᵀ, the minimum-norm row with the same head
output. It can be negative and need not sum to 1, so it is not an attention row.
The constrained variant keeps the simplex: over the polytope of valid rows

    P = {x ≥ 0 : (x − a) Q = 0}   (Q an orthonormal basis of col([T, 1])),

it picks the one closest to a reference r. It is a distribution by construction.

References (names accepted by `constrained_attention`):
- "uniform": min ‖x − 1/s‖₂ over P, i.e. the minimum-norm valid row (Σx is fixed,
  so ‖x − 1/s‖² = ‖x‖² − 1/s): the constrained counterpart of the paper's A_eff,
  which is the minimum-norm row with the same output when x ≥ 0 is dropped.
- "entropy": the valid row of maximum entropy (closest to uniform in KL).
The raw row a is its own closest point (a ∈ P), so "raw" is not a useful reference.
Nor is the paper's a_eff, nor any r ∈ col([T, 1]): for x ∈ P, x − a ⟂ col(Q), so
‖x − r‖² = ‖Q Qᵀ a − r‖² + ‖(I − Q Qᵀ) x‖², and every such r gives the same
minimiser as the uniform row (1 ∈ col(Q)). "uniform" is therefore also the valid
row closest to the paper's effective attention.

Solvers (exact methods, proved here):

Projection (`project_onto_rows`). Parametrise P from the raw row a ∈ P:
x = a + N z with N an orthonormal basis of A's null space (A = Qᵀ), so A x = b
always and ‖x − r‖² = ‖QQᵀ(a − r)‖² + ‖z − z₀‖² with z₀ = Nᵀ(r − a). The problem
is the projection of z₀ onto the polyhedron {z : N_i z ≥ −a_i for every key i},
with z = 0 feasible. We run the primal active-set method for convex QP (Nocedal &
Wright, Numerical Optimization, alg. 16.3) from z = 0: on the working set W of
keys held at 0, step towards the projection of z₀ onto {N_W p = 0}; a key that
would turn negative blocks the step and joins W; at the sub-problem's optimum
the multipliers λ of z − z₀ = N_Wᵀ λ are checked and the most negative leaves W.
A blocking key i has N_i p < −1e-9‖p‖ while N_W p = 0, so N_i is independent of the
rows of W: the working rows stay independent and the multipliers are unique (keys
whose slope is round-off do not block; they may end at −1e-9, then clipped). With a
strictly convex objective the method ends, in finitely many steps, at the KKT
point (all λ ≥ 0), which is the unique minimiser. The answer is accepted when
x ≥ −1e-9 (then clipped at 0) and ‖A x − b‖ ≤ 1e-10.

Maximum entropy (`max_entropy_row`). max −Σ x log x s.t. A x = b: stationarity
gives log x = Aᵀy (the constant is absorbed since 1 ∈ col(Q)), so x = exp(Aᵀy) > 0
and y minimises the convex φ(y) = Σ exp(Aᵀy) − bᵀy (gradient A x − b, Hessian
A diag(x) Aᵀ). Damped Newton from the uniform row; accepted when ‖A x − b‖ ≤ 1e-10.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from identifiable.attention.checks import check_trace
from identifiable.attention.lp import OutOfTime
from identifiable.errors import IdentifiableError, seconds
from identifiable.models.trace import Trace
from identifiable.results import Result
from identifiable.utils.checks import indices

REFERENCES: tuple[str, ...] = ("uniform", "entropy")
_TOL = 1e-10


def project_onto_rows(
    aq: np.ndarray,
    b: np.ndarray,
    r: np.ndarray,
    a: np.ndarray | None = None,
    *,
    deadline: float | None = None,
) -> np.ndarray:
    """argmin ‖x − r‖₂ over {x ≥ 0 : aq x = b} (see the module docstring for the proof).

    Args: aq `[m, s]` with orthonormal rows, b `[m]`, r `[s]`; a `[s]` a feasible
        point (default: the least-norm solution of aq x = b, which must then be ≥ 0);
        deadline: a `time.monotonic()` instant after which OutOfTime is raised.
    Returns x `[s]`. Raises IdentifiableError when no feasible start is given or found.
    """
    m, s = aq.shape
    if a is None:
        a = aq.T @ b
    if a.min() < 0 or np.linalg.norm(aq @ a - b) > 1e-9:
        raise IdentifiableError("no valid attention row to start from (the raw row is not one)")
    full, _ = np.linalg.qr(aq.T, mode="complete")
    null = full[:, m:]  # [s, k] orthonormal basis of aq's null space: x = a + null z
    z0 = null.T @ (r - a)
    z = np.zeros(null.shape[1])
    work: list[int] = []
    at_sub_optimum = False  # after a full step, z solves the working-set sub-problem
    dropped = -1  # the key just released: the next step moves away from its bound
    for _ in range(10 * s + 10):
        if deadline is not None and time.monotonic() > deadline:
            raise OutOfTime
        rows = null[work]  # [w, k] active constraints x_i = 0 (independent by construction)
        g = z0 - z
        if work:
            coef = np.linalg.lstsq(rows @ rows.T, rows @ g, rcond=None)[0]
            p = g - rows.T @ coef
        else:
            p = g
        if at_sub_optimum or np.linalg.norm(p) <= 1e-13 * (1.0 + np.linalg.norm(z0)):
            at_sub_optimum = False
            if not work:
                break
            lam = np.linalg.lstsq(rows @ rows.T, rows @ (z - z0), rcond=None)[0]
            if lam.min() >= -1e-12:
                break
            dropped = work.pop(int(np.argmin(lam)))
            continue
        x = a + null @ z
        slope = null @ p
        # Only clearly blocking keys: a key whose slope is round-off (its row nearly in the
        # span of the working rows) would make the working rows dependent.
        block = slope < -1e-9 * np.linalg.norm(p)
        block[work] = False
        if dropped >= 0:
            block[dropped] = False
            dropped = -1
        alpha, hit = 1.0, -1
        if block.any():
            ratios = np.maximum(x[block], 0.0) / -slope[block]
            k = int(np.argmin(ratios))
            if ratios[k] < 1.0:
                alpha, hit = float(ratios[k]), int(np.flatnonzero(block)[k])
        z = z + alpha * p
        if hit >= 0:
            work.append(hit)
        else:
            at_sub_optimum = True
    else:
        raise IdentifiableError("the constrained effective attention did not converge")
    x = a + null @ z
    if x.min() < -1e-9 or np.linalg.norm(aq @ x - b) > _TOL:
        raise IdentifiableError(
            "the constrained effective attention missed its constraints "
            f"(min {x.min():.2e}, residual {np.linalg.norm(aq @ x - b):.2e})"
        )
    return np.maximum(x, 0.0)


def max_entropy_row(
    aq: np.ndarray, b: np.ndarray, *, max_iter: int = 200, deadline: float | None = None
) -> np.ndarray:
    """argmax −Σ x log x over {x ≥ 0 : aq x = b} (see the module docstring).

    Args: aq `[m, s]` orthonormal rows whose span contains the ones vector, b `[m]`;
        deadline: as for `project_onto_rows`.
    """
    s = aq.shape[1]
    y = aq @ np.full(s, -np.log(s))  # exp(aqᵀ y) = uniform, since 1 ∈ row space
    phi = lambda y: float(np.exp(aq.T @ y).sum() - b @ y)  # noqa: E731
    for _ in range(max_iter):
        if deadline is not None and time.monotonic() > deadline:
            raise OutOfTime
        x = np.exp(aq.T @ y)
        grad = aq @ x - b
        if np.linalg.norm(grad) <= _TOL:
            return x
        hess = (aq * x) @ aq.T
        step = np.linalg.lstsq(hess + 1e-14 * np.eye(hess.shape[0]), -grad, rcond=None)[0]
        f0, t = phi(y), 1.0
        # Armijo on the dual objective; near the optimum its decrease falls below float64
        # round-off of phi itself, so a step that shrinks the gradient is accepted too
        # (Newton's step does, quadratically, there)
        g0 = float(np.linalg.norm(grad))
        while t > 1e-12:
            y_new = y + t * step
            if phi(y_new) <= f0 + 1e-4 * t * float(grad @ step):
                break
            if np.linalg.norm(aq @ np.exp(aq.T @ y_new) - b) < 0.5 * g0:
                break
            t *= 0.5
        y = y + t * step
    raise IdentifiableError(
        "the maximum-entropy row did not converge: the valid rows may all have zero "
        "weight on some key (raw weights of exactly 0)"
    )


@dataclass(frozen=True)
class ConstrainedAttention(
    Result,
    dims={
        "weights": ("row", "key"),
        "raw": ("row", "key"),
        "effective": ("row", "key"),
        "residual": ("row",),
        "l1_constrained": ("row",),
        "l1_effective": ("row",),
    },
    plot={"fields": ("raw", "effective", "weights")},
    summary=("layer", "head", "reference"),
):
    """Constrained effective attention of some rows of one head.

    Attributes:
        layer, head: 0-based; rows: the query rows (0-based).
        reference: "uniform" or "entropy".
        raw: `[R, n]` raw weights; effective: `[R, n]` the paper's effective row
            (a Q_T Q_Tᵀ over the row's keys); weights: `[R, n]` the constrained row
            (≥ 0, sums to Σa, same head output); keys outside a row's key set are 0.
        residual: `[R]` ‖(x − a) Q‖ with Q the basis of col([T, 1]): the output and
            sum constraints, to round-off.
        tokens: the trace's tokens (labels for displays and tables).
    """

    layer: int
    head: int
    rows: tuple[int, ...]
    reference: str
    raw: Tensor
    effective: Tensor
    weights: Tensor
    residual: Tensor
    tokens: list[str] | None = None

    @property
    def l1_constrained(self) -> Tensor:
        """`[R]` ‖weights − raw‖₁."""
        return (self.weights - self.raw).abs().sum(-1)

    @property
    def l1_effective(self) -> Tensor:
        """`[R]` ‖effective − raw‖₁ (paper variant)."""
        return (self.effective - self.raw).abs().sum(-1)


def constrained_attention(
    trace: Trace,
    layer: int,
    head: int,
    *,
    rows: list[int] | None = None,
    reference: str = "uniform",
    key_mask: Tensor | None = None,
    memory_budget: int | None = None,
    time_budget: float | None = None,
    progress: bool | None = None,
) -> ConstrainedAttention:
    """The valid attention row closest to `reference`, for rows of one head.

    Rows with no null space (dim LN([T, 1]) = 0) are their own answer. `memory_budget`:
    bytes the call may use (default: the memory free now); over it, the call is refused
    before any work (`preflight.constrained_bytes`). `time_budget`: seconds; the rows are
    then built and solved in chunks, the widest row alone first, and the call raises,
    saying how long it would take, when the rows solved say the rest needs more than
    twice the budget (a row's cost taken as growing with the square of its key count) or
    when the budget (plus 5 %) runs out. `progress`: a bar of the rows solved
    (None: when a person is watching). Raises IdentifiableError for an unknown
    reference, out-of-range indices, a corrupt trace or a request over a budget.
    """
    from identifiable.attention.mapwork import head_rows
    from identifiable.attention.preflight import constrained_bytes
    from identifiable.models.budget import check_analysis
    from identifiable.utils.checks import expect, number
    from identifiable.utils.progress import task_bar, watching
    from identifiable.utils.threads import one_blas_thread

    start = time.monotonic()
    check_trace(trace)
    if not isinstance(reference, str) or reference not in REFERENCES:
        raise IdentifiableError(
            f"unknown reference {reference!r}: use one of {', '.join(REFERENCES)}"
        )
    if time_budget is not None:
        number(time_budget, "time_budget", low_open=True)
    if progress is not None:
        expect(progress, bool, "progress", "True, False or None (a bar when a person watches)")
    n = trace.n_tokens
    # the rule of interval_map's rows= and the CLI's --row
    order = list(range(n)) if rows is None else indices(rows, n, "rows", "--row")
    check_analysis(
        constrained_bytes(trace, len(order)),
        memory_budget,
        "constrained_attention",
        python="ask for fewer rows (rows=)",
        cli="ask for one row (--row) or raise --memory-budget",
    )
    chunks, widths = _chunks(trace, layer, key_mask, order, rows is None, time_budget)
    budget = _Budget(time_budget, start, [])
    where = {r: i for i, r in enumerate(order)}
    raw = np.zeros((len(order), n))
    eff, out, res = np.zeros_like(raw), np.zeros_like(raw), np.zeros(len(order))
    shown = watching() if progress is None else progress
    # many small LAPACK calls a row: a second BLAS thread only waits (records/decoder_budgets.md)
    with (
        one_blas_thread(),
        task_bar("constrained attention (rows)", len(order), enabled=shown) as bar,
    ):
        for chunk in chunks:
            sets = head_rows(trace, layer, head, chunk, key_mask=key_mask)
            for rs, i in [(part, i) for part in sets for i in range(len(part.rows))]:
                k, keys = where[int(rs.rows[i])], rs.keys[i]
                try:
                    a, a_eff, x, res[k] = _solve_row(rs, i, reference, budget.deadline)
                except OutOfTime:
                    raise budget.refusal(len(order), cut=True) from None
                raw[k, keys], eff[k, keys], out[k, keys] = a, a_eff, x
                budget.keys.append(int(np.count_nonzero(keys)))
                bar.advance()
            budget.check(len(order), widths)
    t_raw, t_eff, t_out, t_res = (torch.from_numpy(v) for v in (raw, eff, out, res))
    return ConstrainedAttention(
        layer, head, tuple(order), reference, t_raw, t_eff, t_out, t_res, tokens=list(trace.tokens)
    )


def _chunks(
    trace: Trace,
    layer: int,
    key_mask: Tensor | None,
    order: list[int],
    every_row: bool,
    time_budget: float | None,
) -> tuple[list[list[int] | None], list[int]]:
    """The rows in the chunks they are built and solved in, and their key counts (with a
    budget only): one chunk without a budget; with one, the widest row alone first (its
    build and solve price the others), then chunks of 32 from the widest down."""
    from identifiable.attention.keysets import layer_key_mask

    if time_budget is None:
        return [None if every_row else order], []
    trace.check_layer(layer)
    widths = layer_key_mask(trace, layer, key_mask)[order].sum(1).tolist()
    ranked = [order[w] for w in sorted(range(len(order)), key=lambda w: -widths[w])]
    chunks: list[list[int] | None] = [ranked[:1]]
    chunks += [ranked[c : c + 32] for c in range(1, len(ranked), 32)]
    return chunks, widths


def _solve_row(
    rs: Any, i: int, reference: str, deadline: float | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Row i of a row set (`mapwork.head_rows`): (raw, paper A_eff, constrained, residual)
    over the row's keys."""
    keys = rs.keys[i]
    aq = rs.aq[0 if rs.aq.shape[0] == 1 else i][:, keys]
    pb = rs.paper_basis[0 if rs.paper_basis.shape[0] == 1 else i][keys]
    a = rs.raw[i, keys]
    b = aq @ a
    if rs.null_dim[i] == 0:
        x = a.copy()
    elif reference == "entropy":
        x = max_entropy_row(aq, b, deadline=deadline)
    else:
        x = project_onto_rows(aq, b, np.full(a.size, a.sum() / a.size), a, deadline=deadline)
    return a, pb @ (pb.T @ a), x, float(np.linalg.norm(aq @ (x - a)))


@dataclass
class _Budget:
    """`constrained_attention`'s time budget: a hard deadline at 1.05×, and after each
    chunk of rows (the first is the widest row alone) an estimate of the rest, each row
    costing in proportion to the square of its key count, that refuses at once what is
    clearly out of reach."""

    seconds: float | None
    start: float
    keys: list[int]  # key counts of the rows solved so far

    @property
    def deadline(self) -> float | None:
        return None if self.seconds is None else self.start + 1.05 * self.seconds

    def estimate(self, widths: list[int]) -> float:
        elapsed = time.monotonic() - self.start
        done = sum(k * k for k in self.keys)
        rest = sum(k * k for k in sorted(widths, reverse=True)[len(self.keys) :])
        return elapsed + elapsed * rest / max(done, 1)

    def check(self, total: int, widths: list[int]) -> None:
        # the estimate is rough (rows that pin many keys at 0 cost more): refuse early only
        # at twice the budget; the deadline stops the rest
        if self.seconds is not None and self.estimate(widths) > 2 * self.seconds:
            raise self.refusal(total, cut=False, widths=widths)

    def refusal(
        self, total: int, *, cut: bool, widths: list[int] | None = None
    ) -> IdentifiableError:
        took = seconds(time.monotonic() - self.start)
        need = f"more than {took}" if cut else f"about {seconds(self.estimate(widths or []))}"
        return IdentifiableError(
            f"constrained_attention of {total} rows needs {need} ({len(self.keys)} solved "
            f"in {took}), more than the time budget of {self.seconds:g} s: raise "
            "time_budget= or ask for fewer rows (rows=)"
        )
