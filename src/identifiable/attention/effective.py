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

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from identifiable.attention.causal import Prefixes, prefixes, project_prefixes
from identifiable.attention.checks import (
    check_finite,
    check_selection,
    check_trace,
    check_trace_shapes,
)
from identifiable.attention.keysets import keyset_groups, keyset_ranks, project_rows_keysets
from identifiable.attention.linalg import (
    _column_basis,
    cholesky_if_well_conditioned,
    ones_direction,
    ones_inside,
    row_ids,
)
from identifiable.attention.outproj import (  # noqa: F401  (re-exported: tests, benchmarks)
    _FACTOR_CACHE,
    _FLAGS_CACHE,
    _LAYER_FACTORS,
    HeadFactors,
    OutProj,
    compute_head_factors,
)
from identifiable.attention.windows import WindowSolve, causal_band
from identifiable.errors import IdentifiableError
from identifiable.models.trace import Trace
from identifiable.results import Result
from identifiable.utils.precision import float32_matmul_precision, float32_matmuls_exact

_OutProj = OutProj  # the name the benchmarks use
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
) -> NullSpace:
    """rank(T), dim LN(T) and dim LN([T, 1]) for every row of the layers and heads asked
    for (default all; see `NullSpace`). Raises IdentifiableError for an index out of range."""
    chosen, head_list = check_selection(trace, layers, heads)
    w_o = _OutProj(trace, factors, head_list)
    ranks, dims, dims_s = [], [], []
    for layer in chosen:
        r, d, ds, _ = _layer_dims(trace, layer, w_o, head_list)
        ranks.append(r)
        dims.append(d)
        dims_s.append(ds)
    return NullSpace(
        rank=torch.stack(ranks),
        dim=torch.stack(dims),
        dim_stochastic=torch.stack(dims_s),
        out_proj_full_row_rank=torch.stack([w_o.full_row_rank(layer) for layer in chosen]),
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
) -> Iterator[LayerEffective]:
    """Yield `LayerEffective` for each layer asked for (default all), in that order.

    Peak memory: the layer's A_eff ([H, n, n] of `dtype`, H the heads asked for) plus
    one head's temporaries (a row chunk of n×n products), and whatever the caller keeps.
    `dtype`: see `effective_attention`.

    Raises IdentifiableError for an unknown variant, a layer or head out of range, an
    unsupported dtype, or NaN/inf in the attention or values of a head.
    """
    check_trace(trace)  # before its dtype is read
    dtype = result_dtype(trace, dtype)
    _check_request(variant, dtype)
    chosen, head_list = check_selection(trace, layers, heads)
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
) -> EffectiveAttention:
    """Effective attention of the heads and layers asked for, `[L, H, n, n]`.

    `layers=`, `heads=`: 0-based indices (default all); nothing outside them is
    computed or stored, and the result's `layers`/`heads` say which were taken.
    This materialises L·H·n² numbers (BERT-base at n = 512: 151 MB in float32);
    use `iter_effective_attention` to stream layers instead.

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
    (`torch.set_float32_matmul_precision("high" | "medium")` or torch's per-backend
    settings, see `identifiable.utils.precision`), since "medium" multiplies in bfloat16 on
    CPUs that support it (~3e-3 relative); the default then takes float64.

    `out`: a contiguous CPU tensor `[L, H, n, n_k]` of `dtype` to write A_eff into
    (returned as `.effective`), so that a loop over many sequences of one length
    reuses one buffer. A fresh result costs the kernel's zeroing of new pages
    whenever malloc has none to reuse: at BERT-base size and n = 512 in float32,
    36,864 page faults and 25-35 ms, 0.05-0.07× a forward pass (`bench_attention.py`).
    Without `dtype`, the result takes `out`'s dtype.
    """
    check_trace(trace)  # before its dtype is read
    dtype = result_dtype(trace, dtype, out)
    _check_request(variant, dtype)
    chosen, head_list = check_selection(trace, layers, heads)
    n_h = trace.n_heads if head_list is None else len(head_list)
    n = trace.n_tokens
    # n_keys = n except for cross-attention traces (rows: decoder, keys: encoder).
    shape = (len(chosen), n_h, n, trace.n_keys)
    if out is not None:
        _check_out(out, shape, dtype, trace)
    w_o = _OutProj(trace, factors, head_list)
    effective = torch.empty(shape, dtype=dtype) if out is None else out
    rank = torch.empty(len(chosen), n_h, n, dtype=torch.long)
    dim, dim_s = torch.empty_like(rank), torch.empty_like(rank)
    # Each layer is written straight into `effective`: no per-layer buffer and copy.
    for i, le in enumerate(_iter_layers(trace, variant, w_o, chosen, head_list, dtype, effective)):
        rank[i], dim[i], dim_s[i] = le.rank, le.dim, le.dim_stochastic
    sel = _labels(trace, layers, head_list)
    full = torch.stack([w_o.full_row_rank(layer) for layer in chosen])
    tokens, name = list(trace.tokens), trace.model_name
    ns = NullSpace(rank, dim, dim_s, full, trace.is_causal, tokens, name, **sel)
    raw = trace.attentions
    if chosen != list(range(trace.n_layers)) or head_list is not None:
        lay = torch.tensor(chosen)[:, None]
        raw = raw[
            lay, torch.arange(trace.n_heads) if head_list is None else torch.tensor(head_list)
        ]
    return EffectiveAttention(raw, effective, variant, ns, tokens, trace.key_tokens, name, **sel)


