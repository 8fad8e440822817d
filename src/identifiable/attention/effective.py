"""Null spaces and effective attention of a `Trace` (docs/definitions.md#null-spaces).

Layer by layer, with ranks and bases in float64 and the n×n products in the trace's
precision (float32 for float32 and half-precision models, see `result_dtype`),
batched over heads, for the layers and heads asked for
(`layers=`, `heads=`; nothing outside them is computed or stored):
V' = V F (see `linalg.head_factors`) has the singular values and column space
of T = V H, so nothing n×d is ever formed. Encoders take an orthonormal basis
of col(V) (Cholesky QR when V and H are well-conditioned, else an SVD of V')
and project A's rows onto it; decoders use the prefix machinery of `causal.py`
(row i sees T[:i+1]), on V itself where H is proved well-conditioned and its
rank decisions have the margin that makes them those of V'.
`iter_effective_attention` streams one layer at a time so that callers that
only need statistics hold a single layer of n×n matrices.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from identifiable.attention.checks import check_selection, check_trace, check_trace_shapes
from identifiable.attention.outproj import (  # noqa: F401  (re-exported: tests, benchmarks)
    _FACTOR_CACHE,
    _FLAGS_CACHE,
    _LAYER_FACTORS,
    HeadFactors,
    OutProj,
    compute_head_factors,
)
from identifiable.attention.preflight import check_effective, effective_bytes, null_space_bytes
from identifiable.attention.routes import layer_dims, project_layer
from identifiable.errors import IdentifiableError
from identifiable.models.budget import check_analysis
from identifiable.models.trace import Trace
from identifiable.results import Result
from identifiable.utils.precision import (
    float32_matmul_precision,
    float32_matmuls_exact,
    has_float64,
)

_OutProj = OutProj  # the names the benchmarks use
_layer_dims = layer_dims
_check_trace_shapes = check_trace_shapes

Variant = Literal["paper", "row-stochastic"]
VARIANTS: tuple[str, ...] = ("paper", "row-stochastic")


@dataclass(frozen=True)
class NullSpace(
    Result,
    dims={
        "dim": ("layer", "head", "query"),
        "dim_stochastic": ("layer", "head", "query"),
        "rank": ("layer", "head", "query"),
        "out_proj_full_row_rank": ("layer", "head"),
    },
    plot={"fields": ("dim",), "axes": ("layer", "head"), "query": -1},
):
    """Ranks and null-space dimensions per layer, head and query row.

    All tensors are `[L, H, n]` int64 (L, H: the layers and heads asked for). For
    encoders every row holds the same value (the whole sequence's); for decoders row i
    describes T[:i+1], so the last row is the whole sequence.

    Attributes:
        rank: rank(T) (or rank(T[:i+1])).
        dim: dim LN(T) = keys seen by the row − rank.
        dim_stochastic: dim LN([T, 1]), the directions that keep rows summing to 1.
        out_proj_full_row_rank: `[L, H]` bool, see `HeadFactors`.
        is_causal: whether rows see prefixes only.
        tokens, model_name: labels of the trace (for displays and tables).
        layers, heads: the model's indices of the L and H axes (None: all of them).
    """

    rank: Tensor
    dim: Tensor
    dim_stochastic: Tensor
    out_proj_full_row_rank: Tensor
    is_causal: bool
    tokens: list[str] | None = None
    model_name: str = ""
    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None


@dataclass(frozen=True)
class LayerEffective:
    """One layer's effective attention (A_eff is not a distribution: entries may be negative).

    Attributes:
        layer: layer index.
        raw: `[H, n, n]` raw attention A (the trace's tensor and dtype; a copy of the
            selected heads only when `heads=` was given).
        effective: `[H, n, n]` A_eff in the call's dtype (`result_dtype`; masked
            causal entries exactly 0).
        rank, dim, dim_stochastic: `[H, n]` int64 as in `NullSpace`.
        heads: the model's head indices of the H axis (None: all of them).
    """

    layer: int
    raw: Tensor
    effective: Tensor
    rank: Tensor
    dim: Tensor
    dim_stochastic: Tensor
    heads: tuple[int, ...] | None = None

    @property
    def null(self) -> Tensor:
        """`[H, n, n]` null attention A − A_eff in A_eff's dtype (computed on access)."""
        return self.raw.to(self.effective.dtype) - self.effective


