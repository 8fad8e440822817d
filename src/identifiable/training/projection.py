"""Differentiable null fraction of attention rows (docs/training.md).

For one head and one query row a (the row's keys K, n_K of them) with T = V H
(docs/definitions.md), the null fraction is ‖a − a_eff‖² / ‖a‖², where a_eff is a
projected onto col(T[K]). With P the orthogonal projector onto col(T[K]),
‖a − aP‖² = ‖a‖² − a P aᵀ, and for any X with col(X) = col(T[K]) and full column
rank, a P aᵀ = u G⁻¹ uᵀ with u = a X and G = XᵀX. So the fraction is
1 − u G⁻¹ uᵀ / ‖a‖², which needs only u (n × r per head, like the head's own A V)
and an r × r Gram per row, never an n × n projector.

How it is differentiated, so that rank-deficient T never gives NaN:
- The rank of every T[K] is decided first, without gradients, with the relative
  tolerance of the analyses (σ_max · max(n, m) · eps of float64, over the real tokens
  of each sequence only, never over padding), and a constant basis change B is fixed
  there: coordinates C = V' B with exactly `rank` active columns (V' = V F, see
  `out_proj_factor`). The derivative is then the derivative along matrices of the
  same rank, the only one that exists: off that set the projector jumps.
- Rows whose keys T[K] span everything (rank = n_K: n ≤ d_v, or the first d_v rows
  of a decoder) have a null fraction of exactly 0 in a whole neighbourhood, so they
  take no part in the graph.
- `_NullFraction` computes 1 − u G⁻¹ uᵀ / ‖a‖² per row with an analytic backward (below), so a
  decoder's n prefix Grams are built chunk by chunk and never kept for autograd.

Shapes: B a batch of heads (sequences × heads flattened), N padded tokens, m the
width of V' (d_v, or d_v + 1 with the ones column of the row-stochastic variant).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from identifiable.attention.causal import prefix_coordinates
from identifiable.attention.linalg import cholesky_if_well_conditioned

_EPS64 = torch.finfo(torch.float64).eps


def relative_tolerance(sigma_max: Tensor, n: Tensor | int, m: int) -> Tensor:
    """σ_max · max(n, m) · eps(float64), with n the real (unpadded) length of each sequence."""
    n_t = torch.as_tensor(n, device=sigma_max.device, dtype=sigma_max.dtype)
    return sigma_max * torch.clamp(n_t, min=m) * _EPS64


def out_proj_factor(out_proj: Tensor) -> Tensor:
    """F `[H, d_v, r]` with col(V F) = col(V H) and sing(V F) = sing(V H).

    Where H (`[H, d_v, d]`, float64) is well-conditioned (κ < 1e3, the usual case) F is
    the Cholesky factor L of H Hᵀ, held constant: the null fraction depends on H only
    through col(T) = col(V) then, so its derivative in H is exactly 0 and in V the same
    for any such F. Elsewhere F = H W_r, W_r the right singular vectors of H above the
    relative tolerance (held constant, so that F carries H's derivative): V H W_r =
    V U_r S_r spans col(T) with T's singular values; missing ranks give zero columns.
    """
    with torch.no_grad():
        ok, lower, _ = cholesky_if_well_conditioned(out_proj @ out_proj.transpose(-1, -2))
    if bool(ok.all()):
        return lower
    with torch.no_grad():
        _, s, wh = torch.linalg.svd(out_proj, full_matrices=False)  # wh: [H, k, d]
        d_v, d = out_proj.shape[-2:]
        keep = s > relative_tolerance(s[:, :1], d_v, d)
        w = wh.transpose(-1, -2) * keep[:, None, :]
    f = out_proj @ w
    return torch.where(ok[:, None, None], lower[..., : f.shape[-1]], f)


def _ones_column(v: Tensor, real: Tensor, lengths: Tensor) -> Tensor:
    """The ones column s·1 of [T, 1] on the real tokens, ‖s·1‖ = σ_max(T) (as the analyses scale it)."""
    with torch.no_grad():
        smax = torch.linalg.matrix_norm(v, ord=2)
        smax = torch.where(smax > 0, smax, torch.ones_like(smax))
        scale = smax / lengths.to(v.dtype).sqrt()
    return (scale[:, None] * real.to(v.dtype))[..., None]


def row_null_fractions(
    a: Tensor,
    v: Tensor,
    lengths: Tensor,
    *,
    causal: bool,
    row_stochastic: bool = False,
    factor: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Null fraction ‖a − a_eff‖² / ‖a‖² of every real query row, differentiable in a and v.

    Args:
        a: `[B, N, N]` attention probabilities (rows of real queries put no mass on
            padded keys, and for `causal` none on keys after the row); real tokens
            first, `lengths[b]` of them.
        v: `[B, N, m]` V' (`out_proj_factor`), padded rows ignored; or V `[B, N, d_v]`
            when `factor` is given.
        lengths: `[B]` int64, real tokens of each sequence (≥ 1).
        causal: row i sees keys 0..i (else every real key).
        row_stochastic: project off LN([T, 1]) instead of LN(T).
        factor: `[B, d_v, m]` F of `out_proj_factor` (V' = V F), applied here so that the
            coordinates are one product V (F B) rather than two.
    Returns:
        fractions: `[B, N]` float64 (0 on padded rows and on rows whose keys span
            everything); rows: `[B, N]` bool, the real query rows.
    """
    bsz, n_pad, _ = v.shape
    pos = torch.arange(n_pad, device=v.device)
    real = pos[None, :] < lengths[:, None]  # [B, N]
    v64 = v.double()
    if not bool(real.all()):  # padded rows are left out (real rows put no mass on them)
        v64 = v64 * real[..., None]
    if factor is not None and row_stochastic:
        v64, factor = v64 @ factor.double(), None
    if row_stochastic:
        v64 = torch.cat([v64, _ones_column(v64, real, lengths)], dim=-1)
    if factor is None:
        basis, inactive, active_rows = _coordinates(v64, lengths, causal)
        coords = v64 @ basis
    else:
        with torch.no_grad():  # ranks are decided on V' = V F itself
            basis, inactive, active_rows = _coordinates(v64 @ factor, lengths, causal)
        coords = v64 @ (factor.double() @ basis)
    active_rows = active_rows & real
    if not bool(active_rows.any()):
        return v64.new_zeros(bsz, n_pad), real
    return _NullFraction.apply(a, coords, inactive, active_rows, causal), real


# ---- constant coordinates (no gradients) ----------------------------------------


def _coordinates(v: Tensor, lengths: Tensor, causal: bool) -> tuple[Tensor, Tensor, Tensor]:
    """B `[B, m, k]` (constant) of the coordinates C = V' B, inactive `[B, N, k]` and active
    rows `[B, N]`.

    Encoders: B whitens V' (C ≈ orthonormal, so the Gram is ≈ I): the inverse Cholesky
    factor where V' is tall and well-conditioned (κ < 1e3), else W_r/σ_r from its SVD
    with the relative tolerance. A row is active when rank < n (keys do not span R^n).
    Decoders: B maps V' to the echelon coordinates of `attention.causal.prefix_coordinates`
    (prefix ranks with the same tolerance); row i is active when rank(V'[:i+1]) < i + 1,
    and a coordinate is inactive in row i beyond that prefix's rank.
    Rank work runs per distinct length on the unpadded rows.
    """
    bsz, n_pad, m = v.shape
    k = min(n_pad, m)
    with torch.no_grad():
        basis = v.new_zeros(bsz, m, k)
        inactive = torch.zeros(bsz, n_pad, k, dtype=torch.bool, device=v.device)
        active = torch.zeros(bsz, n_pad, dtype=torch.bool, device=v.device)
        todo = torch.ones(bsz, dtype=torch.bool, device=v.device)
        if not causal and n_pad >= m:
            # The usual case in one batched call: tall and well-conditioned V' has rank m,
            # decided without a tolerance (zero padded rows leave VᵀV unchanged).
            ok, _, inverse = cholesky_if_well_conditioned(v.transpose(-1, -2) @ v)
            ok = ok & (lengths >= m)
            basis[ok, :, :m] = inverse[ok].transpose(-1, -2)
            active[ok] = (lengths[ok] > m)[:, None]
            todo = ~ok
        for n in torch.unique(lengths[todo]).tolist():
            idx = torch.nonzero(todo & (lengths == n)).flatten()
            x = v[idx, :n]
            if causal:
                b, inact, act = _prefix_basis(x, k)
                inactive[idx, :n], active[idx, :n] = inact, act
            else:
                b, rank = _whitening_basis(x, k)
                inactive[idx] = (torch.arange(k, device=v.device) >= rank[:, None])[:, None, :]
                active[idx, :n] = (rank < n)[:, None]
            basis[idx] = b
    return basis, inactive, active


def _whitening_basis(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """`[b, m, k]` B with x B ≈ orthonormal on its first `rank` columns (zero beyond), rank `[b]`."""
    bsz, n, m = x.shape
    out = x.new_zeros(bsz, m, k)
    rank = torch.zeros(bsz, dtype=torch.long, device=x.device)
    fast = torch.zeros(bsz, dtype=torch.bool, device=x.device)
    if n >= m:
        ok, _, inverse = cholesky_if_well_conditioned(x.transpose(-1, -2) @ x)
        fast = ok
        out[ok, :, :m] = inverse[ok].transpose(-1, -2)
        rank[ok] = m
    slow = ~fast
    if bool(slow.any()):
        _, s, wh = torch.linalg.svd(x[slow], full_matrices=False)  # s: [b, min(n, m)]
        keep = s > relative_tolerance(s[:, :1], n, m)
        w = wh.transpose(-1, -2) * keep[:, None, :] / torch.where(keep, s, 1.0)[:, None, :]
        out[slow, :, : w.shape[-1]] = w
        rank[slow] = keep.sum(-1)
    return out, rank


def _prefix_basis(x: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """B `[b, m, k]` with x B = the echelon prefix coordinates, inactive `[b, n, k]`, active `[b, n]`."""
    bsz, n, m = x.shape
    smax = torch.linalg.matrix_norm(x, ord=2)
    coords, prefix_rank = prefix_coordinates(x, smax)  # [b, n, min(n, m)]
    # B solves x B = coords on the row space of x (min-norm: the pseudo-inverse).
    b = torch.linalg.pinv(x, rtol=max(n, m) * _EPS64) @ coords
    out = x.new_zeros(bsz, m, k)
    out[..., : b.shape[-1]] = b
    rows = torch.arange(n, device=x.device)
    inactive = torch.arange(k, device=x.device)[None, None, :] >= prefix_rank[..., None]
    return out, inactive, prefix_rank < rows + 1


# ---- u G⁻¹ uᵀ per row with an analytic backward -----------------------------------


def _chunk_rows(n: int, k: int) -> int:
    """Rows per chunk so that the [chunk, k, k] Grams stay near one [n, n] matrix."""
    return max(1, (n * n) // max(1, k * k))


def _solve_rows(u: Tensor, c: Tensor, inactive: Tensor, rows: Tensor, causal: bool) -> Tensor:
    """X `[B, N, k]`: x_i = (G_i + D_i)⁻¹ u_i (u = A C) on active rows, 0 elsewhere (no gradients)."""
    bsz, n, k = c.shape
    if not causal:
        # C is orthonormal on its active columns (`_coordinates` whitens encoders) and zero
        # elsewhere, so G + D = I to rounding (≤ 1e-10 relative, κ(V') < 1e3 or an SVD):
        # x = u, the same A Q the analyses form with the same basis.
        return u * rows[..., None]
    x = c.new_zeros(bsz, n, k)
    eye = torch.eye(k, dtype=c.dtype, device=c.device)
    active_any = rows.any(0)
    start = int(active_any.long().argmax()) if bool(active_any.any()) else n
    gram = c[:, :start].transpose(-1, -2) @ c[:, :start]
    step = _chunk_rows(n, k)
    for s in range(start, n, step):
        e = min(n, s + step)
        blk = c[:, s:e]
        g = gram[:, None] + torch.cumsum(blk[:, :, :, None] * blk[:, :, None, :], dim=1)
        gram = g[:, -1]
        g = g + torch.diag_embed(inactive[:, s:e].double())
        # inactive rows (identity rows) still factor: their D makes G_i positive definite
        g = torch.where(rows[:, s:e, None, None], g, eye)
        chol = torch.linalg.cholesky(g)
        sol = torch.cholesky_solve(u[:, s:e, :, None], chol)[..., 0]
        x[:, s:e] = sol * rows[:, s:e, None]
    return x


class _NullFraction(torch.autograd.Function):
    """1 − f_i / ‖a_i‖² on active rows (0 elsewhere), f_i = u_i (G_i + D_i)⁻¹ u_iᵀ,
    u_i = a_i C, G_i = Σ_{j ∈ K_i} c_jᵀ c_j, in float64 whatever a's dtype.

    Backward of f, with x_i = (G_i + D_i)⁻¹ u_i and upstream g_i (∂f/∂u = 2x, ∂f/∂G = −xᵀx):
    ∂L/∂A = 2 diag(g) X Cᵀ and ∂L/∂C = 2 Aᵀ diag(g) X − 2 W X with
    W_ji = g_i (c_j · x_i) [j ∈ K_i]: O(N² k) and one [N, N] matrix per head, never the
    N Grams of a decoder. x_i is 0 on inactive coordinates, so directions that would
    raise a prefix's rank get no gradient (the derivative along constant rank). The
    fraction's upstream h_i gives g_i = −h_i / ‖a_i‖², and ‖a_i‖² adds 2 h_i f_i / ‖a_i‖⁴ a_i.
    """

    @staticmethod
    def forward(ctx: Any, a: Tensor, c: Tensor, inactive: Tensor, rows: Tensor, causal: bool):
        with torch.no_grad():
            a64 = a.to(torch.float64)
            u = a64 @ c
            x = _solve_rows(u, c, inactive, rows, causal)
            f = (u * x).sum(-1)
            norm2 = torch.where(rows, torch.linalg.vector_norm(a64, dim=-1).square(), 1.0)
            ratio = torch.where(rows, f / norm2, 1.0)
        ctx.save_for_backward(a, a64, c, x, rows, norm2, ratio)
        ctx.causal = causal
        return 1.0 - ratio

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor):
        a, a64, c, x, rows, norm2, ratio = ctx.saved_tensors
        h = torch.where(rows, grad / norm2, 0.0)
        gx = x * (-2.0 * h)[..., None]  # rows of 2 diag(g) X
        # ∂L/∂A = 2 diag(g) X Cᵀ + 2 diag(h f / ‖a‖²) A, one pass over [N, N] in A's own
        # precision (at least float32): the gradient A receives, without a float64 copy
        work = torch.promote_types(a.dtype, torch.float32)
        grad_a = torch.baddbmm(
            a.to(work) * (2.0 * h * ratio).to(work)[..., None],
            gx.to(work),
            c.to(work).transpose(-1, -2),
        )
        if ctx.causal:
            grad_a = grad_a.tril()
            w = (c @ gx.transpose(-1, -2)).triu()  # [j, i]: keys j ≤ i
            grad_c = a64.transpose(-1, -2) @ gx - w @ x
        else:
            grad_c = a64.transpose(-1, -2) @ gx - c @ (x.transpose(-1, -2) @ gx)
        return grad_a.to(a.dtype), grad_c, None, None, None
