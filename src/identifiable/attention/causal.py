"""Prefix (causal) version of the projections in `linalg.py`.

In a decoder, query row i may only weight keys 0..i, so its relevant matrix is
X_i = X[:i+1] (X = V' or [V', s·1], see `linalg.py`) and its effective row is
the projection of a_i onto col(X_i) ⊂ R^{i+1}.

Method (per head, k = min(n, m); cost O(n·m² + n·k² + n²·k) when the
first k rows are independent, the usual case):
1. Prefix coordinates. Gram-Schmidt over the *rows* of X in order gives an
   orthonormal basis b_0, b_1, … of the row space, one vector per row that is
   independent of the rows before it (a pivot row). With C = X Bᵀ (n×k),
   row j of C is zero beyond the number of pivots up to j, so
   col(X_i) = col(C[:i+1]) and rank(X_i) = #pivots ≤ i. In the generic case
   (the first k rows independent) this is just Cᵀ = R of the Householder QR of
   Xᵀ, one LAPACK call; only heads that fail that check (e.g. repeated tokens
   with identical rows) run the explicit row-by-row loop.
2. Projection. a_i restricted to col(C_i) is y_i C_iᵀ with y_i G_i = a_i C_i
   and G_i = C_iᵀ C_i (+1 on the diagonal of not-yet-active coordinates,
   where a_i C_i is zero, so G_i is always positive definite). Rows whose
   prefix has full row rank are copied unchanged (identity projection).
   Once every head's prefix rank has reached k, G_i grows by one outer
   product per row, and blocks of k rows share one Cholesky factorisation
   through a Woodbury update (`_rows_by_block_update`). Rows before that
   (only with repeated rows, e.g. Llama's first layer) get one batched
   Cholesky per row, O(k³/3) each, in row chunks so memory stays at about
   one [n, n] matrix per head. The normal equations square the condition
   number of X_i, which float64 absorbs: tests match a per-row SVD to 1e-9,
   and to 1e-8 for prefixes with κ ≈ 1e6 (iterative refinement was tried
   and changed nothing).
"""

from __future__ import annotations

import torch
from torch import Tensor

from identifiable.attention.linalg import rank_tolerance


def prefix_coordinates(x: Tensor, scale: Tensor) -> tuple[Tensor, Tensor]:
    """Lower-echelon coordinates C of the rows of X and the prefix ranks.

    Args:
        x: `[B, n, m]` float64.
        scale: `[B]` σ_max of each X (the relative tolerance's scale; one per
            sequence and head).
    Returns:
        coords: `[B, n, k]`, k = min(n, m), with coords[b, j, c] = 0 for
            c ≥ prefix_rank[b, j]; col(coords[b, :i+1]) = col(x[b, :i+1]).
        prefix_rank: `[B, n]` int64, rank(x[b, :i+1]) for each row i.
    """
    bsz, n, m = x.shape
    k = min(n, m)
    tol = rank_tolerance(scale, n, m)  # [B]
    _, r = torch.linalg.qr(x.transpose(-1, -2))  # r: [B, k, n]
    coords = r.transpose(-1, -2).contiguous()  # [B, n, k], lower trapezoidal
    rows = torch.arange(n, device=x.device)
    prefix_rank = torch.minimum(rows + 1, torch.tensor(k)).expand(bsz, n).clone()
    diag = torch.diagonal(r, dim1=-2, dim2=-1).abs()  # [B, k]
    slow = ~(diag > tol[:, None]).all(-1)
    if slow.any():
        c, pr = _gram_schmidt_rows(x[slow], tol[slow], k)
        coords[slow], prefix_rank[slow] = c, pr
    return coords, prefix_rank


