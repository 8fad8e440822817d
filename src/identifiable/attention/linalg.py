"""Pure linear algebra of attention identifiability (docs/definitions.md#null-spaces).

Shapes: B a batch of heads, n tokens, d_v head width, d model width, m the
width of the matrix whose column space is used (d_v, or d_v + 1 with the
ones column of the row-stochastic variant). All functions take and return
float64 tensors; callers convert once (except `certified_well_conditioned`,
which takes the float32 W_O so that it can avoid that conversion).

The central reduction: for one head, T = V H with V = E W_V (n×d_v) and
H (d_v×d). For any F (d_v×d_v) with F Fᵀ = H Hᵀ (the Cholesky factor of
H Hᵀ, or Rᵀ from the thin QR Hᵀ = Q R, T = (V Rᵀ) Qᵀ), V' = V F has exactly
the singular values of T and col(V') = col(T), whatever the rank of H.
Everything works on V' (or on V itself where H and V are well-conditioned,
which has the same column space and rank) and never forms the n×d matrix T.
When H lacks full row rank, V' is still exact, so no separate n×d fallback
is needed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from identifiable.utils.precision import float32_matmuls_exact

_EPS64 = torch.finfo(torch.float64).eps


def rank_tolerance(sigma_max: Tensor, n: int, m: int) -> Tensor:
    """Rank tolerance σ_max · max(n, m) · eps(float64), broadcast like `sigma_max`."""
    return sigma_max * max(n, m) * _EPS64


def sigma_max(x: Tensor, gram: Tensor | None = None) -> Tensor:
    """`[B]` σ_max of each x `[B, n, m]`, from the eigenvalues of its smaller Gram matrix
    (`gram`, where the caller has it): relative error ~max(n, m)·eps, as an SVD's, at the
    cost of one GEMM and a k×k eigensolve instead of an n×m bidiagonalisation."""
    n, m = x.shape[-2:]
    if min(n, m) == 0 or x.shape[0] == 0:
        return x.new_zeros(x.shape[0])
    if gram is None:
        gram = x.transpose(-1, -2) @ x if n >= m else x @ x.transpose(-1, -2)
    return torch.linalg.eigvalsh(gram)[..., -1].clamp_min(0).sqrt()


def head_factors(out_proj: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Batched over any leading dims; see `_head_factors`."""
    *batch, d_v, d = out_proj.shape
    f, full, well = _head_factors(out_proj.reshape(-1, d_v, d))
    return f.reshape(*batch, *f.shape[-2:]), full.reshape(batch), well.reshape(batch)


