"""Memory model for batched JVPs: how many tangents fit in a memory budget.

Forward-mode differentiation keeps no activations for a backward pass, so the
peak memory of a chunk of B tangents is the transient working set of one layer
for B tangent copies plus the stacked outputs of every layer. The estimate below
is deliberately generous (it counts every intermediate of a post-LN BERT layer and
of its JVP as if alive at once); `tests/attribution/test_memory.py` checks that the
peak resident memory of a real chunk through the embedded model stays below it.
"""

from __future__ import annotations

from dataclasses import dataclass

from identifiable.errors import IdentifiableError

GIB = 1024**3
MIB = 1024**2
DEFAULT_MEMORY_BUDGET = 2 * GIB
HEADROOM = 1.5  # factor on the counted floats, for models and allocators not calibrated


@dataclass(frozen=True)
class ModelDims:
    """Sizes that drive memory: L layers, H heads, width d, feed-forward width d_ff."""

    n_layers: int
    n_heads: int
    hidden_size: int
    intermediate_size: int

    @classmethod
    def guess(cls, n_layers: int, hidden_size: int) -> ModelDims:
        """Dims of a typical model when only L and d are known (64-wide heads, d_ff = 4d)."""
        return cls(n_layers, max(1, hidden_size // 64), hidden_size, 4 * hidden_size)


def bytes_per_tangent(n: int, dims: ModelDims, itemsize: int) -> int:
    """Bytes one extra tangent adds to a chunk (sequence length n).

    Counts: the input tangent (n·d); the per-layer tangent outputs, their stacked copy
    and the slack of the allocator (3·(L+1)·n·d); one layer's working set: scores,
    softmax and its JVP temporaries (4·H·n²), the feed-forward activation and its
    derivative (3·n·d_ff), and q, k, v, context, residual and LayerNorm temporaries
    with their tangents (16·n·d); all times HEADROOM. Calibrated on all-MiniLM-L6-v2
    (CPU, peak resident memory added by one chunk): the measured peak was 0.5-0.8 of
    the count before headroom in repeated runs (n = 32…128); the headroom covers
    models and allocators it was not calibrated on.
    """
    d, big_l = dims.hidden_size, dims.n_layers
    floats = (
        n * d
        + 3 * (big_l + 1) * n * d
        + 4 * dims.n_heads * n * n
        + 3 * n * dims.intermediate_size
        + 16 * n * d
    )
    return int(floats * itemsize * HEADROOM)


def fixed_bytes(n: int, dims: ModelDims, itemsize: int) -> int:
    """Bytes needed regardless of chunk size: the primal pass and float64 accumulators.

    Accumulators: sum and sum of squares, each `[L+1, n, n]` float64.
    """
    return bytes_per_tangent(n, dims, itemsize) + 2 * (dims.n_layers + 1) * n * n * 8


def _which(budget: int) -> str:
    """The budget as a refusal names it: the default is called the default."""
    return "default memory budget" if budget == DEFAULT_MEMORY_BUDGET else "memory budget"


def plan_chunk_size(
    n: int,
    dims: ModelDims,
    itemsize: int,
    total_tangents: int,
    budget: int,
    requested: int | None = None,
    *,
    what: str = "exact Hidden Token Attribution",
) -> int:
    """Largest number of tangents per chunk that fits `budget` bytes (≤ total_tangents).

    Raises IdentifiableError before any work starts if even one tangent does not fit,
    or if `requested` does not fit; the message names the Python arguments (memory_budget=,
    probes=) and, for the CLI (`IdentifiableError.for_cli`), the flags. The formula is
    `fixed_bytes` + chunk · `bytes_per_tangent`: no model call is needed to decide.
    """
    if not budget > 0:  # NaN too, which no chunk size could be compared with
        raise IdentifiableError(f"memory budget must be positive, got {budget} bytes")
    per, fixed = bytes_per_tangent(n, dims, itemsize), fixed_bytes(n, dims, itemsize)
    fits = (budget - fixed) // per
    if fits < 1:
        need = fixed + per
        head = (
            f"{what} of this {n}-token sequence needs at least {need / MIB:.0f} MiB even one "
            f"JVP at a time, more than the {_which(budget)} of {budget / MIB:.0f} MiB. "
        )
        tail = f"; at this length exact mode would also run n·d = {n * dims.hidden_size} JVPs"
        raise IdentifiableError(
            f"{head}Raise memory_budget= (bytes, at least {need}) or shorten the text{tail}, "
            "which probes=K cuts to n·K.",
            cli=f"{head}Raise the budget (--memory-budget, MiB, at least "
            f"{-(-need // MIB)}; `identifiable attribution` has it) or shorten the text{tail}, "
            "which --probes K cuts to n·K.",
        )
    if requested is not None:
        if requested < 1:
            raise IdentifiableError(f"chunk size must be ≥ 1, got {requested}")
        if requested > fits:
            raise IdentifiableError(
                f"chunk_size={requested} needs about {(fixed + requested * per) / MIB:.0f} MiB, "
                f"over the {_which(budget)} of {budget / MIB:.0f} MiB; use at most {fits} "
                "or raise memory_budget=."
            )
        return min(requested, total_tangents)
    return int(min(fits, total_tangents))
