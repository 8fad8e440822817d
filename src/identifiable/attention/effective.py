"""Null spaces and effective attention of a `Trace` (docs/definitions.md#null-spaces).

Layer by layer, in float64 whatever the trace's dtype (float32 projections only
as an explicit opt-in), batched over heads:
V' = V F (see `linalg.head_factors`) has the singular values and column space
of T = V H, so nothing n×d is ever formed. Encoders take an orthonormal basis
of col(V) (Cholesky QR when V and H are well-conditioned, else an SVD of V')
and project A's rows onto it; decoders use the prefix machinery of `causal.py`
(row i sees T[:i+1]).
`iter_effective_attention` streams one layer at a time so that callers that
only need statistics hold a single layer of n×n matrices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from identifiable.attention.causal import prefix_coordinates, project_rows_causal
from identifiable.attention.checks import check_finite, check_shapes
from identifiable.attention.keysets import keyset_groups, keyset_ranks, project_rows_keysets
from identifiable.attention.linalg import (
    _column_basis,
    certified_well_conditioned,
    cholesky_if_well_conditioned,
    head_factors,
    ones_direction,
)
from identifiable.errors import IdentifiableError
from identifiable.models.trace import Trace
from identifiable.precision import float32_matmul_precision, float32_matmuls_exact
from identifiable.results import Result

Variant = Literal["paper", "row-stochastic"]
VARIANTS: tuple[str, ...] = ("paper", "row-stochastic")


@dataclass(frozen=True)
class HeadFactors:
    """Per-head output-projection factors of one model (compute once, reuse across traces).

    Attributes:
        factor: `[L, H, d_v, k]` float64 F with sing(V F) = sing(V H).
        full_row_rank: `[L, H]` bool; True where col(T) = col(V) (the
            route that never forms T). Where False, V F is still exact for T.
        well_conditioned: `[L, H]` bool, κ(H) < 1e3: encoders then use V
            itself whenever V is well-conditioned too (same column space and
            rank, one small matrix product fewer).
    """

    factor: Tensor
    full_row_rank: Tensor
    well_conditioned: Tensor


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

    All tensors are `[L, H, n]` int64. For encoders every row holds the same
    value (the whole sequence's); for decoders row i describes T[:i+1], so the
    last row is the whole sequence.

    Attributes:
        rank: rank(T) (or rank(T[:i+1])).
        dim: dim LN(T) = keys seen by the row − rank.
        dim_stochastic: dim LN([T, 1]), the directions that keep rows summing to 1.
        out_proj_full_row_rank: `[L, H]` bool, see `HeadFactors`.
        is_causal: whether rows see prefixes only.
        tokens, model_name: labels of the trace (for displays and tables).
    """

    rank: Tensor
    dim: Tensor
    dim_stochastic: Tensor
    out_proj_full_row_rank: Tensor
    is_causal: bool
    tokens: list[str] | None = None
    model_name: str = ""


@dataclass(frozen=True)
class LayerEffective:
    """One layer's effective attention (A_eff is not a distribution: entries may be negative).

    Attributes:
        layer: layer index.
        raw: `[H, n, n]` raw attention A (the trace's tensor and dtype, not a copy).
        effective: `[H, n, n]` A_eff, float64 unless float32 was requested (masked
            causal entries exactly 0).
        rank, dim, dim_stochastic: `[H, n]` int64 as in `NullSpace`.
    """

    layer: int
    raw: Tensor
    effective: Tensor
    rank: Tensor
    dim: Tensor
    dim_stochastic: Tensor

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
        effective: `[L, H, n, n]` float64 (float32 only when requested).
        variant: "paper" (project off LN(T)) or "row-stochastic" (off LN([T, 1])).
        null_space: the dimensions of both null spaces.
        tokens, key_tokens, model_name: labels of the trace (key_tokens: the encoder's
            tokens of a cross-attention trace, else None).
    """

    raw: Tensor
    effective: Tensor
    variant: str
    null_space: NullSpace
    tokens: list[str] | None = None
    key_tokens: list[str] | None = None
    model_name: str = ""

    @property
    def null(self) -> Tensor:
        """`[L, H, n, n]` null attention A − A_eff in A_eff's dtype (computed on access)."""
        return self.raw.to(self.effective.dtype) - self.effective


