"""The routes of effective attention for one layer: rank decisions and projections.

`layer_dims` picks the route from the layer's key mask (all keys, keys ≤ i, a causal
window, other key sets) and makes the float64 rank decisions; `project_layer` projects
A's rows with them. Both run on the trace's device: the float64 work on the device
itself where it computes in float64, else on the CPU (`precision.exact_device`: MPS),
and the n×n products on the trace's device in the call's dtype. On a device without
float64 the window and key-set routes, whose projections are float64, run on the CPU
and their rows are copied back (docs/definitions.md#devices).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import Tensor

from identifiable.attention.causal import (
    Prefixes,
    append_row,
    distinct_start,
    first_rows,
    prefixes,
    project_prefixes,
)
from identifiable.attention.checks import check_finite
from identifiable.attention.keysets import keyset_groups, keyset_ranks, project_rows_keysets
from identifiable.attention.linalg import (
    _column_basis,
    cholesky_if_well_conditioned,
    ones_direction,
    ones_inside,
    row_ids,
    sigma_max,
)
from identifiable.attention.outproj import OutProj
from identifiable.attention.windows import WindowSolve, causal_band
from identifiable.errors import IdentifiableError
from identifiable.models.trace import Trace
from identifiable.utils.precision import exact_device, has_float64
from identifiable.utils.threads import one_thread


def project_layer(
    raw: Tensor,
    variant: str,
    bases: tuple,
    dims: tuple[Tensor, Tensor],
    out: Tensor,
    dtype: torch.dtype,
    layer: int,
    small: Callable[[], AbstractContextManager[Any]] | None = None,
    rows: int | None = None,
    solves: dict[tuple, Any] | None = None,
) -> None:
    """Write A_eff of one layer's heads `raw` `[H, n, n_k]` into `out` (same shape and
    device, of `dtype`), with the route data `bases` of `layer_dims` and its dims
    (`dim`, `dim_stochastic`, `[H, n]`); `small`, `rows`: the context of the causal
    route's small float64 solves (default `small_work`), its rows per chunk and a dict
    kept with `bases` to reuse its block solves (`causal.project_prefixes`)."""
    route, data = bases
    if route in ("windows", "keysets"):
        check_finite(raw, "attention", layer=layer)
        if not has_float64(raw.device):  # float64 projections: on the CPU, rows copied back
            host = torch.empty(raw.shape, dtype=dtype)
            project_layer(raw.cpu(), variant, bases, dims, host, dtype, layer)
            out.copy_(host)
            return
    if route == "windows":
        for h, solve in enumerate(data[0 if variant == "paper" else 1]):
            solve.project(raw[h], out[h], dtype)
    elif route == "keysets":  # a float64 route, rounded only if asked
        out.copy_(project_rows_keysets(raw, data, stochastic=variant != "paper"))
    elif route == "causal":
        check_finite(raw, "attention", layer=layer)
        p, pa, owner = data
        chosen = p if variant == "paper" else pa
        chunk = {} if rows is None else {"rows": rows}
        small = small or small_work(chosen.coords.device)
        project_prefixes(
            raw, chosen, owner=owner, out=out, dtype=dtype, small=small, solves=solves, **chunk
        )
    else:
        q, w = data
        if w is None and variant != "paper":
            w, _ = ones_direction(q)
        basis = q if variant == "paper" else torch.cat([q, w], dim=-1)
        full = (dims[0] if variant == "paper" else dims[1])[:, 0] == 0
        _project_encoder_layer(raw, basis, full, out, layer)


def small_work(device: torch.device) -> Callable[[], AbstractContextManager[Any]]:
    """The context of the causal route's float64 factorisations and small solves: one
    intra-op thread where they run on the CPU (`utils.threads.one_thread`: on a shared
    CPU a second thread waits on a descheduled peer at every kernel of these thousands of
    small ones, benchmarks/records/mla.md); the n×n products run outside it."""
    return one_thread if exact_device(device).type == "cpu" else nullcontext


def _project_encoder_layer(
    raw: Tensor, basis: Tensor, full: Tensor, out: Tensor, layer: int
) -> None:
    """out[h] = A[h] Q[h] Q[h]ᵀ for every head, and A[h] itself where `full[h]`.

    Two batched GEMMs over the heads: A Q is a small [H, n, k] temporary, so
    `out` can take the second product. A float64 `out` first receives A (the
    one conversion); a float32 `out` multiplies the trace's float32 A directly,
    with no n×n copy. Rows with rank(T) = keys seen keep A exactly, not A up
    to rounding. The basis is cast to `out`'s dtype and device (float32 only when
    opted in, or on a device without float64).

    Finiteness of A is checked on A Q ([H, n, k], not n×n): a NaN or inf
    anywhere in a row of A makes every entry of that row of A Q non-finite
    (inf · 0 is NaN), so only then is A itself scanned, to name the head.
    """
    q = basis.to(out.device, out.dtype)
    if bool(full.any()):  # rare (n ≤ d_v): project head by head, skipping the identity ones
        check_finite(raw, "attention", layer=layer)
        out.copy_(raw)
        for h in torch.nonzero(~full).flatten().tolist():
            torch.matmul(out[h] @ q[h], q[h].transpose(-1, -2), out=out[h])
        return
    # float32 uses A as it is, and forms (A Q)ᵀ = Qᵀ Aᵀ: MKL's kernel for that
    # orientation takes 8-15 % less time at BERT-base size, while in float64 it takes
    # more (bench_attention.py, "orientation"). A float64 `out` first receives A (the
    # one conversion) and keeps A Q.
    aq = (q.mT @ raw.mT).mT if raw.dtype == out.dtype else out.copy_(raw) @ q
    if not bool(torch.isfinite(aq.sum())):
        check_finite(raw, "attention", layer=layer)
    torch.matmul(aq, q.transpose(-1, -2), out=out)


def layer_dims(
    trace: Trace, layer: int, w_o: OutProj, heads: list[int] | None = None
) -> tuple[Tensor, Tensor, Tensor, tuple]:
    """Ranks and dims `[H, n]` of one layer's selected heads, plus the projection data of
    both variants, on `precision.exact_device` of the trace's device.

    The route follows the layer's key mask (`Trace.keys_seen`): all keys →
    one basis per head; keys ≤ i → the prefix machinery of `causal.py`; a causal
    window → `windows.py`; any other sets (local attention, padding) → `keysets.py`.
    """
    values = trace.values[layer] if heads is None else trace.values[layer, heads]
    check_finite(values, "values (E·W_V)", layer=layer)
    v = values.to(exact_device(values.device), torch.float64)
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
    mask = None if causal else trace.keys_seen(layer).to(v.device)
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
    with small_work(v.device)():
        p, pa, owner = _causal_prefixes(trace, layer, v, w_o, heads)
    seen = torch.arange(1, n + 1, device=v.device)
    rank, rank_a = p.rank[owner], pa.rank[owner]
    return rank, seen - rank, seen - rank_a, ("causal", (p, pa, owner))


def _causal_prefixes(
    trace: Trace, layer: int, v: Tensor, w_o: OutProj, heads: list[int] | None
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
    kv = (trace.kv_head_of if heads is None else trace.kv_head_of[heads]).to(v.device)
    use_v = w_o.well_conditioned(layer).clone()
    use_v &= trace.out_proj.shape[-1] >= d_v  # F is d_v × d_v
    owner = torch.full((n_h,), -1, dtype=torch.long, device=v.device)
    mats: list[int] = []
    for h in range(n_h):
        if not bool(use_v[h]) or owner[h] >= 0:
            continue
        same = torch.nonzero(use_v & (kv == kv[h]) & (owner < 0)).flatten()
        same = same[torch.tensor([bool(torch.equal(v[int(g)], v[h])) for g in same.tolist()])]
        owner[same] = len(mats)
        mats.append(h)
    # equal rows of V are equal rows of V F and of T: found once, for V's matrices and
    # the V F ones alike (a product need not round equal rows equally, see `row_ids`)
    redo = owner < 0
    need = sorted(set(mats) | set(torch.nonzero(redo).flatten().tolist()))
    group = torch.zeros(n_h, v.shape[1], dtype=torch.long, device=v.device)
    if need:
        group[need] = first_rows(row_ids(v[need]))
    p, pa = _prefix_pair(v[mats], group[mats])
    ok = _margin(p) & _margin(pa)
    redo[~redo] = ~ok[owner[~redo]]
    if bool(redo.any()):
        idx = torch.nonzero(redo).flatten()
        if not set(idx.tolist()) <= set(need):
            group[idx] = first_rows(row_ids(v[idx]))
        vp = v[idx] @ w_o.factor(layer)[idx]
        q, qa = _prefix_pair(vp, group[idx])
        base = len(mats)
        p, pa = _concat(p, q), _concat(pa, qa)
        owner[idx] = base + torch.arange(idx.numel(), device=v.device)
    return p, pa, owner


def _prefix_pair(x: Tensor, group: Tensor) -> tuple[Prefixes, Prefixes]:
    """`prefixes` of X `[P, n, m]` and of [X, s·1] (‖s·1‖ = σ_max(X)); `group` `[P, n]`
    the first equal row of each row of X (and of [X, s·1]). One QR of Xᵀ serves both:
    [X, s·1]'s R appends the row s·1ᵀ to it (`causal.append_row`)."""
    smax, scale, xa, smax_a = _with_ones(x)
    n, m = x.shape[-2:]
    cand = distinct_start(group, min(n, m))
    xc = x if bool(cand.all()) else x[cand]
    r = torch.linalg.qr(xc.transpose(-1, -2), mode="r")[1]
    cand_a = distinct_start(group, min(n, m + 1))  # ⊂ cand: [X, s·1] checks one row more
    ra = append_row(r[cand_a[cand]], xa[cand_a, :, -1])
    return prefixes(x, smax, group, smax, r), prefixes(xa, scale, group, smax_a, ra)