def _gram_schmidt_rows(x: Tensor, tol: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Row-by-row Gram-Schmidt (twice, for orthogonality), batched over heads."""
    bsz, n, m = x.shape
    basis = x.new_zeros(bsz, k, m)
    count = torch.zeros(bsz, dtype=torch.long, device=x.device)
    prefix_rank = torch.empty(bsz, n, dtype=torch.long, device=x.device)
    batch = torch.arange(bsz, device=x.device)
    for i in range(n):
        res = x[:, i, :]
        for _ in range(2):
            res = res - ((basis @ res[:, :, None]).transpose(-1, -2) @ basis)[:, 0, :]
        norm = torch.linalg.vector_norm(res, dim=-1)
        new = (norm > tol) & (count < k)
        if new.any():
            basis[batch[new], count[new]] = res[new] / norm[new, None]
            count = count + new.long()
        prefix_rank[:, i] = count
    coords = x @ basis.transpose(-1, -2)  # [B, n, k]
    # Drop sub-tolerance components outside each row's own prefix span: that
    # is what the rank decision means, and it makes the coordinates echelon.
    active = torch.arange(k, device=x.device)[None, None, :] < prefix_rank[:, :, None]
    return coords * active, prefix_rank


def project_rows_causal(
    a: Tensor, coords: Tensor, prefix_rank: Tensor, *, chunk: int | None = None
) -> Tensor:
    """Project each row a_i onto col(X[:i+1]) (masked keys stay exactly 0).

    Args:
        a: `[B, n, n]` lower triangular (causal attention), any float dtype.
        coords, prefix_rank: from `prefix_coordinates`.
        chunk: rows per block (default: k for the saturated rows, and as many
            as keep the [chunk, k, k] Grams near one [n, n] matrix otherwise).
    Returns: `[B, n, n]` float64.
    """
    _, n, k = coords.shape
    rows = torch.arange(n, device=a.device)
    identity_rows = prefix_rank == (rows + 1)  # [B, n]: a_i already in col(X_i)
    out = torch.empty(a.shape, dtype=torch.float64, device=a.device)
    start = int(identity_rows.all(0).long().cumprod(0).sum())  # leading identity block
    out[:, :start] = a[:, :start]
    if start == n:
        return out
    # prefix_rank never decreases, so rows of full rank k form a suffix in every
    # head; from one row past its common start, the cheap block update applies.
    saturated = (prefix_rank == k).all(0)
    w0 = int(saturated.long().argmax()) + 1 if bool(saturated.any()) else n
    _rows_by_cholesky(a, coords, prefix_rank, identity_rows, out, start, w0, chunk)
    if w0 < n:
        _rows_by_block_update(a, coords, out, w0, chunk or k)
    return out


def _rows_by_cholesky(a, coords, prefix_rank, identity_rows, out, start, stop, chunk) -> None:
    """Rows start..stop-1, one Cholesky factorisation of G_i per row (any prefix rank)."""
    _, n, k = coords.shape
    if stop <= start:
        return
    chunk = chunk or max(1, (n * n) // (k * k))
    rows = torch.arange(n, device=a.device)
    gram = coords[:, :start].transpose(-1, -2) @ coords[:, :start]
    for s in range(start, stop, chunk):
        e = min(stop, s + chunk)
        c = coords[:, s:e]  # [B, b, k]
        g = gram[:, None] + torch.cumsum(c[:, :, :, None] * c[:, :, None, :], dim=1)
        gram = g[:, -1]
        inactive = torch.arange(k, device=a.device) >= prefix_rank[:, s:e, None]  # [B, b, k]
        chol, _ = torch.linalg.cholesky_ex(g + torch.diag_embed(inactive.double()))
        a_blk = a[:, s:e].double()  # [B, b, n]; converted chunk by chunk
        rhs = a_blk @ coords  # a_i C_i, since a_i is zero beyond i
        z = torch.linalg.solve_triangular(chol, rhs[..., None], upper=False)
        y = torch.linalg.solve_triangular(chol.transpose(-1, -2), z, upper=True)[..., 0]
        proj = (y @ coords.transpose(-1, -2)) * (rows[None, :] <= rows[s:e, None])
        out[:, s:e] = torch.where(identity_rows[:, s:e, None], a_blk, proj)


def _rows_by_block_update(a, coords, out, start, block) -> None:
    """Rows start..n-1, all of prefix rank k, in blocks of `block` rows.

    Per block one Cholesky L Lᵀ = G_{s-1} of the Gram before the block; row
    i = s+t then has G_i = L (I + P_tᵀ P_t) Lᵀ with P = C[s:e] L⁻ᵀ and P_t its
    first t+1 rows, solved by Woodbury through the leading blocks of
    I + P Pᵀ = F Fᵀ (the leading block of F⁻¹ inverts the leading block of F).
    Cost per block O(k³ + b·k² + b²·k + b·n·k) instead of b Cholesky factorisations.
    """
    _, n, k = coords.shape
    rows = torch.arange(n, device=a.device)
    eye_k = torch.eye(k, dtype=torch.float64, device=a.device)
    gram = coords[:, :start].transpose(-1, -2) @ coords[:, :start]
    for s in range(start, n, block):
        e = min(n, s + block)
        b = e - s
        tril = torch.ones(b, b, dtype=torch.float64, device=a.device).tril()
        l_inv = torch.linalg.solve_triangular(torch.linalg.cholesky(gram), eye_k, upper=False)
        d = coords[:, s:e]  # [B, b, k]
        p = d @ l_inv.transpose(-1, -2)  # rows L⁻¹ c_j
        f = torch.linalg.cholesky(torch.eye(b, dtype=torch.float64) + p @ p.transpose(-1, -2))
        f_inv = torch.linalg.solve_triangular(f, torch.eye(b, dtype=torch.float64), upper=False)
        a_blk = a[:, s:e].double()
        o = (a_blk @ coords) @ l_inv.transpose(-1, -2)  # rows L⁻¹ (a_i C)
        u = ((o @ p.transpose(-1, -2)) * tril) @ f_inv.transpose(-1, -2) * tril
        w = (u @ f_inv) * tril
        y = (o - w @ p) @ l_inv  # rows of L⁻ᵀ ỹ
        out[:, s:e] = (y @ coords.transpose(-1, -2)) * (rows[None, :] <= rows[s:e, None])
        gram = gram + d.transpose(-1, -2) @ d