def compute_head_factors(trace: Trace) -> HeadFactors:
    """Factor every head's output projection H once (reusable for any trace of the same model).

    Traces of one `Model` share one W_O tensor, so the factors are cached by
    that tensor's identity and version (an in-place change invalidates them);
    the cache holds no reference that keeps a W_O alive.
    """
    _check_trace_shapes(trace)
    w_o = trace.out_proj
    hit = _cached(_FACTOR_CACHE, w_o)
    if hit is not None:
        return hit
    check_finite(w_o, "output projection (W_O)", per_layer_head=True)
    # Layer by layer: a float64 copy of all of W_O (54 MB at BERT-base) is not needed at once.
    parts = [head_factors(w_o[layer].double()) for layer in range(trace.n_layers)]
    factors = HeadFactors(*(torch.stack(p) for p in zip(*parts, strict=True)))
    _FACTOR_CACHE[w_o] = (w_o._version, factors)
    return factors


def _cached(cache: WeakIdKeyDictionary, w_o: Tensor) -> object | None:
    hit = cache.get(w_o)
    return hit[1] if hit is not None and hit[0] == w_o._version else None


# W_O tensor → (its version when factored, factors). Keys by identity (a tensor's ==
# is elementwise) and weak: a dropped trace or model frees its entry.
_FACTOR_CACHE: WeakIdKeyDictionary = WeakIdKeyDictionary()


# W_O tensor → (its version, `[L, H]` flags of `certified_well_conditioned`), likewise.
_FLAGS_CACHE: WeakIdKeyDictionary = WeakIdKeyDictionary()


class _OutProj:
    """What the routes need of W_O for one trace: the κ(H) flags of every head, and
    the exact factors F (`compute_head_factors`) only for a layer whose route uses them.

    Exact `HeadFactors` are used when given or already cached, and for causal traces
    (every causal layer uses F). Otherwise the flags come from
    `certified_well_conditioned` (one float32 Gram, no float64 copy or product) when
    it proves every head well-conditioned, which is all that the usual encoder route
    needs; F is then factored only if some layer falls back to it. Every decision
    is the same either way: a proved head is well-conditioned, and of full row
    rank, in the exact test too.
    """

    def __init__(self, trace: Trace, factors: HeadFactors | None) -> None:
        _check_trace_shapes(trace)  # also when the factors are given or cached
        self._trace = trace
        exact = factors or _cached(_FACTOR_CACHE, trace.out_proj)
        flags = None if exact is not None or trace.is_causal else _certified_flags(trace)
        if flags is None:
            exact = exact or compute_head_factors(trace)
            flags = exact.well_conditioned
            self.full_row_rank: Tensor = exact.full_row_rank
        else:
            self.full_row_rank = flags  # proved κ(H) < 1e3: rank d_v
        self.well_conditioned: Tensor = flags
        self._exact: HeadFactors | None = exact

    def factor(self, layer: int) -> Tensor:
        """`[H, d_v, k]` F of one layer (see `HeadFactors`)."""
        if self._exact is None:
            self._exact = compute_head_factors(self._trace)
        return self._exact.factor[layer]


def _certified_flags(trace: Trace) -> Tensor | None:
    """`[L, H]` all-True flags when `certified_well_conditioned` proves every head, else None."""
    w_o = trace.out_proj
    flags = _cached(_FLAGS_CACHE, w_o)
    if flags is None:
        n_l, n_h, d_v, d = w_o.shape
        flags = certified_well_conditioned(w_o.reshape(n_l * n_h, d_v, d)).reshape(n_l, n_h)
        _FLAGS_CACHE[w_o] = (w_o._version, flags)
    return flags if bool(flags.all()) else None