@dataclass(frozen=True)
class EffectiveAttention(
    Result,
    dims={
        "effective": ("layer", "head", "query", "key"),
        "raw": ("layer", "head", "query", "key"),
        "null": ("layer", "head", "query", "key"),
    },
    plot={"fields": ("raw", "effective", "null"), "layer": 0, "head": 0},
    summary=("variant",),
):
    """Effective attention of every head (A_eff is not a distribution).

    Attributes:
        raw: `[L, H, n, n]` the trace's attention (its own dtype).
        effective: `[L, H, n, n]` in the call's dtype (see `result_dtype`).
        variant: "paper" (project off LN(T)) or "row-stochastic" (off LN([T, 1])).
        null_space: the dimensions of both null spaces.
        tokens, key_tokens, model_name: labels of the trace (key_tokens: the encoder's
            tokens of a cross-attention trace, else None).
        layers, heads: the model's indices of the L and H axes (None: all of them).
    """

    raw: Tensor
    effective: Tensor
    variant: str
    null_space: NullSpace
    tokens: list[str] | None = None
    key_tokens: list[str] | None = None
    model_name: str = ""
    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None

    @property
    def null(self) -> Tensor:
        """`[L, H, n, n]` null attention A − A_eff in A_eff's dtype (computed on access)."""
        return self.raw.to(self.effective.dtype) - self.effective


def null_space(
    trace: Trace,
    *,
    factors: HeadFactors | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    memory_budget: int | None = None,
) -> NullSpace:
    """rank(T), dim LN(T) and dim LN([T, 1]) for every row of the layers and heads asked
    for (default all; see `NullSpace`), on the trace's device. `memory_budget`: bytes
    the call may use (default: the memory free now, on a CUDA trace the GPU's); a call
    over it is refused before any work (`preflight.null_space_bytes`). Raises
    IdentifiableError for an index out of range."""
    chosen, head_list = check_selection(trace, layers, heads)
    n_h = trace.n_heads if head_list is None else len(head_list)
    check_analysis(
        null_space_bytes(trace, len(chosen), n_h),
        memory_budget,
        "null_space",
        device=trace.attentions.device,
        python="choose fewer heads (heads=)",
        cli="shorten the text",
    )
    w_o = _OutProj(trace, factors, head_list)
    ranks, dims, dims_s = [], [], []
    for layer in chosen:
        r, d, ds, _ = layer_dims(trace, layer, w_o, head_list)
        ranks.append(r)
        dims.append(d)
        dims_s.append(ds)
    device = trace.attentions.device
    return NullSpace(
        rank=torch.stack(ranks).to(device),
        dim=torch.stack(dims).to(device),
        dim_stochastic=torch.stack(dims_s).to(device),
        out_proj_full_row_rank=torch.stack([w_o.full_row_rank(layer) for layer in chosen]).to(
            device
        ),
        is_causal=trace.is_causal,
        tokens=list(trace.tokens),
        model_name=trace.model_name,
        **_labels(trace, layers, head_list),
    )


def _labels(
    trace: Trace, layers: Sequence[int] | None, heads: list[int] | None
) -> dict[str, tuple[int, ...] | None]:
    """The `layers`/`heads` fields of a result (None where everything was computed)."""
    return {
        "layers": None if layers is None else tuple(int(x) for x in layers),
        "heads": None if heads is None else tuple(heads),
    }


def iter_effective_attention(
    trace: Trace,
    variant: Variant = "paper",
    *,
    factors: HeadFactors | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    dtype: torch.dtype | None = None,
    memory_budget: int | None = None,
) -> Iterator[LayerEffective]:
    """Yield `LayerEffective` for each layer asked for (default all), in that order, on
    the trace's device.

    Peak memory: the layer's A_eff ([H, n, n] of `dtype`, H the heads asked for) plus
    one head's temporaries (a row chunk of n×n products), and whatever the caller keeps;
    `memory_budget` (bytes; default the memory free now) is checked against that before
    the first layer. `dtype`: see `effective_attention`.

    Raises IdentifiableError for an unknown variant, a layer or head out of range, an
    unsupported dtype, a request over the memory budget, or NaN/inf in the attention or
    values of a head.
    """
    check_trace(trace)  # before its dtype is read
    dtype = result_dtype(trace, dtype)
    _check_request(variant, dtype, trace.attentions.device)
    chosen, head_list = check_selection(trace, layers, heads)
    n_h = trace.n_heads if head_list is None else len(head_list)
    check_analysis(
        effective_bytes(trace, 1, n_h, dtype, out=False),
        memory_budget,
        "iter_effective_attention",
        device=trace.attentions.device,
        python="choose fewer heads (heads=) or shorten the input",
        cli="shorten the text or raise --memory-budget",
    )
    w_o = _OutProj(trace, factors, head_list)
    yield from _iter_layers(trace, variant, w_o, chosen, head_list, dtype, None)