def _with_ones(x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """σ_max `[P]` of each X `[P, n, m]`, the scale of [X, s·1], [X, s·1] itself and its
    σ_max, both σ_max from the (m + 1)² Gram matrix of [X, s·1] (`linalg.sigma_max`)."""
    n_p, n, k = x.shape
    gram = x.new_zeros(n_p, k + 1, k + 1)
    gram[:, :k, :k] = x.transpose(-1, -2) @ x
    smax = sigma_max(x, gram[:, :k, :k]) if k else x.new_zeros(n_p)
    scale = torch.where(smax > 0, smax, torch.ones_like(smax))  # T = 0 still has [T, 1] of rank 1
    s = scale / n**0.5
    gram[:, :k, k] = gram[:, k, :k] = x.sum(-2) * s[:, None]
    gram[:, k, k] = s * s * n
    ones = s[:, None, None].expand(n_p, n, 1)
    return smax, scale, torch.cat([x, ones], dim=-1), sigma_max(x, gram)


def _window_dims(vp: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor, tuple]:
    """Ranks, dims and the `windows.WindowSolve` of X = V F and [X, s·1] per head."""
    smax, scale, xa, _ = _with_ones(vp)
    paper = [WindowSolve(vp[h], width, smax[h]) for h in range(vp.shape[0])]
    stochastic = [WindowSolve(xa[h], width, scale[h]) for h in range(vp.shape[0])]
    seen = torch.clamp(torch.arange(1, vp.shape[1] + 1, device=vp.device), max=width)
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