def null_space(trace: Trace, *, factors: HeadFactors | None = None) -> NullSpace:
    """rank(T), dim LN(T) and dim LN([T, 1]) for every layer, head and row (see `NullSpace`)."""
    w_o = _OutProj(trace, factors)
    ranks, dims, dims_s = [], [], []
    for layer in range(trace.n_layers):
        r, d, ds, _ = _layer_dims(trace, layer, w_o)
        ranks.append(r)
        dims.append(d)
        dims_s.append(ds)
    return NullSpace(
        rank=torch.stack(ranks),
        dim=torch.stack(dims),
        dim_stochastic=torch.stack(dims_s),
        out_proj_full_row_rank=w_o.full_row_rank,
        is_causal=trace.is_causal,
        tokens=list(trace.tokens),
        model_name=trace.model_name,
    )


def iter_effective_attention(
    trace: Trace,
    variant: Variant = "paper",
    *,
    factors: HeadFactors | None = None,
    layers: Sequence[int] | None = None,
    dtype: torch.dtype = torch.float64,
) -> Iterator[LayerEffective]:
    """Yield `LayerEffective` for each layer in turn.

    Peak memory: the layer's A_eff ([H, n, n] of `dtype`) plus one layer's (encoders)
    or one row chunk's (decoders) temporaries, and whatever the caller keeps.
    `dtype`: see `effective_attention`.

    Raises IdentifiableError for an unknown variant, a layer out of range, an
    unsupported dtype, or NaN/inf in the attention or values of a head.
    """
    _check_request(variant, dtype)
    yield from _iter_layers(trace, variant, _OutProj(trace, factors), layers, dtype, None)


def effective_attention(
    trace: Trace,
    variant: Variant = "paper",
    *,
    factors: HeadFactors | None = None,
    dtype: torch.dtype = torch.float64,
    out: Tensor | None = None,
) -> EffectiveAttention:
    """Effective attention of all heads and layers, `[L, H, n, n]` float64.

    This materialises L·H·n² doubles (BERT-base at n = 512: 300 MB); use
    `iter_effective_attention` to stream layers instead.

    `dtype=torch.float32` is an explicit opt-in for speed and half the memory:
    bases, ranks and null-space dimensions are still computed in float64 with
    the same relative tolerances (so `null_space` is unchanged), and only the
    encoder projection A Q Qᵀ runs in float32 (decoder and key-set routes are
    computed in float64 and rounded). The invariant then holds to float32
    accuracy, ‖A_eff T − A T‖ ≤ 1e-5 ‖A T‖ per head (tested), instead of 1e-9.
    It needs full-precision float32 matmuls and raises under any reduced setting
    (`torch.set_float32_matmul_precision("high" | "medium")` or torch's per-backend
    settings, see `identifiable.precision`), since "medium" multiplies in bfloat16 on
    CPUs that support it (~3e-3 relative).

    `out`: a contiguous CPU tensor `[L, H, n, n_k]` of `dtype` to write A_eff into
    (returned as `.effective`), so that a loop over many sequences of one length
    reuses one buffer. A fresh result costs the kernel's zeroing of new pages
    whenever malloc has none to reuse: at BERT-base size and n = 512 in float32,
    36,864 page faults and 25-35 ms, 0.05-0.07× a forward pass (`bench_attention.py`).
    """
    n_l, n_h, n = trace.n_layers, trace.n_heads, trace.n_tokens
    # n_keys = n except for cross-attention traces (rows: decoder, keys: encoder).
    shape = (n_l, n_h, n, trace.n_keys)
    _check_request(variant, dtype)
    if out is not None:
        _check_out(out, shape, dtype, trace)
    w_o = _OutProj(trace, factors)
    effective = torch.empty(shape, dtype=dtype) if out is None else out
    rank = torch.empty(n_l, n_h, n, dtype=torch.long)
    dim, dim_s = torch.empty_like(rank), torch.empty_like(rank)
    # Each layer is written straight into `effective`: no per-layer buffer and copy.
    for le in _iter_layers(trace, variant, w_o, None, dtype, effective):
        rank[le.layer], dim[le.layer], dim_s[le.layer] = le.rank, le.dim, le.dim_stochastic
    labels = {"tokens": list(trace.tokens), "model_name": trace.model_name}
    ns = NullSpace(rank, dim, dim_s, w_o.full_row_rank, trace.is_causal, **labels)
    return EffectiveAttention(
        trace.attentions, effective, variant, ns, key_tokens=trace.key_tokens, **labels
    )


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


