"""The attention analyses on bare tensors, for models `identifiable.models` does not trace.

Shapes (leading dimensions may be left out: `[H, …]` for one layer, `[…]` for
one head; results come back with the same leading dimensions):

    attentions  [L, H, n, n_k]   attention probabilities A (rows sum to 1 over the keys)
    values      [L, H, n_k, d_v] V = E·W_V per head, without the value bias
    out_proj    [L, H, d_v, d]   each head's rows H of the output projection W_O

so that T = V·H. n_k = n for self-attention; n_k ≠ n is cross-attention (rows are
queries, keys the values' rows). `causal=None` reads causality off A (square,
exactly 0 above the diagonal); `key_mask` (`[n, n_k]` or `[L, n, n_k]` bool) gives
any other per-row key sets (sliding windows, padding).

Every function builds `Trace.from_tensors(...)` and runs the trace-level
analysis, so both routes give identical numbers (tested).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from identifiable.attention.effective import (
    EffectiveAttention,
    NullSpace,
    Variant,
)
from identifiable.attention.effective import (
    effective_attention as _effective_attention,
)
from identifiable.attention.effective import (
    null_space as _null_space,
)
from identifiable.models.trace import Trace


def as_trace(
    attentions: Tensor,
    values: Tensor,
    out_proj: Tensor,
    *,
    causal: bool | None = None,
    key_mask: Tensor | None = None,
) -> Trace:
    """`Trace.from_tensors`: pass the result to any trace-level function (witness, intervals)."""
    return Trace.from_tensors(attentions, values, out_proj, causal=causal, key_mask=key_mask)


def _lead(attentions: Tensor) -> tuple[int, ...]:
    """The leading (layer, head) dimensions the caller gave."""
    return tuple(torch.as_tensor(attentions).shape[:-2])


def _shape_back(x: Tensor, lead: tuple[int, ...], tail: int) -> Tensor:
    return x.reshape(*lead, *x.shape[x.dim() - tail :])


def effective_attention(
    attentions: Tensor,
    values: Tensor,
    out_proj: Tensor,
    *,
    variant: Variant = "paper",
    causal: bool | None = None,
    key_mask: Tensor | None = None,
    dtype: torch.dtype | None = None,
) -> EffectiveAttention:
    """A_eff of bare tensors (docs/definitions.md#effective-attention).

    `dtype`: as in the trace function (default: float64 for float64 `attentions`,
    else float32 where float32 matmuls run at full precision).
    Returns an `EffectiveAttention` whose `raw`, `effective` and null-space
    tensors have the leading dimensions of `attentions` (`[L, H, n, n_k]`, `[H, n, n_k]`
    or `[n, n_k]`; ranks `[L, H, n]`, `[H, n]` or `[n]`).
    """
    lead = _lead(attentions)
    trace = as_trace(attentions, values, out_proj, causal=causal, key_mask=key_mask)
    ea = _effective_attention(trace, variant, dtype=dtype)
    return EffectiveAttention(
        raw=_shape_back(ea.raw, lead, 2),
        effective=_shape_back(ea.effective, lead, 2),
        variant=ea.variant,
        null_space=_ns_back(ea.null_space, lead),
    )


def null_space(
    values: Tensor,
    out_proj: Tensor,
    *,
    causal: bool = False,
    key_mask: Tensor | None = None,
) -> NullSpace:
    """rank(T), dim LN(T) and dim LN([T, 1]) per row of bare tensors.

    Args:
        values: `[L, H, n_k, d_v]` (or `[H, n_k, d_v]`, `[n_k, d_v]`).
        out_proj: `[L, H, d_v, d]` (leading dimensions as `values`).
        causal: rows see keys ≤ i (decoders); default all keys.
        key_mask: `[n, n_k]` bool per-row key sets (its n rows may differ from n_k:
            cross-attention).
    Returns: `NullSpace` with `[…, n]` tensors (the leading dimensions of `values`).
    """
    v = torch.as_tensor(values)
    lead = tuple(v.shape[:-2])
    n_k = int(v.shape[-2])
    n = int(key_mask.shape[-2]) if key_mask is not None else n_k
    # A zero-stride stand-in for A: the null space never reads the attention weights.
    a = torch.zeros((), dtype=v.dtype).expand(*lead, n, n_k)
    trace = as_trace(a, v, out_proj, causal=causal, key_mask=key_mask)
    return _ns_back(_null_space(trace), lead)


def _ns_back(ns: NullSpace, lead: tuple[int, ...]) -> NullSpace:
    full = ns.out_proj_full_row_rank
    return replace(
        ns,
        rank=_shape_back(ns.rank, lead, 1),
        dim=_shape_back(ns.dim, lead, 1),
        dim_stochastic=_shape_back(ns.dim_stochastic, lead, 1),
        out_proj_full_row_rank=full.reshape(lead) if lead else full.reshape(()),
    )