def effective_attention(
    trace: Trace,
    variant: Variant = "paper",
    *,
    factors: HeadFactors | None = None,
    dtype: torch.dtype | None = None,
    out: Tensor | None = None,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    memory_budget: int | None = None,
) -> EffectiveAttention:
    """Effective attention of the heads and layers asked for, `[L, H, n, n]`, computed
    and returned on the trace's device (CPU, CUDA or MPS: `Trace.to`).

    `layers=`, `heads=`: 0-based indices (default all); nothing outside them is
    computed or stored, and the result's `layers`/`heads` say which were taken.
    This materialises L·H·n² numbers (BERT-base at n = 512: 151 MB in float32);
    use `iter_effective_attention` to stream layers instead, or `identifiable.scan`
    for per-head statistics of a whole model. `memory_budget`: bytes the call may use
    (default: the memory free now; on a CUDA trace also the GPU's free memory); a call
    whose formula (`preflight.effective_bytes`) exceeds it is refused in one line before
    anything is allocated.

    `dtype` (default: `result_dtype(trace)`, float32 for a float32 or half-precision
    model, float64 for a float64 trace or under reduced-precision float32 matmuls):
    bases, ranks and null-space dimensions are computed in float64 with the same
    relative tolerances whatever `dtype` is (so `null_space` never depends on it), and
    only the n×n products run in `dtype` (the encoder projection A Q Qᵀ; the decoder's
    A C and Y Cᵀ, whose small solves stay in float64; key-set routes are computed in
    float64 and rounded). In float32 the invariant holds to the model's own precision,
    ‖A_eff T − A T‖ ≤ 1e-5 ‖A T‖ per head (tested; 1e-7 measured, the size of the
    trace's own `verify()` error), at half the memory and time; `dtype=torch.float64`
    holds it to 1e-9. float32 needs full-precision float32 matmuls: asked for
    explicitly it raises under any reduced setting
    (`torch.set_float32_matmul_precision("high" | "medium")`, TF32 on CUDA, or torch's
    per-backend settings, see `identifiable.utils.precision`), since "medium" multiplies
    in bfloat16 on CPUs that support it (~3e-3 relative); the default then takes float64.
    On a device without float64 (MPS) the rank decisions run in float64 on the CPU and
    the products in float32 on the device (docs/definitions.md#devices).

    `out`: a contiguous tensor `[L, H, n, n_k]` of `dtype` on the trace's device to write
    A_eff into (returned as `.effective`), so that a loop over many sequences of one
    length reuses one buffer. A fresh result costs the kernel's zeroing of new pages
    whenever malloc has none to reuse: at BERT-base size and n = 512 in float32,
    36,864 page faults and 25-35 ms, 0.05-0.07× a forward pass (`bench_attention.py`).
    Without `dtype`, the result takes `out`'s dtype.
    """
    check_trace(trace)  # before its dtype is read
    dtype = result_dtype(trace, dtype, out)
    device = trace.attentions.device
    _check_request(variant, dtype, device)
    chosen, head_list = check_selection(trace, layers, heads)
    n_h = trace.n_heads if head_list is None else len(head_list)
    n = trace.n_tokens
    # n_keys = n except for cross-attention traces (rows: decoder, keys: encoder).
    shape = (len(chosen), n_h, n, trace.n_keys)
    if out is not None:
        _check_out(out, shape, dtype, trace)
    copy_raw = chosen != list(range(trace.n_layers)) or head_list is not None
    need = effective_bytes(trace, len(chosen), n_h, dtype, out=out is None, raw_copy=copy_raw)
    check_effective(need, memory_budget, device)
    w_o = _OutProj(trace, factors, head_list)
    effective = torch.empty(shape, dtype=dtype, device=device) if out is None else out
    rank = torch.empty(len(chosen), n_h, n, dtype=torch.long, device=device)
    dim, dim_s = torch.empty_like(rank), torch.empty_like(rank)
    # Each layer is written straight into `effective`: no per-layer buffer and copy.
    for i, le in enumerate(_iter_layers(trace, variant, w_o, chosen, head_list, dtype, effective)):
        rank[i], dim[i], dim_s[i] = le.rank, le.dim, le.dim_stochastic
    sel = _labels(trace, layers, head_list)
    full = torch.stack([w_o.full_row_rank(layer) for layer in chosen]).to(device)
    tokens, name = list(trace.tokens), trace.model_name
    ns = NullSpace(rank, dim, dim_s, full, trace.is_causal, tokens, name, **sel)
    raw = trace.attentions
    if copy_raw:
        lay = torch.tensor(chosen, device=device)[:, None]
        idx = torch.arange(trace.n_heads) if head_list is None else torch.tensor(head_list)
        raw = raw[lay, idx.to(device)]
    return EffectiveAttention(raw, effective, variant, ns, tokens, trace.key_tokens, name, **sel)