# ---- internals ---------------------------------------------------------------


_DTYPES = (torch.float64, torch.float32)


def _check_request(variant: str, dtype: torch.dtype) -> None:
    """One line for a variant or dtype the routes cannot honour (checked before any work)."""
    if variant not in VARIANTS:
        raise IdentifiableError(f"unknown variant {variant!r}: use one of {', '.join(VARIANTS)}")
    if dtype not in _DTYPES:
        raise IdentifiableError(
            f"unsupported dtype {dtype}: use torch.float64 (default) or torch.float32"
        )
    if dtype == torch.float32 and not float32_matmuls_exact():
        # "medium" makes a CPU with bfloat16 support multiply float32 in bfloat16: the
        # invariant then fails by ~3e-3 instead of holding to 1e-5 (measured here).
        raise IdentifiableError(
            "dtype=torch.float32 needs full-precision float32 matmuls, but they run at "
            f"reduced precision ('{float32_matmul_precision()}': ~1e-3 relative); call "
            "torch.set_float32_matmul_precision('highest') first, or use the default "
            "dtype=torch.float64"
        )


def _iter_layers(
    trace: Trace,
    variant: str,
    w_o: _OutProj,
    layers: Sequence[int] | None,
    dtype: torch.dtype,
    out: Tensor | None,
) -> Iterator[LayerEffective]:
    """`iter_effective_attention`, writing layer l into `out[l]` when `out` is given
    (the callers have checked `variant` and `dtype`)."""
    for layer in range(trace.n_layers) if layers is None else layers:
        trace.check_layer(layer)
        raw = trace.attentions[layer]
        rank, dim, dim_s, bases = _layer_dims(trace, layer, w_o)
        route, data = bases
        if route in ("keysets", "causal"):  # float64 routes; rounded only if asked
            check_finite(raw, "attention", layer=layer)
            if route == "keysets":
                res = project_rows_keysets(raw, data, stochastic=variant != "paper")
            else:
                res = project_rows_causal(raw, *data[0 if variant == "paper" else 1])
            eff = res.to(dtype) if out is None else out[layer].copy_(res)
            del res
        else:
            eff = torch.empty(raw.shape, dtype=dtype) if out is None else out[layer]
            q, w = data
            if w is None and variant != "paper":
                w, _ = ones_direction(q)
            basis = q if variant == "paper" else torch.cat([q, w], dim=-1)
            full = (dim if variant == "paper" else dim_s)[:, 0] == 0
            _project_encoder_layer(raw, basis, full, eff, layer)
        yield LayerEffective(layer, raw, eff, rank, dim, dim_s)
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


def _check_trace_shapes(trace: Trace) -> None:
    """Self-attention traces: `check_shapes`. Cross-attention traces (rows are the n
    decoder tokens, keys the n_k encoder tokens): A `[L, H, n, n_k]`, V `[L, H, n_k, d_v]`."""
    if not trace.is_cross:
        check_shapes(trace)
        return
    n_l, n_h, n, n_k = trace.n_layers, trace.n_heads, trace.n_tokens, trace.n_keys
    if tuple(trace.attentions.shape) != (n_l, n_h, n, n_k) or trace.values.dim() != 4:
        raise IdentifiableError(
            f"cross-attention trace: attentions have shape {tuple(trace.attentions.shape)} and "
            f"values {tuple(trace.values.shape)}, expected [L, H, n, n_k] = {[n_l, n_h, n, n_k]} "
            "and [L, H, n_k, d_v]; re-create the trace with identifiable.models"
        )
    if tuple(trace.out_proj.shape[:3]) != (n_l, n_h, trace.values.shape[-1]):
        raise IdentifiableError(
            f"the trace's output projection has shape {tuple(trace.out_proj.shape)}, expected "
            f"[L, H, d_v, d] = [{n_l}, {n_h}, {trace.values.shape[-1]}, d]"
        )