def _check_out(out: Tensor, shape: tuple[int, ...], dtype: torch.dtype, trace: Trace) -> None:
    """One line for an `out` that cannot take the result (checked before any work)."""
    if not isinstance(out, Tensor):
        raise IdentifiableError(f"out must be a torch.Tensor, got {type(out).__name__}")
    problem = None
    if tuple(out.shape) != shape:
        problem = f"has shape {tuple(out.shape)}, expected [L, H, n, n_k] = {list(shape)}"
    elif out.dtype != dtype:
        problem = f"has dtype {out.dtype}; pass dtype={dtype} or an out of that dtype"
    elif out.device.type != "cpu":
        problem = f"is on {out.device}; the analysis runs on the CPU"
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
    products could not hold the invariant and float64 is taken instead."""
    if dtype is not None:
        return dtype
    if isinstance(out, Tensor):
        return out.dtype
    if trace.attentions.dtype == torch.float64 or not float32_matmuls_exact():
        return torch.float64
    return torch.float32


# ---- internals ---------------------------------------------------------------


_DTYPES = (torch.float64, torch.float32)


def _check_request(variant: str, dtype: torch.dtype) -> None:
    """One line for a variant or dtype the routes cannot honour (checked before any work)."""
    if variant not in VARIANTS:
        raise IdentifiableError(f"unknown variant {variant!r}: use one of {', '.join(VARIANTS)}")
    if dtype not in _DTYPES:
        raise IdentifiableError(
            f"unsupported dtype {dtype}: use torch.float32 or torch.float64 (or leave "
            "dtype out for the trace's precision)"
        )
    if dtype == torch.float32 and not float32_matmuls_exact():
        # "medium" makes a CPU with bfloat16 support multiply float32 in bfloat16: the
        # invariant then fails by ~3e-3 instead of holding to 1e-5 (measured here).
        raise IdentifiableError(
            "dtype=torch.float32 needs full-precision float32 matmuls, but they run at "
            f"reduced precision ('{float32_matmul_precision()}': ~1e-3 relative); call "
            "torch.set_float32_matmul_precision('highest') first, or pass "
            "dtype=torch.float64 (or leave dtype out)"
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
    for i, layer in enumerate(layers):
        raw = trace.attentions[layer] if heads is None else trace.attentions[layer, heads]
        rank, dim, dim_s, bases = _layer_dims(trace, layer, w_o, heads)
        route, data = bases
        eff = torch.empty(raw.shape, dtype=dtype) if out is None else out[i]
        if route == "windows":
            check_finite(raw, "attention", layer=layer)
            for h, solve in enumerate(data[0 if variant == "paper" else 1]):
                solve.project(raw[h], eff[h], dtype)
        elif route == "keysets":  # a float64 route, rounded only if asked
            check_finite(raw, "attention", layer=layer)
            eff.copy_(project_rows_keysets(raw, data, stochastic=variant != "paper"))
        elif route == "causal":
            check_finite(raw, "attention", layer=layer)
            p, pa, owner = data
            chosen = p if variant == "paper" else pa
            project_prefixes(raw, chosen, owner=owner, out=eff, dtype=dtype)
        else:
            q, w = data
            if w is None and variant != "paper":
                w, _ = ones_direction(q)
            basis = q if variant == "paper" else torch.cat([q, w], dim=-1)
            full = (dim if variant == "paper" else dim_s)[:, 0] == 0
            _project_encoder_layer(raw, basis, full, eff, layer)
        sel = None if heads is None else tuple(heads)
        yield LayerEffective(layer, raw, eff, rank, dim, dim_s, sel)
        del eff  # do not hold this layer while the next one is computed


def _project_encoder_layer(
    raw: Tensor, basis: Tensor, full: Tensor, out: Tensor, layer: int
) -> None:
    """out[h] = A[h] Q[h] Q[h]ᵀ for every head, and A[h] itself where `full[h]`.

    Two batched GEMMs over the heads: A Q is a small [H, n, k] temporary, so
    `out` can take the second product. A float64 `out` first receives A (the
    one conversion); a float32 `out` multiplies the trace's float32 A directly,
    with no n×n copy. Rows with rank(T) = keys seen keep A exactly, not A up
    to rounding. The basis is cast to `out`'s dtype (float32 only when opted in).

    Finiteness of A is checked on A Q ([H, n, k], not n×n): a NaN or inf
    anywhere in a row of A makes every entry of that row of A Q non-finite
    (inf · 0 is NaN), so only then is A itself scanned, to name the head.
    """
    if bool(full.any()):  # rare (n ≤ d_v): project head by head, skipping the identity ones
        check_finite(raw, "attention", layer=layer)
        out.copy_(raw)
        q = basis.to(out.dtype)
        for h in torch.nonzero(~full).flatten().tolist():
            torch.matmul(out[h] @ q[h], q[h].transpose(-1, -2), out=out[h])
        return
    q = basis.to(out.dtype)
    # float32 uses A as it is, and forms (A Q)ᵀ = Qᵀ Aᵀ: MKL's kernel for that
    # orientation takes 8-15 % less time at BERT-base size, while in float64 it takes
    # more (bench_attention.py, "orientation"). A float64 `out` first receives A (the
    # one conversion) and keeps A Q.
    aq = (q.mT @ raw.mT).mT if raw.dtype == out.dtype else out.copy_(raw) @ q
    if not bool(torch.isfinite(aq.sum())):
        check_finite(raw, "attention", layer=layer)
    torch.matmul(aq, q.transpose(-1, -2), out=out)


def _layer_dims(
    trace: Trace, layer: int, w_o: _OutProj, heads: list[int] | None = None
) -> tuple[Tensor, Tensor, Tensor, tuple]:
    """Ranks and dims `[H, n]` of one layer's selected heads, plus the projection data of
    both variants.

    The route follows the layer's key mask (`Trace.keys_seen`): all keys →
    one basis per head; keys ≤ i → the prefix machinery of `causal.py`; any
    other sets (windows, local attention) → `keysets.py`.
    """
    values = trace.values[layer] if heads is None else trace.values[layer, heads]
    check_finite(values, "values (E·W_V)", layer=layer)
    v = values.double()
    n_h, n, _ = v.shape  # n keys (the encoder's for cross-attention)
    if trace.sees_all_keys(layer):
        full_width = trace.out_proj.shape[-1] >= v.shape[-1]  # F is d_v × d_v
        q, rank = _encoder_basis(
            v, lambda: w_o.factor(layer), w_o.well_conditioned(layer), full_width
        )
        # The row-stochastic basis [q, w] is formed only when that variant is asked for.
        w, new = _ones_is_new(q, rank, v)
        rank_a = rank + new.long()
        rows = trace.n_tokens
        r = rank[:, None].expand(n_h, rows)  # one value per query row
        return r, n - r, n - rank_a[:, None].expand(n_h, rows), ("all", (q, w))
    causal = trace.key_mask is None and trace.is_causal and not trace.is_cross
    mask = None if causal else trace.keys_seen(layer)
    if mask is not None and mask.shape[0] != n:
        raise IdentifiableError(
            f"layer {layer}: a cross-attention trace must let every row see every key "
            "(its key mask is not all True); per-row key sets need self-attention"
        )
    width = None if mask is None else causal_band(mask)
    if width is not None:
        return _window_dims(v @ w_o.factor(layer), width)
    if mask is not None and not torch.equal(mask, torch.ones_like(mask).tril()):
        groups = keyset_groups(v @ w_o.factor(layer), mask, row_ids(v))
        rank, dim, dim_s = keyset_ranks(groups, n_h, n)
        return rank, dim, dim_s, ("keysets", groups)
    p, pa, owner = _causal_prefixes(trace, layer, v, w_o, heads)
    seen = torch.arange(1, n + 1, device=v.device)
    rank, rank_a = p.rank[owner], pa.rank[owner]
    return rank, seen - rank, seen - rank_a, ("causal", (p, pa, owner))


def _causal_prefixes(
    trace: Trace, layer: int, v: Tensor, w_o: _OutProj, heads: list[int] | None
) -> tuple[Prefixes, Prefixes, Tensor]:
    """Prefixes of X and [X, s·1] for the heads of a causal layer, and `owner` `[H]`: the
    matrix each head uses.

    X = V itself for a head whose H is proved well-conditioned (κ(H) < 1e3, so F is
    invertible and col(V_i F) = col(V_i) for every prefix), shared by the query heads
    that read one key/value head. Its rank decisions are those of V F whenever every
    pivot's distance exceeds 1.01e3 × the tolerance and every dependent distinct row's
    stays below it / 1.01e3: distances and σ_max change by factors within [σ_min(F),
    σ_max(F)], κ(F) = κ(H). Other heads (not proved, or without that margin) use V F.
    """
    n_h, _, d_v = v.shape
    kv = trace.kv_head_of if heads is None else trace.kv_head_of[heads]
    use_v = w_o.well_conditioned(layer).clone()
    use_v &= trace.out_proj.shape[-1] >= d_v  # F is d_v × d_v
    owner = torch.full((n_h,), -1, dtype=torch.long)
    mats: list[Tensor] = []
    for h in range(n_h):
        if not bool(use_v[h]) or owner[h] >= 0:
            continue
        same = torch.nonzero(use_v & (kv == kv[h]) & (owner < 0)).flatten()
        same = same[[bool(torch.equal(v[int(g)], v[h])) for g in same.tolist()]]
        owner[same] = len(mats)
        mats.append(v[h])
    p, pa = _prefix_pair(torch.stack(mats) if mats else v[:0])
    ok = _margin(p) & _margin(pa)
    redo = owner < 0
    redo[~redo] = ~ok[owner[~redo]]
    if bool(redo.any()):
        idx = torch.nonzero(redo).flatten()
        vp = v[idx] @ w_o.factor(layer)[idx]
        q, qa = _prefix_pair(vp)
        base = len(mats)
        p, pa = _concat(p, q), _concat(pa, qa)
        owner[idx] = base + torch.arange(idx.numel())
    return p, pa, owner


def _prefix_pair(x: Tensor) -> tuple[Prefixes, Prefixes]:
    """`prefixes` of X `[P, n, m]` and of [X, s·1] (‖s·1‖ = σ_max(X))."""
    smax, scale, xa = _with_ones(x)
    return prefixes(x, smax), prefixes(xa, scale)


def _with_ones(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """σ_max `[P]` of each X `[P, n, m]`, the scale of [X, s·1] and [X, s·1] itself."""
    n_p, n, k = x.shape
    smax = torch.linalg.matrix_norm(x, ord=2) if k and n_p else x.new_zeros(n_p)
    scale = torch.where(smax > 0, smax, torch.ones_like(smax))  # T = 0 still has [T, 1] of rank 1
    ones = (scale / n**0.5)[:, None, None].expand(n_p, n, 1)
    return smax, scale, torch.cat([x, ones], dim=-1)


def _window_dims(vp: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor, tuple]:
    """Ranks, dims and the `windows.WindowSolve` of X = V F and [X, s·1] per head."""
    smax, scale, xa = _with_ones(vp)
    paper = [WindowSolve(vp[h], width, smax[h]) for h in range(vp.shape[0])]
    stochastic = [WindowSolve(xa[h], width, scale[h]) for h in range(vp.shape[0])]
    seen = torch.clamp(torch.arange(1, vp.shape[1] + 1), max=width)
    rank = torch.stack([ws.rank for ws in paper])
    rank_a = torch.stack([ws.rank for ws in stochastic])
    return rank, seen - rank, seen - rank_a, ("windows", (paper, stochastic))


def _margin(p: Prefixes) -> Tensor:
    """`[P]` rank decisions far enough from the tolerance to be those of V F (κ(F) < 1e3)."""
    return (p.pivot_min > 1.01e3 * p.tol) & (p.dependent_max * 1.01e3 < p.tol)


def _concat(a: Prefixes, b: Prefixes) -> Prefixes:
    pairs = zip(vars(a).values(), vars(b).values(), strict=True)
    return Prefixes(*(torch.cat([x, y]) for x, y in pairs))


def _ones_is_new(q: Tensor, rank: Tensor, v: Tensor) -> tuple[Tensor | None, Tensor]:
    """Whether the ones vector adds a direction to col(q), as `ones_direction` decides,
    without its Gram-Schmidt passes in the usual case; the direction itself is
    formed later, only for the row-stochastic variant (None here).

    With u = 1/√n and c = qᵀu, ‖u − q c‖² = 1 − ‖c‖² + cᵀ(qᵀq − I)c, and q is
    orthonormal to ~1e-10 here (zero columns add nothing), so where 1 − ‖c‖² > 1e-6
    the distance is above 1e-3, far above the tolerance max(n, k + 1)·eps (~1e-13):
    the ones vector is new, exactly as the explicit passes would find. Otherwise
    (1 nearly in col(T)) the passes decide, after `ones_inside` (v: `[H, n, d_v]`).
    """
    n = q.shape[-2]
    c = q.sum(-2) * n**-0.5  # [H, k] = qᵀu
    if bool((1.0 - c.square().sum(-1) > 1e-6).all()):
        return None, torch.ones(q.shape[0], dtype=torch.bool, device=q.device)
    return ones_direction(q, ones_inside(rank, row_ids(v)))


def _encoder_basis(
    v: Tensor, factor_of: Callable[[], Tensor], well_h: Tensor, full_width: bool
) -> tuple[Tensor, Tensor]:
    """Basis `[H, n, k]` of col(T) and rank `[H]`, from V where H and V are both
    well-conditioned (then col(T) = col(V) and rank(T) = min(n, d_v)), else from V F
    (`factor_of()`, called only then; `full_width`: d ≥ d_v, so F is d_v × d_v)."""
    if not full_width or not bool(well_h.any()):
        q, rank, _, _ = _column_basis(v @ factor_of(), None)
        return q, rank
    if bool(well_h.all()) and v.shape[-2] >= v.shape[-1]:
        # The usual case: V well-conditioned by the eigensolver-free test, so Q = V L⁻ᵀ
        # (the same Cholesky QR as `_column_basis`, the same bits) and rank = d_v.
        ok, _, inverse = cholesky_if_well_conditioned(v.transpose(-1, -2) @ v)
        if bool(ok.all()):
            return v @ inverse.transpose(-1, -2), torch.full_like(ok, v.shape[-1], dtype=torch.long)
    q, rank, _, well_v = _column_basis(v, None)
    redo = ~(well_h & well_v)
    if bool(redo.any()):
        q[redo], rank[redo], _, _ = _column_basis(v[redo] @ factor_of()[redo], None)
    return q, rank