def _check_out(out: Tensor, shape: tuple[int, ...], dtype: torch.dtype, trace: Trace) -> None:
    """One line for an `out` that cannot take the result (checked before any work)."""
    if not isinstance(out, Tensor):
        raise IdentifiableError(f"out must be a torch.Tensor, got {type(out).__name__}")
    problem = None
    device = trace.attentions.device
    if tuple(out.shape) != shape:
        problem = f"has shape {tuple(out.shape)}, expected [L, H, n, n_k] = {list(shape)}"
    elif out.dtype != dtype:
        problem = f"has dtype {out.dtype}; pass dtype={dtype} or an out of that dtype"
    elif out.device != device:
        problem = f"is on {out.device}, the trace on {device}; the analysis runs on the trace's"
    elif not out.is_contiguous():
        problem = "is not contiguous; pass a contiguous tensor (e.g. torch.empty(shape))"
    else:
        storage = out.untyped_storage().data_ptr()
        shared = [
            name
            for name in ("attentions", "values", "out_proj")
            if getattr(trace, name).untyped_storage().data_ptr() == storage
        ]
        if shared:
            problem = f"shares memory with the trace's {shared[0]}, which the call reads"
    if problem:
        raise IdentifiableError(f"out {problem}")


def result_dtype(
    trace: Trace, dtype: torch.dtype | None = None, out: Tensor | None = None
) -> torch.dtype:
    """The dtype of A_eff for `dtype=None`: `out`'s when given, float64 for a float64
    trace, else float32 (the model's own precision: a half-precision model's maps are
    captured in float32) unless float32 matmuls run at reduced precision, where the
    products could not hold the invariant and float64 is taken instead. On a device
    without float64 (MPS) always float32."""
    if dtype is not None:
        return dtype
    if isinstance(out, Tensor):
        return out.dtype
    device = trace.attentions.device
    if not has_float64(device):
        return torch.float32
    if trace.attentions.dtype == torch.float64 or not float32_matmuls_exact(device):
        return torch.float64
    return torch.float32


# ---- internals ---------------------------------------------------------------


_DTYPES = (torch.float64, torch.float32)


def _check_request(variant: str, dtype: torch.dtype, device: torch.device) -> None:
    """One line for a variant or dtype the routes cannot honour (checked before any work)."""
    if variant not in VARIANTS:
        raise IdentifiableError(f"unknown variant {variant!r}: use one of {', '.join(VARIANTS)}")
    if dtype not in _DTYPES:
        raise IdentifiableError(
            f"unsupported dtype {dtype}: use torch.float32 or torch.float64 (or leave "
            "dtype out for the trace's precision)"
        )
    if dtype == torch.float64 and not has_float64(device):
        raise IdentifiableError(
            f"dtype=torch.float64 is not available on {device} (no float64 there): pass "
            "dtype=torch.float32 (ranks are still decided in float64, on the CPU), or move "
            "the trace to the CPU with trace.to('cpu')"
        )
    if dtype == torch.float32 and has_float64(device) and not float32_matmuls_exact(device):
        # "medium" makes a CPU with bfloat16 support multiply float32 in bfloat16: the
        # invariant then fails by ~3e-3 instead of holding to 1e-5 (measured here).
        raise IdentifiableError(
            "dtype=torch.float32 needs full-precision float32 matmuls, but they run at "
            f"reduced precision ('{float32_matmul_precision(device)}': ~1e-3 relative); call "
            "torch.set_float32_matmul_precision('highest') first (on CUDA also "
            "torch.backends.cuda.matmul.allow_tf32 = False), or pass dtype=torch.float64 "
            "(or leave dtype out)"
        )


def _iter_layers(
    trace: Trace,
    variant: str,
    w_o: _OutProj,
    layers: Sequence[int],
    heads: list[int] | None,
    dtype: torch.dtype,
    out: Tensor | None,
) -> Iterator[LayerEffective]:
    """`iter_effective_attention`, writing the i-th layer asked for into `out[i]` when
    `out` is given (the callers have checked `variant`, `dtype` and the selection)."""
    device = trace.attentions.device
    for i, layer in enumerate(layers):
        raw = trace.attentions[layer] if heads is None else trace.attentions[layer, heads]
        rank, dim, dim_s, bases = layer_dims(trace, layer, w_o, heads)
        eff = torch.empty(raw.shape, dtype=dtype, device=device) if out is None else out[i]
        project_layer(raw, variant, bases, (dim, dim_s), eff, dtype, layer)
        sel = None if heads is None else tuple(heads)
        yield LayerEffective(
            layer, raw, eff, rank.to(device), dim.to(device), dim_s.to(device), sel
        )
        del eff  # do not hold this layer while the next one is computed