def _layer_dims(trace: Trace, layer: int, w_o: _OutProj) -> tuple[Tensor, Tensor, Tensor, tuple]:
    """Ranks and dims `[H, n]` of one layer plus the projection data of both variants.

    The route follows the layer's key mask (`Trace.keys_seen`): all keys →
    one basis per head; keys ≤ i → the prefix machinery of `causal.py`; any
    other sets (windows, local attention) → `keysets.py`.
    """
    check_finite(trace.values[layer], "values (E·W_V)", layer=layer)
    v = trace.values[layer].double()
    n_h, n, _ = v.shape  # n keys (the encoder's for cross-attention)
    if trace.sees_all_keys(layer):
        full_width = trace.out_proj.shape[-1] >= v.shape[-1]  # F is d_v × d_v
        q, rank = _encoder_basis(
            v, lambda: w_o.factor(layer), w_o.well_conditioned[layer], full_width
        )
        # The row-stochastic basis [q, w] is formed only when that variant is asked for.
        w, new = _ones_is_new(q)
        rank_a = rank + new.long()
        rows = trace.n_tokens
        r = rank[:, None].expand(n_h, rows)  # one value per query row
        return r, n - r, n - rank_a[:, None].expand(n_h, rows), ("all", (q, w))
    mask = trace.keys_seen(layer)
    if mask.shape[0] != n:
        raise IdentifiableError(
            f"layer {layer}: a cross-attention trace must let every row see every key "
            "(its key mask is not all True); per-row key sets need self-attention"
        )
    vp = v @ w_o.factor(layer)
    if not torch.equal(mask, torch.ones_like(mask).tril()):
        groups = keyset_groups(vp, mask)
        rank, dim, dim_s = keyset_ranks(groups, n_h, n)
        return rank, dim, dim_s, ("keysets", groups)
    k = vp.shape[-1]
    smax = torch.linalg.matrix_norm(vp, ord=2) if k else vp.new_zeros(n_h)
    scale = torch.where(smax > 0, smax, torch.ones_like(smax))  # T = 0 still has [T, 1] of rank 1
    ones = (scale / n**0.5)[:, None, None].expand(n_h, n, 1)  # ‖s·1‖ = σ_max(T)
    c, pr = prefix_coordinates(vp, smax)
    ca, pra = prefix_coordinates(torch.cat([vp, ones], dim=-1), scale)
    seen = torch.arange(1, n + 1, device=vp.device)
    return pr, seen - pr, seen - pra, ("causal", ((c, pr), (ca, pra)))


def _ones_is_new(q: Tensor) -> tuple[Tensor | None, Tensor]:
    """Whether the ones vector adds a direction to col(q), as `ones_direction` decides,
    without its Gram-Schmidt passes in the usual case; the direction itself is
    formed later, only for the row-stochastic variant (None here).

    With u = 1/√n and c = qᵀu, ‖u − q c‖² = 1 − ‖c‖² + cᵀ(qᵀq − I)c, and q is
    orthonormal to ~1e-10 here (zero columns add nothing), so where 1 − ‖c‖² > 1e-6
    the distance is above 1e-3, far above the tolerance max(n, k + 1)·eps (~1e-13):
    the ones vector is new, exactly as the explicit passes would find. Otherwise
    (1 nearly in col(T)) the passes decide.
    """
    n = q.shape[-2]
    c = q.sum(-2) * n**-0.5  # [H, k] = qᵀu
    if bool((1.0 - c.square().sum(-1) > 1e-6).all()):
        return None, torch.ones(q.shape[0], dtype=torch.bool, device=q.device)
    return ones_direction(q)


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
