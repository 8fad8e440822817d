"""`witness` and `attention_intervals` for one head and query row of a `Trace`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from identifiable.attention.certificates import interval_lp, output_residual, witness_lp
from identifiable.attention.checks import check_finite
from identifiable.attention.effective import HeadFactors
from identifiable.attention.linalg import add_ones, column_basis, head_factors
from identifiable.models.trace import Trace


@dataclass(frozen=True)
class Witness:
    """A different attention row with the same head output, or why none exists.

    Arrays cover all n keys (float64); keys a causal row cannot see are 0.

    Attributes:
        exists: False when dim LN([T, 1]) = 0 for this row (then `reason` says so).
        weights: ã `[n]` (≥ 0, Σ = Σa, ã T = a T), or None.
        key: the key whose weight was minimised (the largest raw weight the
            null space can move; normally the argmax).
        moved_mass: a_key − ã_key.
        total_variation: ½ Σ|ã − a|, the mass moved in all.
        output_residual: ‖(ã − a) T‖ / ‖a T‖ with T = V H formed explicitly.
        null_dim: dim LN([T, 1]) for this row.
    """

    layer: int
    head: int
    row: int
    exists: bool
    reason: str
    raw: Tensor
    weights: Tensor | None
    key: int | None
    moved_mass: float
    total_variation: float
    output_residual: float
    null_dim: int


@dataclass(frozen=True)
class AttentionIntervals:
    """Per key, the min and max weight any valid row with the same output can give it.

    Attributes:
        raw, lower, upper: `[n]` float64 (keys a causal row cannot see: 0).
        null_dim: dim LN([T, 1]) for this row.
        lp_solved: LPs actually solved (at most 2n; the rest were settled by
            vertices already found or because the key cannot move).
    """

    layer: int
    head: int
    row: int
    raw: Tensor
    lower: Tensor
    upper: Tensor
    null_dim: int
    lp_solved: int

    @property
    def width(self) -> Tensor:
        """`[n]` upper − lower: 0 means the weight is identifiable."""
        return self.upper - self.lower


def _row_problem(trace: Trace, layer: int, head: int, row: int, factors: HeadFactors | None):
    trace.check_layer(layer)
    trace.check_head(head)
    trace.check_row(row)
    seen = row + 1 if trace.is_causal else trace.n_tokens
    a = trace.attentions[layer, head, row].double()
    check_finite(a[None], "attention", layer=layer)
    values = trace.values[layer, head, :seen].double()
    out_proj = trace.out_proj[layer, head].double()
    check_finite(values[None], "values (E·W_V)", layer=layer)
    # One head needs only its own factor, not the whole model's.
    factor = factors.factor[layer, head] if factors else head_factors(out_proj)[0]
    check_finite(factor[None, None], "output projection (W_O)", layer=layer)
    q, rank, _ = column_basis(values @ factor)
    qa, rank_a = add_ones(q, rank)
    basis = qa[:, torch.linalg.vector_norm(qa, dim=0) > 0].numpy()
    return a, seen, values, out_proj, basis, seen - int(rank_a)


def witness(
    trace: Trace, layer: int, head: int, row: int, *, factors: HeadFactors | None = None
) -> Witness:
    """Certificate that a row's attention is not identifiable (see `Witness`).

    Solves one LP: minimise the weight of the row's largest movable key over
    {ã ≥ 0, Σã = 1, ã T = a T}. Raises IdentifiableError for an out-of-range
    layer/head/row or non-finite inputs.
    """
    a, seen, values, out_proj, basis, null_dim = _row_problem(trace, layer, head, row, factors)
    sol = witness_lp(a[:seen].numpy(), basis)
    if sol.weights is None:
        return Witness(layer, head, row, False, sol.reason, a, None, None, 0.0, 0.0, 0.0, null_dim)
    x = torch.zeros_like(a)
    x[:seen] = torch.from_numpy(sol.weights)
    key = int(sol.key)  # type: ignore[arg-type]
    return Witness(
        layer,
        head,
        row,
        True,
        "",
        a,
        x,
        key,
        float(a[key] - x[key]),
        float((x - a).abs().sum() / 2),
        output_residual(x[:seen], a[:seen], values, out_proj),
        null_dim,
    )


def attention_intervals(
    trace: Trace, layer: int, head: int, row: int, *, factors: HeadFactors | None = None
) -> AttentionIntervals:
    """Min and max of every weight of one row consistent with its head output (LPs via HiGHS)."""
    a, seen, _, _, basis, null_dim = _row_problem(trace, layer, head, row, factors)
    lo, hi, solved = interval_lp(a[:seen].numpy(), basis)
    lower, upper = torch.zeros_like(a), torch.zeros_like(a)
    lower[:seen], upper[:seen] = torch.from_numpy(np.asarray(lo)), torch.from_numpy(hi)
    return AttentionIntervals(layer, head, row, a, lower, upper, null_dim, solved)