def _head_factors(out_proj: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-head factor F with sing(V F) = sing(V H) and col(V F) = col(V H).

    Well-conditioned H (the usual case, see `_well_conditioned`): F = L with
    L Lᵀ = H Hᵀ, so (V L)(V L)ᵀ = T Tᵀ. Otherwise F = Rᵀ from the thin QR of
    Hᵀ (T = V Rᵀ Qᵀ), exact whatever the rank of H.

    Args:
        out_proj: `[B, d_v, d]` float64, each head's slice H of W_O.
    Returns:
        factor: `[B, d_v, k]`, k = min(d_v, d).
        full_row_rank: `[B]` bool, whether H has rank d_v (σ_min(H) above
            the relative tolerance), i.e. whether col(T) = col(V).
        well_conditioned: `[B]` bool, κ(H) < 1e3: then rank(T) = rank(V)
            whenever V is itself well-conditioned, and V alone can be used.
    """
    d_v, d = out_proj.shape[-2:]
    k = min(d_v, d)
    factor = out_proj.new_zeros(out_proj.shape[0], d_v, k)
    full = torch.zeros(out_proj.shape[0], dtype=torch.bool, device=out_proj.device)
    gram = out_proj @ out_proj.transpose(-1, -2)
    if d_v <= d:
        ok, lower, _ = cholesky_if_well_conditioned(gram)
        if bool(ok.all()):  # the usual case, decided without an eigensolver
            return lower, full.fill_(True), ok
    fast = _well_conditioned(gram)[0] if d_v <= d else full.clone()
    if d_v <= d and bool(fast.all()):  # all positive definite: `lower` is their Cholesky factor
        return lower, full.fill_(True), fast
    if fast.any():
        factor[fast], full[fast] = torch.linalg.cholesky(gram[fast]), True
    if (~fast).any():
        _, r = torch.linalg.qr(out_proj[~fast].transpose(-1, -2))  # r: [b, k, d_v]
        sv = torch.linalg.svdvals(r)  # singular values of H
        full[~fast] = (sv > rank_tolerance(sv[..., :1], d_v, d)).sum(-1) == d_v
        factor[~fast] = r.transpose(-1, -2)
    return factor, full, fast


def column_basis(x: Tensor, *, width: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Batched over any leading dims; see `_column_basis`."""
    *batch, n, m = x.shape
    basis, rank, smax, _ = _column_basis(x.reshape(-1, n, m), width)
    return basis.reshape(*batch, *basis.shape[-2:]), rank.reshape(batch), smax.reshape(batch)


def _column_basis(x: Tensor, width: int | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Orthonormal basis of col(x) with the rank tolerance of docs/definitions.md#rank-tolerance.

    Well-conditioned matrices (κ(x) < 1e3, far from the tolerance, so the SVD
    would find full rank too) take a cheaper route: one pass of Cholesky QR
    when tall (orthonormal to ~eps·κ² ≤ 1e-10), the identity when wide
    (col(x) = R^n). The rest get an SVD.

    Args:
        x: `[B, n, m]`.
        width: the m of the tolerance's max(n, m) (default x's own width; the
            reference route passes d_v for its n×d matrix T).
    Returns:
        basis: `[B, n, k]` (k = min(n, m)); columns beyond the rank are zero,
            so `basis @ basisᵀ` is the orthogonal projector onto col(x).
        rank: `[B]` int64.
        sigma_max: `[B]` largest singular value (the tolerance scale).
        well_conditioned: `[B]` bool, which matrices took the cheap route.
    """
    bsz, n, m = x.shape
    k = min(n, m)
    rank = torch.zeros(bsz, dtype=torch.long, device=x.device)
    smax = x.new_zeros(bsz)
    if k == 0:
        return x.new_zeros(bsz, n, k), rank, smax, torch.zeros_like(rank, dtype=torch.bool)
    tall = n >= m
    gram = x.transpose(-1, -2) @ x if tall else x @ x.transpose(-1, -2)  # [B, k, k]
    fast, lam_max = _well_conditioned(gram)
    if tall and bool(fast.all()):  # the usual case: no gather/scatter copies of x and the basis
        return _cholesky_qr(x, gram), rank.fill_(k), lam_max.clamp_min(0).sqrt(), fast
    basis = x.new_zeros(bsz, n, k)
    if fast.any():
        rank[fast], smax[fast] = k, lam_max[fast].clamp_min(0).sqrt()
        basis[fast] = (
            _cholesky_qr(x[fast], gram[fast])
            if tall
            else torch.eye(n, dtype=x.dtype, device=x.device)
        )
    slow = ~fast
    if slow.any():
        u, s, _ = torch.linalg.svd(x[slow], full_matrices=False)
        keep = s > rank_tolerance(s[:, :1], n, width or m)
        basis[slow], rank[slow], smax[slow] = u * keep[:, None, :], keep.sum(-1), s[:, 0]
    return basis, rank, smax, fast


def cholesky_if_well_conditioned(gram: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Cholesky factor L of each SPD Gram matrix xᵀx, its inverse, and a sufficient test
    of κ(x) < 1e3 (the criterion of `_well_conditioned`) without an eigensolver.

    σ(L) = σ(x), and κ₂(L) ≤ ‖L‖_F ‖L⁻¹‖_F, so ‖L‖_F ‖L⁻¹‖_F < 1e3 implies κ(x) < 1e3:
    `ok` never admits a matrix `_well_conditioned` rejects. It may reject one that
    passes (the Frobenius bound is at most k times κ₂); callers then use
    `_well_conditioned`, so every decision equals its decision. L and L⁻¹ are the ones
    `_cholesky_qr` computes, so Q = x L⁻ᵀ is the same to the last bit.

    Args:
        gram: `[B, k, k]` float64 symmetric positive semi-definite.
    Returns:
        ok `[B]` bool, lower `[B, k, k]`, inverse `[B, k, k]` (meaningful where ok).
    """
    lower, info = torch.linalg.cholesky_ex(gram)
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    inverse = torch.linalg.solve_triangular(lower, eye, upper=False)
    kappa = torch.linalg.matrix_norm(lower) * torch.linalg.matrix_norm(inverse)
    ok = (info == 0) & torch.isfinite(kappa) & (kappa < 1e3)
    return ok, lower, inverse


def certified_well_conditioned(out_proj: Tensor) -> Tensor:
    """`[B]` bool: κ(H) < 1e3 *proved* for each float32 head slice H `[B, d_v, d]`
    (d_v ≤ d) from one float32 Gram matrix and one shifted float64 Cholesky, without
    the float64 copy and product of H.

    Proof. Write G = H Hᵀ, k = d_v, u = 2⁻²⁴ (float32) and v = 2⁻⁵³ (float64).
    1. For any summation order (FMA or not), G̃ = fl₃₂(H Hᵀ) differs from G
       entrywise by at most γ_d |H||H|ᵀ, γ_d = d u / (1 − d u), so
       ‖G̃ − G‖₂ ≤ γ_d ‖H‖_F² = γ_d tr(G) ≤ δ := γ_d tr(G̃) / (1 − γ_d).
    2. λ_max(G) ≤ tr(G) ≤ tr(G̃) / (1 − γ_d), and λ_max(G) ≤ ‖G̃‖_∞ + δ; λ_up is
       the smaller, times 1.001 for the float64 sums that evaluate it.
    3. With s = 1.01 (1.01e-6 λ_up + δ + 2 γ′ tr(G̃)), γ′ = (k + 1) v / (1 − (k + 1) v):
       if float64 Cholesky runs to completion on A = fl₆₄(G̃ − s I), then A + ΔA =
       L̃ L̃ᵀ ⪰ 0 with |ΔA| ≤ γ′ |L̃||L̃|ᵀ (Demmel's theorem: any order of the inner
       products, blocked or not), so ‖ΔA‖₂ ≤ γ′ ‖L̃‖_F² ≤ γ′ tr(A) / (1 − γ′), and
       tr(A) ≤ (1 + v) tr(G̃). The rounding of the shift moves each diagonal entry
       by at most v (tr(G̃) + s). Together λ_min(G̃) ≥ s (1 − v) − 2 γ′ tr(G̃).
    4. By Weyl, λ_min(G) ≥ λ_min(G̃) − δ ≥ 1.01e-6 λ_up ≥ 1.01e-6 λ_max(G) (the outer
       1.01 absorbs v and the float64 rounding of s).
    So every True proves κ(H)² < 1e6 / 1.01. That is `_well_conditioned`'s criterion
    with a 1 % margin, which keeps its float64 eigenvalues (absolute error
    ~eps₆₄ λ_max) from deciding otherwise: every True here is True there and implies
    full row rank. False means "not proved"; callers then run the exact float64 test.
    Reach: δ, the worst-case float32 rounding of the Gram, dominates the shift, so a
    head is proved when λ_min(G) ≳ γ_d tr(G). Measured: κ ≤ 50 with log-spaced singular
    values and κ ≤ 10 with one small one at d = 768, d_v = 64; κ ≤ 10 and ≤ 5 at
    d = 4096, d_v = 128; every head of MiniLM and of random BERT-base.

    Only with float32 matmuls at full precision (`precision.float32_matmuls_exact`):
    reduced-precision matmuls (TF32, bf16) void step 1, and nothing is claimed.
    """
    bsz, d_v, d = out_proj.shape
    none = torch.zeros(bsz, dtype=torch.bool, device=out_proj.device)
    if out_proj.dtype != torch.float32 or d_v > d or not float32_matmuls_exact(out_proj.device):
        return none
    gram = (out_proj @ out_proj.transpose(-1, -2)).double()
    u32, u64 = 2.0**-24, 2.0**-53
    gamma = d * u32 / (1 - d * u32)
    gamma_chol = (d_v + 1) * u64 / (1 - (d_v + 1) * u64)
    diagonal = gram.diagonal(dim1=-2, dim2=-1)
    trace = diagonal.sum(-1)
    delta = gamma * trace / (1 - gamma)
    lam_up = 1.001 * torch.minimum(trace / (1 - gamma), gram.abs().sum(-1).amax(-1) + delta)
    shift = 1.01 * (1.01e-6 * lam_up + delta + 2 * gamma_chol * trace)
    diagonal.sub_(shift[:, None])  # A = fl(G̃ − s I), in place: G̃ is not needed again
    _, info = torch.linalg.cholesky_ex(gram)
    return (info == 0) & torch.isfinite(shift)


def _well_conditioned(gram: Tensor) -> tuple[Tensor, Tensor]:
    """`[B]` bool: λ_min > 1e-6 · λ_max for each SPD Gram matrix (κ of its factor < 1e3),
    and `[B]` λ_max.

    Eigenvalues of a symmetric matrix carry absolute error ~eps · λ_max, so
    this test is reliable, and 1e-3 is far above the rank tolerance (~1e-13).
    """
    lam = torch.linalg.eigvalsh(gram)
    return lam[:, 0] > 1e-6 * lam[:, -1], lam[:, -1]


def _cholesky_qr(x: Tensor, gram: Tensor) -> Tensor:
    """Q = x L⁻ᵀ with L Lᵀ = xᵀx: col(Q) = col(x), QᵀQ = I + O(eps·κ²) (κ < 1e3 here)."""
    lower = torch.linalg.cholesky(gram)
    eye = torch.eye(lower.shape[-1], dtype=x.dtype, device=x.device)
    # Invert the small k×k factor and multiply: a GEMM beats a batched n×k trsm.
    return x @ torch.linalg.solve_triangular(lower, eye, upper=False).transpose(-1, -2)


def add_ones(basis: Tensor, rank: Tensor, ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Extend an orthonormal basis of col(T) to one of col([T, 1]).

    The ones column counts as a new direction when its distance from col(T),
    relative to its own norm, exceeds max(n, k + 1) · eps: the rank tolerance
    for [T, s·1] with s scaled so that ‖s·1‖ = σ_max(T). With `ids` it is first
    decided exactly where it can be (`ones_inside`).

    Args:
        basis: `[..., n, k]` orthonormal columns (zero columns allowed).
        rank: `[...]` rank of col(T).
        ids: `[..., n]` int64 from `row_ids` of V (equal rows of V, equal rows of T).
    Returns:
        basis: `[..., n, k + 1]`, rank: `[...]` of [T, 1].
    """
    w, new = ones_direction(basis, None if ids is None else ones_inside(rank, ids))
    return torch.cat([basis, w], dim=-1), rank + new.long()


def row_ids(x: Tensor) -> Tensor:
    """`[..., n]` int64 ids of the rows of `x` `[..., n, m]`: equal rows share one.

    Take them from V, not from a product such as V F or T: a matrix product need not
    round equal rows equally (it did not, measured on this CPU's BLAS). Each row is keyed
    by Σ_k x_k z_k for a fixed random z, an elementwise product and a sum along the row,
    which reduced equal rows to equal keys in every test here (against `torch.unique`,
    tests/attention/test_repeated_rows.py); a pair it missed would only leave the decision
    to the tolerance. Every row is then compared with the first row of its key, so rows
    that share an id are equal; a collision of two different rows falls back to
    `torch.unique` over whole rows (2-4x slower in single runs here)."""
    flat = x.reshape(-1, x.shape[-1]).double()
    if flat.shape[0] == 0:
        return torch.zeros(x.shape[:-1], dtype=torch.long, device=x.device)
    z = torch.randn(flat.shape[1], generator=torch.Generator().manual_seed(0), dtype=flat.dtype)
    _, ids = torch.unique((flat * z.to(x.device)).sum(-1), return_inverse=True)
    first = torch.full((int(ids.max()) + 1,), flat.shape[0], dtype=torch.long, device=x.device)
    first.scatter_reduce_(0, ids, torch.arange(flat.shape[0], device=x.device), "amin")
    if not torch.equal(flat[first[ids]], flat):  # a collision: two rows share a key
        ids = torch.unique(flat, dim=0, return_inverse=True)[1]
    return ids.reshape(x.shape[:-1])


def ones_inside(rank: Tensor, ids: Tensor) -> Tensor:
    """`[...]` bool: the ones vector lies in col(T) exactly, because the distinct rows
    of T are independent (rank = their number), so col(T) holds every vector constant
    on each group of equal rows. Repeated tokens give such matrices; there the residual
    of ones against a computed basis is rounding amplified by the basis's condition
    number, and it can exceed `add_ones`' tolerance (a spurious constraint: certified
    intervals came out too narrow, by up to 0.22 against HiGHS on the exact polytope).

    Args:
        rank: `[...]` int64 rank of T; ids: `[..., n]` from `row_ids`.
    """
    ordered = ids.sort(-1).values
    distinct = 1 + (ordered[..., 1:] != ordered[..., :-1]).sum(-1)
    return rank == distinct


def ones_direction(basis: Tensor, inside: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The unit direction the ones vector adds to col(T), without forming [basis, w].

    Callers that need only rank([T, 1]) (the paper variant's dim LN([T, 1]))
    skip the `[..., n, k + 1]` copy of `add_ones`.

    Args:
        basis: `[..., n, k]` orthonormal columns (zero columns allowed).
        inside: `[...]` bool, where the ones vector is known to lie in col(T)
            (`ones_inside`); elsewhere the tolerance decides.
    Returns:
        w: `[..., n, 1]` unit vector orthogonal to the basis, or zeros where the
            ones vector already lies in col(T) (see `add_ones` for the tolerance).
        new: `[...]` bool, whether w is a new direction.
    """
    n, k = basis.shape[-2:]
    ones = basis.new_full((n, 1), n**-0.5)
    w = ones.expand(*basis.shape[:-1], 1)
    for _ in range(2):  # classical Gram-Schmidt twice: orthogonal to working precision
        w = w - basis @ (basis.transpose(-1, -2) @ w)
    norm = torch.linalg.vector_norm(w, dim=(-2, -1))
    new = norm > max(n, k + 1) * _EPS64
    if inside is not None:
        new = new & ~inside
    w = w / torch.where(new, norm, torch.ones_like(norm))[..., None, None] * new[..., None, None]
    return w, new


def project_rows(a: Tensor, basis: Tensor, *, out: Tensor | None = None) -> Tensor:
    """Project each row of `a` onto the span of the basis columns: a Q Qᵀ.

    Args:
        a: `[..., n, n]`; basis: `[..., n, k]` orthonormal (zero columns allowed).
        out: optional `[..., n, n]` tensor to write into.
    Returns: `[..., n, n]`.
    """
    return torch.matmul(a @ basis, basis.transpose(-1, -2), out=out)
