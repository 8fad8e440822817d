"""Prefix (causal) version of the projections in `linalg.py`.

In a decoder, query row i may only weight keys 0..i, so its relevant matrix is
X_i = X[:i+1] (X = V' or [V', s·1], see `linalg.py`) and its effective row is the
projection of a_i onto col(X_i) ⊂ R^{i+1}. Work per head is O(n²·k) (two GEMMs, as
for an encoder) plus O(n·k²); k = min(n, m).

1. Pivots (`prefixes`). Row j is a *pivot* when it is independent of the rows before
   it (its distance from their span exceeds the rank tolerance); rank(X_i) is the
   number of pivots ≤ i. Generic heads (the first k rows independent) are decided by
   one Householder QR of Xᵀ. Otherwise exact duplicate rows (repeated tokens: the
   value rows of one token are bit-for-bit equal in a first layer) are merged first;
   their first occurrences go through the same QR, and only a first occurrence that
   is nevertheless dependent (saturation at rank(X), or a genuine linear relation)
   costs an extra pass over the rest (`_scan_pivots`). No per-row loop.
   The pivot rows' QR gives an echelon basis of the row space: coords C = X Bᵀ has
   C[j, c] = 0 for c ≥ rank(X_j), so col(X_i) = col(C[:i+1]).
2. Rows whose prefix has independent distinct rows (rank(X_i) = number of distinct
   rows ≤ i: every row before the first dependent distinct row) need no linear
   algebra: col(X_i) is then exactly the vectors that are constant on each group of
   equal rows, and the projection of a_i replaces each weight by the mean weight of
   its group (rows without repeats keep a_i as it is).
3. The other rows solve y_i G_i = a_i C with G_i = C_iᵀ C_i (+1 on the diagonal of
   coordinates not yet active, which a_i C leaves at 0), in blocks that start at
   every pivot and at most `block` rows apart: per block one Cholesky factor of the
   Gram at its first row, and the rows after it by a Woodbury update through the
   leading blocks of one small Cholesky factorisation (`_BlockSolve`). A_eff =
   tril(Y Cᵀ). The normal equations square the condition number of X_i, which
   float64 absorbs: tests match a per-row SVD to 1e-9, and to 1e-8 for prefixes
   with κ ≈ 1e6.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from identifiable.attention.linalg import rank_tolerance, sigma_max

_ROW_CHUNK = 256  # rows per GEMM chunk of the n×n products (lower triangle only)


@dataclass(frozen=True)
class Prefixes:
    """Prefix structure of B matrices X `[B, n, m]` (one per head), k = min(n, m).

    Attributes:
        coords: `[B, n, k]` float64 echelon coordinates, coords[b, j, c] = 0 for
            c ≥ rank[b, j]; col(coords[b, :i+1]) = col(X[b, :i+1]).
        rank: `[B, n]` int64, rank(X[b, :i+1]) for each row i.
        group: `[B, n]` int64, the first row equal to row j (j itself if none).
        mean_end: `[B]` int64; rows i < mean_end[b] are projected by group means.
        pivot_min: `[B]` float64, the smallest distance of a pivot row from the span
            of the rows before it (inf without pivots).
        dependent_max: `[B]` float64, the largest such distance of a row found
            dependent that is not an exact duplicate (0 if none).
        tol: `[B]` float64, the rank tolerance used.
    """

    coords: Tensor
    rank: Tensor
    group: Tensor
    mean_end: Tensor
    pivot_min: Tensor
    dependent_max: Tensor
    tol: Tensor


def prefixes(
    x: Tensor,
    scale: Tensor,
    group: Tensor | None = None,
    smax: Tensor | None = None,
    r: Tensor | None = None,
) -> Prefixes:
    """Pivots, prefix ranks and echelon coordinates of each X (see the module docstring).

    Args:
        x: `[B, n, m]` float64.
        scale: `[B]` σ_max of each X (the relative tolerance's scale; one per sequence
            and head): tolerance σ_max · max(n, m) · eps(float64).
        group: `[B, n]` int64, the first row of each X bit-for-bit equal to each row
            (`first_occurrence`, or `linalg.row_ids` of the matrix X is a product of),
            where the caller knows it; else found here for the heads that need it.
        smax: `[B]` σ_max of each X, the rounding level of `_floor` for heads with
            dependent rows among the first k (default: computed for those heads).
        r: `[C, k, n]` the R factor of Xᵀ = Q R for the C heads whose first k rows are
            distinct (`distinct_start`; all heads without `group`), where the caller
            has it (`append_row` makes [X, s·1]'s from X's).
    """
    bsz, n, m = x.shape
    k = min(n, m)
    tol = rank_tolerance(scale, n, m)
    dev = x.device
    rows = torch.arange(n, device=dev)
    coords = x.new_zeros(bsz, n, k)
    rank = (rows + 1).clamp(max=k).expand(bsz, n).clone()
    groups = rows.expand(bsz, n).clone()
    mean_end = torch.full((bsz,), k, dtype=torch.long, device=dev)
    pivot_min = torch.full((bsz,), float("inf"), dtype=torch.float64, device=dev)
    dependent_max = torch.zeros(bsz, dtype=torch.float64, device=dev)
    if k == 0:
        return Prefixes(coords, rank * 0, groups, mean_end * 0, pivot_min, dependent_max, tol)
    # A head with an exact duplicate among its first k rows is decided by the pivots.
    cand = torch.ones_like(tol, dtype=torch.bool) if group is None else distinct_start(group, k)
    if r is None:
        xc = x if bool(cand.all()) else x[cand]
        r = torch.linalg.qr(xc.transpose(-1, -2), mode="r")[1]  # r: [C, k, n]
    diag = torch.diagonal(r, dim1=-2, dim2=-1).abs()  # [C, k]
    norms = torch.linalg.vector_norm(x[cand, :k], dim=-1)
    ok = (diag > _floor(diag, norms, scale[cand], tol[cand], m)).all(-1)
    fast = torch.zeros_like(cand)
    fast[cand] = ok
    coords[fast] = r[ok].transpose(-1, -2)  # lower trapezoidal: echelon already
    pivot_min[fast] = diag[ok].amin(-1)
    slow = torch.nonzero(~fast).flatten()
    if slow.numel():
        if group is None:
            group = torch.stack([first_occurrence(x[int(b)]) for b in slow.tolist()])
        else:
            group = group[slow]
        smax = sigma_max(x[slow]) if smax is None else smax[slow]
        # Heads with the same equal rows (all heads of a first layer's latent values) share
        # the distinct rows' positions: one batched QR for them.
        kinds, which = torch.unique(group, dim=0, return_inverse=True)
        for kind in range(kinds.shape[0]):
            sub = which == kind
            idx = slow[sub]
            out = _slow_prefixes(x[idx], kinds[kind], tol[idx], smax[sub], k)
            coords[idx], rank[idx], groups[idx] = out[0], out[1], out[2]
            mean_end[idx], pivot_min[idx], dependent_max[idx] = out[3], out[4], out[5]
    return Prefixes(coords, rank, groups, mean_end, pivot_min, dependent_max, tol)


def prefix_coordinates(x: Tensor, scale: Tensor) -> tuple[Tensor, Tensor]:
    """`(coords, rank)` of `prefixes` (see there)."""
    p = prefixes(x, scale)
    return p.coords, p.rank


_EPS = torch.finfo(torch.float64).eps
_NOISE = 4.0  # rounding in a distance to the span of ill-conditioned pivots: 4·m·eps·κ·‖x_j‖


def _floor(
    diag: Tensor, norms: Tensor, smax: Tensor, tol: Tensor, m: int, start: float = float("inf")
) -> Tensor:
    """`[B, c]` the level below which a computed distance of row j from the span of the
    pivots before it cannot be told from 0: the rank tolerance, or the rounding that span
    carries when those pivots are ill-conditioned (4·m·eps·‖x_j‖·σ_max / the smallest
    pivot distance before j), whichever is larger. Independent rows of real data sit far
    above both; without the second term a dependent row after nearly parallel pivots
    (κ ≈ 1e3) passed the tolerance by rounding alone (tested)."""
    before = torch.cummin(
        torch.cat([torch.full_like(diag[:, :1], start), diag[:, :-1]], 1), 1
    ).values
    noise = _NOISE * m * _EPS * norms * smax[:, None] / before.clamp_min(1e-300)
    return torch.maximum(noise, tol.reshape(-1, 1).expand_as(noise))


def first_occurrence(x: Tensor) -> Tensor:
    """`[n]` int64: for each row of x `[n, m]`, the first row bit-for-bit equal to it."""
    n = x.shape[0]
    _, inverse = torch.unique(x, dim=0, return_inverse=True)
    first = torch.full((n,), n, dtype=torch.long, device=x.device)
    first.scatter_reduce_(0, inverse, torch.arange(n, device=x.device), reduce="amin")
    return first[inverse]


def distinct_start(group: Tensor, k: int) -> Tensor:
    """`[B]` bool: the first k rows of each matrix are distinct (`group` `[B, n]` as in
    `Prefixes`), so that one QR may find them independent (`prefixes`' fast route)."""
    return (group[:, :k] == torch.arange(k, device=group.device)).all(-1)


def append_row(r: Tensor, w: Tensor, panel: int = 16) -> Tensor:
    """The R factor of [Xᵀ; wᵀ] from R `[B, k, n]` of Xᵀ = Q R (upper trapezoidal) and the
    new row w `[B, n]`: `[B, min(k + 1, n), n]`. R's rows are taken `panel` at a time with
    w: a Householder QR of their (panel + 1) × panel leading block, whose Q then turns the
    columns after it (one GEMM); O(panel·k·n) against O(k²·n) for a new QR, and backward
    stable as it is."""
    k, n = r.shape[-2:]
    r, w = r.clone(), w[:, None].clone()  # w: [B, 1, n]
    for j0 in range(0, min(k, n), panel):
        j1 = min(j0 + panel, k, n)
        lead = torch.cat([r[:, j0:j1, j0:j1], w[:, :, j0:j1]], 1)  # [B, j1 - j0 + 1, j1 - j0]
        q, rp = torch.linalg.qr(lead, mode="complete")
        r[:, j0:j1, j0:j1] = rp[:, :-1]
        w[:, :, j0:j1] = 0.0  # eliminated: R's last row is exactly zero
        if j1 < n:
            rest = q.transpose(-1, -2) @ torch.cat([r[:, j0:j1, j1:], w[:, :, j1:]], 1)
            r[:, j0:j1, j1:] = rest[:, :-1]
            w[:, :, j1:] = rest[:, -1:]
    return torch.cat([r, w], 1) if k < n else r


def first_rows(ids: Tensor) -> Tensor:
    """`[B, n]` int64: for each row, the first row of its matrix with the same id (`ids`
    `[B, n]` from `linalg.row_ids`, which gives equal rows equal ids)."""
    bsz, n = ids.shape
    dev = ids.device
    per_matrix = ids + (ids.amax() + 1) * torch.arange(bsz, device=dev)[:, None]
    key = torch.unique(per_matrix, return_inverse=True)[1].flatten()
    first = torch.full((bsz * n,), n, dtype=torch.long, device=dev)
    first.scatter_reduce_(0, key, torch.arange(n, device=dev).repeat(bsz), reduce="amin")
    return first[key].reshape(bsz, n)


def _slow_prefixes(x: Tensor, group: Tensor, tol: Tensor, smax: Tensor, k: int) -> tuple:
    """Heads `x` `[b, n, m]` with the same equal rows `group` `[n]` whose first k rows are
    not independent: merge duplicates, find pivots (`[b, ...]` fields of `Prefixes`)."""
    bsz, n, m = x.shape
    dev = x.device
    firsts = torch.nonzero(group == torch.arange(n, device=dev)).flatten()  # distinct, in order
    slot = torch.zeros(n, dtype=torch.long, device=dev)
    slot[firsts] = torch.arange(firsts.numel(), device=dev)
    slot = slot[group]  # each row's position among the distinct rows
    d = x[:, firsts]
    r = torch.linalg.qr(d.transpose(-1, -2), mode="r")[1]  # r: [b, k_u, n_u]
    k_u = min(m, firsts.numel())
    diag = torch.diagonal(r, dim1=-2, dim2=-1).abs()
    norms = torch.linalg.vector_norm(d[:, :k_u], dim=-1)
    ok = (diag > _floor(diag, norms, smax, tol, m)).all(-1)
    coords = x.new_zeros(bsz, n, k)
    # the usual case, only duplicates dependent: the distinct rows' R is echelon already
    coords[:, :, :k_u] = r.transpose(-1, -2)[:, slot]
    rank = (slot + 1).clamp(max=k_u).expand(bsz, n).clone()
    rank = torch.cummax(rank, -1).values  # a duplicate adds no pivot
    first_dependent = int(firsts[k_u]) if firsts.numel() > k_u else n
    mean_end = torch.full((bsz,), first_dependent, dtype=torch.long, device=dev)
    pivot_min = diag.amin(-1) if k_u else x.new_full((bsz,), float("inf"))
    dependent_max = x.new_zeros(bsz)
    for b in torch.nonzero(~ok).flatten().tolist():
        one = _pivot_prefix(x[b], group, firsts, float(tol[b]), k)
        coords[b], rank[b], mean_end[b], pivot_min[b], dependent_max[b] = one
    return coords, rank, group.expand(bsz, n), mean_end, pivot_min, dependent_max


def _pivot_prefix(x: Tensor, group: Tensor, firsts: Tensor, tol: float, k: int) -> tuple:
    """One head with a dependent distinct row: its pivots by `_scan_pivots`."""
    n = x.shape[0]
    dev = x.device
    basis, piv, pivot_min, dependent_max, first_dependent = _scan_pivots(x[firsts], firsts, tol, n)
    is_pivot = torch.zeros(n, dtype=torch.bool, device=dev)
    is_pivot[piv] = True
    rank = torch.cumsum(is_pivot.long(), 0)
    coords = x.new_zeros(n, k)
    coords[:, : basis.shape[1]] = x @ basis
    # Drop sub-tolerance components outside each row's own prefix span (what the rank
    # decision means; it makes the coordinates echelon), and make equal rows equal.
    coords *= torch.arange(k, device=dev)[None, :] < rank[:, None]
    return coords[group], rank, first_dependent, pivot_min, dependent_max


def _scan_pivots(d: Tensor, firsts: Tensor, tol: float, n: int) -> tuple:
    """Pivots among distinct rows d `[n_u, m]` (positions `firsts`) when some of them are
    dependent: each pass removes the candidates already in the span found so far, then
    takes the leading independent run of one QR; a pass ends at a dependent candidate,
    so passes = dependent candidates inside such runs + ⌈pivots / m⌉."""
    m = d.shape[1]
    smax = float(torch.linalg.matrix_norm(d, ord=2))
    basis = d.new_zeros(m, 0)
    pivots: list[Tensor] = []
    cand = torch.arange(d.shape[0], device=d.device)
    pivot_min, dependent_max, first_dependent = float("inf"), 0.0, n
    while cand.numel() and basis.shape[1] < m:
        res = d[cand]
        for _ in range(2):  # classical Gram-Schmidt twice: orthogonal to working precision
            res = res - (res @ basis) @ basis.T
        norms = torch.linalg.vector_norm(res, dim=-1)
        noise = _NOISE * m * _EPS * torch.linalg.vector_norm(d[cand], dim=-1) * smax / pivot_min
        dep = norms <= torch.clamp(noise, min=tol) if pivots else norms <= tol
        if bool(dep.any()):
            dependent_max = max(dependent_max, float(norms[dep].max()))
            first_dependent = min(first_dependent, int(firsts[cand[dep][0]]))
            cand, res = cand[~dep], res[~dep]
            if not cand.numel():
                break
        width = min(m - basis.shape[1], cand.numel())
        q, r = torch.linalg.qr(res[:width].T)
        diag = torch.diagonal(r).abs()
        norm = torch.linalg.vector_norm(d[cand[:width]], dim=-1)[None]
        low = _floor(
            diag[None], norm, d.new_full((1,), smax), d.new_full((1,), tol), m, start=pivot_min
        )
        bad = torch.nonzero(diag <= low[0]).flatten()
        take = int(bad[0]) if bad.numel() else width
        new = q[:, :take]
        new = new - basis @ (basis.T @ new)
        new = new / torch.linalg.vector_norm(new, dim=0, keepdim=True)
        basis = torch.cat([basis, new], dim=1)
        pivots.append(cand[:take])
        if take:
            pivot_min = min(pivot_min, float(diag[:take].min()))
        if bad.numel():
            dependent_max = max(dependent_max, float(diag[take]))
            first_dependent = min(first_dependent, int(firsts[cand[take]]))
            cand = cand[take + 1 :]
        else:
            cand = cand[take:]
    if cand.numel():  # saturated: every remaining distinct row is dependent
        first_dependent = min(first_dependent, int(firsts[cand[0]]))
    piv = firsts[torch.cat(pivots)] if pivots else firsts[:0]
    return basis, piv, pivot_min, dependent_max, first_dependent


# ---- projection ----------------------------------------------------------------------


def project_prefixes(
    a: Tensor,
    p: Prefixes,
    *,
    owner: Tensor | None = None,
    out: Tensor | None = None,
    dtype: torch.dtype = torch.float64,
    block: int | None = None,
    small: Callable[[], AbstractContextManager[Any]] = nullcontext,
    rows: int = _ROW_CHUNK,
    solves: dict[tuple, Any] | None = None,
) -> Tensor:
    """Project each row a_i onto col(X[:i+1]); masked keys stay exactly 0.

    Consecutive heads whose matrices share their pivots and equal rows (every head of a
    generic layer, or of a first layer whose repeated tokens repeat in every head) are
    projected together: one batched product per row chunk, one batched block solve.

    Args:
        a: `[H, n, n]` lower triangular (causal attention), any float dtype.
        p: `Prefixes` of P matrices; head h uses matrix `owner[h]` (default: h), so
            heads that share X (grouped-query heads with V itself) share its solves.
        out: `[H, n, n]` of `dtype` to write into (default: a new tensor).
        dtype: float64, or float32 for the two n×n products (solves stay float64).
        block: rows per Woodbury block (default 3k/4, at least 16: 0.25 s against 0.31-0.36 s
            for k/2 in one batch of 8 block solves at n = 2,048, k = 128, on one thread).
        small: a context the small float64 solves run in (the scan's `one_thread` on
            the CPU); the n×n products run outside it.
        rows: rows per chunk of the n×n products, per head (fewer, larger kernels for
            the scan); a batch of heads takes `_BATCH_ROWS` rows in all.
        solves: a dict the caller keeps with `p` to reuse the block solves of its
            matrices in later calls (the scan's groups of heads that read one X).
    Returns: `out`. Rows whose prefix has full row rank are copied, not rounded.
    """
    n_h = a.shape[0]
    owner = torch.arange(n_h, device=p.coords.device) if owner is None else owner
    out = torch.empty(a.shape, dtype=dtype, device=a.device) if out is None else out
    size = block or max(16, 3 * p.coords.shape[-1] // 4)
    for h0, h1, mats, r in _runs(p, owner.tolist(), max(1, _BATCH_ROWS // rows)):
        _project_run(a[h0:h1], p, mats, r, out[h0:h1], dtype, (size, rows), small, solves)
    return out


def project_rows_causal(a: Tensor, p: Prefixes, **kwargs) -> Tensor:
    """`project_prefixes` with one matrix per head (`p` from `prefixes`)."""
    return project_prefixes(a, p, **kwargs)


_BATCH_ROWS = 2048  # rows of all heads in one chunk of batched products
_SOLVE_BYTES = 64 * 2**20  # float64 temporaries of one batch of block solves


def _runs(p: Prefixes, owner: list[int], most: int) -> list[tuple[int, int, list[int], int]]:
    """`(h0, h1, mats, r)`: heads h0..h1-1 read matrices `mats` in turn, r consecutive heads
    each, and those matrices have the same pivots and equal rows; at most `most` heads."""
    runs: list[tuple[int, int, list[int], int]] = []
    h, n_h = 0, len(owner)
    while h < n_h:
        r = 1
        while h + r < n_h and owner[h + r] == owner[h] and r < most:
            r += 1
        mats, end = [owner[h]], h + r
        while end + r <= n_h and end + r <= h + most and _same_run(p, owner, mats, end, r):
            mats.append(owner[end])
            end += r
        runs.append((h, end, mats, r))
        h = end
    return runs


def _same_run(p: Prefixes, owner: list[int], mats: list[int], h: int, r: int) -> bool:
    """Whether heads h..h+r-1 read one new matrix with the structure of `mats[0]`."""
    b, first = owner[h], mats[0]
    if b in mats or owner[h : h + r] != [b] * r or (h + r < len(owner) and owner[h + r] == b):
        return False
    return (
        int(p.mean_end[b]) == int(p.mean_end[first])
        and torch.equal(p.rank[b], p.rank[first])
        and torch.equal(p.group[b], p.group[first])
    )


def _project_run(
    a: Tensor,
    p: Prefixes,
    mats: list[int],
    r: int,
    out: Tensor,
    dtype: torch.dtype,
    sizes: tuple[int, int],
    small: Callable[[], AbstractContextManager[Any]],
    solves: dict[tuple, Any] | None = None,
) -> None:
    """`project_prefixes` for heads a `[g, n, n]` reading `mats` (r heads each, in turn).
    Only the batched GEMM of A C runs outside `small` (at the caller's threads; its result
    is a new tensor, so torch splits the batch between them). The copies, masks and solves
    are many short kernels, and Y Cᵀ is written into `out`'s rows, which MKL's threaded
    GEMM did at a tenth of the speed of one thread on a loaded 2-core machine
    (benchmarks/records/mla.md)."""
    n = a.shape[-1]
    size, rows = sizes
    first = mats[0]
    s1 = int(p.mean_end[first])
    with small():
        _group_means(a, p.group[first].to(a.device), s1, out, rows)
        if s1 >= n:
            return
        c = p.coords[mats]  # [B, n, k] float64, where the solves run
        k = c.shape[-1]
        cw = c.to(a.device, dtype)
        cw = cw.repeat_interleave(r, 0) if r > 1 else cw  # [g, n, k]: each head's matrix
    exact = c.device  # float64 solves; a device without float64 leaves them here
    u = _lower_products(a, cw, s1, rows, small)  # rows s1.. of A C
    step = max(1, _SOLVE_BYTES // max(1, 80 * n * k + 32 * r * n * k))
    with small():
        u = u.to(exact, torch.float64).reshape(len(mats), r, n - s1, k)
        y = torch.empty_like(u)
        for m0 in range(0, len(mats), step):
            key = (tuple(mats[m0 : m0 + step]), s1, size)
            solve = None if solves is None else solves.get(key)
            if solve is None:
                solve = _BlockSolve(c[m0 : m0 + step], p.rank[first], s1, size)
                if solves is not None:
                    solves[key] = solve
            y[m0 : m0 + step] = solve(u[m0 : m0 + step])
        del u
        y = y.reshape(-1, n - s1, k).to(a.device, dtype)
    _write_lower(y, cw, s1, out, rows, small)


def _group_means(a: Tensor, group: Tensor, stop: int, out: Tensor, rows: int) -> None:
    """Rows 0..stop-1 of each head a `[g, n, n]`: each weight replaced by the mean weight
    of its group of equal rows (among keys ≤ i); rows before the first repeat are copied."""
    n, dev = a.shape[-1], a.device
    if stop <= 0:
        return
    repeats = torch.nonzero(group[:stop] != torch.arange(stop, device=dev)).flatten()
    s0 = int(repeats[0]) if repeats.numel() else stop
    out[:, :s0] = a[:, :s0]
    out[:, :s0, s0:] = 0 if s0 < n else out[:, :s0, s0:]
    g = group[:stop]
    onehot = torch.zeros(stop, stop, dtype=out.dtype, device=dev)
    onehot[torch.arange(stop, device=dev), g] = 1.0
    for s in range(s0, stop, rows):
        e = min(stop, s + rows)
        blk = a[:, s:e, :e].to(out.dtype)
        sums = blk.new_zeros(blk.shape[0], e - s, stop).index_add_(2, g[:e], blk)
        counts = onehot[:e].cumsum(0)[s:e]  # [e-s, stop]: occurrences of each group ≤ i
        at = g[:e].expand(e - s, e)
        mean = sums.gather(2, at.expand(blk.shape[0], e - s, e)) / counts.gather(1, at)
        out[:, s:e, :e] = torch.tril(mean, diagonal=s)
        out[:, s:e, e:] = 0


def _lower_products(
    a: Tensor, c: Tensor, start: int, rows: int, small: Callable[[], AbstractContextManager[Any]]
) -> Tensor:
    """`[g, n - start, k]` rows start.. of A C per head, reading only A's lower triangle."""
    n = a.shape[-1]
    u = torch.empty(a.shape[0], n - start, c.shape[-1], dtype=c.dtype, device=c.device)
    for s in range(start, n, rows):
        e = min(n, s + rows)
        with small():
            blk = a[:, s:e, :e].to(c.dtype)
        prod = torch.matmul(blk, c[:, :e])  # a new tensor: torch splits the batch of heads
        with small():
            u[:, s - start : e - start] = prod
    return u


def _write_lower(
    y: Tensor,
    c: Tensor,
    start: int,
    out: Tensor,
    rows: int,
    small: Callable[[], AbstractContextManager[Any]],
) -> None:
    """out[h, i] = tril(y_i C_hᵀ) for rows start.., zero above the diagonal (each chunk's
    product written into `out` itself and cut there: no temporary)."""
    n = out.shape[-1]
    with small():
        for s in range(start, n, rows):
            e = min(n, s + rows)
            block = out[:, s:e, :e]
            torch.bmm(y[:, s - start : e - start], c[:, :e].transpose(-1, -2), out=block)
            block[:, :, s:].tril_()  # keys s..e-1: the chunk's own rows' causal cut
            out[:, s:e, e:] = 0


class _BlockSolve:
    """y_i = G_i⁻¹ u_i for rows start..n-1, G_i = C_iᵀ C_i (+1 on inactive coordinates),
    for B matrices C with the same pivots (`rank`), batched.

    Blocks start at `start`, at every pivot after it and at most `size` rows apart, so no
    coordinate becomes active inside a block. Block t's first row s is solved with the
    Gram G_s = L Lᵀ itself; row s+u then has G = L (I + P_uᵀ P_u) Lᵀ, P the rows
    c_{s+1..s+u} L⁻ᵀ, solved by Woodbury through the leading blocks of
    I + P Pᵀ = F Fᵀ (the leading block of F⁻¹ inverts the leading block of F).
    Everything here depends on C only, so heads sharing C share it.
    """

    def __init__(self, c: Tensor, rank: Tensor, start: int, size: int) -> None:
        n, k = c.shape[-2:]
        dev = c.device
        rows = torch.arange(start, n, device=dev)
        pivot = torch.zeros(n, dtype=torch.bool, device=dev)
        pivot[1:] = rank[1:] > rank[:-1]
        seg = pivot[start:].clone()
        seg[0] = True
        seg_start = torch.cummax(torch.where(seg, rows, 0), 0).values
        is_start = seg | ((rows - seg_start) % size == 0)
        starts = rows[is_start]
        lengths = torch.diff(torch.cat([starts, starts.new_full((1,), n)]))
        width = int(lengths.max())
        offs = torch.arange(width, device=dev)
        idx = (starts[:, None] + offs[None, :]).clamp_max(n - 1)  # [T, b]
        valid = offs[None, :] < lengths[:, None]
        blk = c[:, idx] * valid[..., None]  # [B, T, b, k]: the block's rows
        upd = blk
        upd[:, :, 0] = 0.0  # the first row is inside the block's Gram
        del blk
        # Gram at each block's first row: rows ≤ start, then the rows after each block's
        # first up to the next block's first (one GEMM), summed in place.
        after = valid & (idx + 1 < n)
        rows_after = c[:, (idx + 1).clamp_max(n - 1)] * after[..., None]
        inc = rows_after.transpose(-1, -2) @ rows_after  # [B, T, k, k]
        del rows_after
        gram = torch.empty_like(inc)
        gram[:, 0] = c[:, : start + 1].transpose(-1, -2) @ c[:, : start + 1]
        for t in range(1, gram.shape[1]):
            torch.add(gram[:, t - 1], inc[:, t - 1], out=gram[:, t])
        del inc
        inactive = torch.arange(k, device=dev)[None, :] >= rank[starts][:, None]  # [T, k]
        if bool(inactive.any()):
            gram.diagonal(dim1=-2, dim2=-1).add_(inactive.double())
        lower = torch.linalg.cholesky(gram)
        del gram
        eye_k = torch.eye(k, dtype=torch.float64, device=dev)
        self.l_inv = torch.linalg.solve_triangular(lower, eye_k, upper=False)  # [B, T, k, k]
        del lower
        self.p = upd @ self.l_inv.transpose(-1, -2)  # [B, T, b, k]
        eye_b = torch.eye(width, dtype=torch.float64, device=dev)
        f = torch.linalg.cholesky(eye_b + self.p @ self.p.transpose(-1, -2))
        self.f_inv = torch.linalg.solve_triangular(f, eye_b, upper=False)  # [B, T, b, b]
        self.tril = torch.ones(width, width, dtype=torch.float64, device=dev).tril()
        self.idx, self.valid, self.start = idx - start, valid, start

    def __call__(self, u: Tensor) -> Tensor:
        """`[B, r, n - start, k]` y for the rows u `[B, r, n - start, k]` (float64) of r
        heads per matrix belong to (the r heads' rows stacked per block: no copies of the
        factors)."""
        bsz, r = u.shape[:2]
        ub = u[:, :, self.idx] * self.valid[..., None]  # [B, r, T, b, k]
        t, b, k = ub.shape[2:]
        ub = ub.transpose(1, 2).reshape(bsz, t, r * b, k)
        o = ub @ self.l_inv.transpose(-1, -2)  # rows L⁻¹ u_i
        tril = self.tril.repeat(r, 1)  # [r·b, b]
        v = (o @ self.p.transpose(-1, -2)) * tril
        w = ((v @ self.f_inv.transpose(-1, -2)) * tril) @ self.f_inv * tril
        y = (o - w @ self.p) @ self.l_inv  # rows of L⁻ᵀ ỹ
        y = y.reshape(bsz, t, r, b, k).transpose(1, 2)
        out = torch.empty_like(u)
        out[:, :, self.idx[self.valid]] = y[:, :, self.valid]
        return out
