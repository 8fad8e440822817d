"""Causal sliding windows at the cost of a causal layer (docs/definitions.md#key-sets).

Row i of a layer with window w sees the keys max(0, i − w + 1)..i (Mistral, Gemma-2/3's
local layers, Qwen2, GPT-Neo's local layers). Rows i < w see a prefix and go through
`causal.py`. Rows i ≥ w see exactly w keys; they are taken in blocks of b rows
[s, s + b), whose windows all contain the *base* keys s + b − w .. s. With G_0 the base's
Gram matrix (L Lᵀ = G_0), row s + t adds the b − 1 keys it sees outside the base: the
last b − 1 − t of the b − 1 keys left of the base and the first t right of it, a
contiguous run of the block's 2b − 2 extra keys. So

    G_i = L (I + P_W P_Wᵀ) Lᵀ,   P = L⁻¹ [extra key rows]ᵀ,   W the row's run,

solved by Woodbury with one (b − 1)² Cholesky factorisation per row: O(n·w·k) for the
two banded products and O(n·(k² + b·k + b³)) for the solves, against O(n·w·k²) for a
basis per window. A block is taken this way only when its base is provably of rank k
with a margin (the smallest eigenvalue of G_0, bounded below through L⁻¹, exceeds
100 × the squared rank tolerance of the widest window of the block): then every window
of the block has rank k = m and the SVD decision of `keysets.py` is the same. Other
rows (windows of at most k keys, or rank-deficient ones) take `keysets.py`'s route, one
basis per window.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from identifiable.attention.causal import prefixes, project_prefixes
from identifiable.attention.linalg import _column_basis

_EPS = torch.finfo(torch.float64).eps
_SLAB_BYTES = 64 * 2**20  # temporaries per batch of blocks


def causal_band(mask: Tensor) -> int | None:
    """w when `mask` `[n, n]` is the causal window of w < n keys (row i sees
    i − w + 1..i), else None."""
    n = mask.shape[0]
    w = int(mask[-1].sum()) if n else 0
    if not 1 <= w < n:
        return None
    i = torch.arange(n, device=mask.device)[:, None]
    j = torch.arange(n, device=mask.device)[None, :]
    return w if torch.equal(mask, (j <= i) & (i - j < w)) else None


@dataclass
class _Blocks:
    """Certified blocks of equal length b: first rows `starts` `[T]`, per block L⁻¹
    `[T, k, k]`, P `[T, k, 2b − 2]`, the Cholesky factors of I + P_Wᵀ P_W per row
    `[T, b, b − 1, b − 1]`."""

    starts: Tensor
    l_inv: Tensor
    p: Tensor
    chol: Tensor


class WindowSolve:
    """The window structure of one matrix X `[n, m]` (see the module docstring).

    Attributes:
        rank: `[n]` int64, rank(X[S_i]) for each row's window S_i.
    """

    def __init__(self, x: Tensor, w: int, scale: Tensor) -> None:
        n, m = x.shape
        dev = x.device
        self.x, self.w, self.n = x, w, n
        self.head = prefixes(x[None, :w], scale.reshape(1))
        self.rank = torch.empty(n, dtype=torch.long, device=dev)
        self.rank[:w] = self.head.rank[0]
        b = max(1, min(64, (w - m + 1) // 2))
        starts = torch.arange(w, n, b, device=dev)
        self.blocks: list[_Blocks] = []
        failed: list[Tensor] = []
        for size in sorted({min(b, n - int(s)) for s in starts}):
            group = starts[torch.clamp(n - starts, max=b) == size]
            ok, blocks = (
                _certified(x, w, size, group)
                if size > 1 and w - size + 1 >= m
                else (torch.zeros(group.numel(), dtype=torch.bool, device=dev), None)
            )
            if blocks is not None and bool(ok.any()):
                self.blocks.append(_take(blocks, ok))
                for s in group[ok].tolist():
                    self.rank[s : s + size] = min(w, m)
            for s in group[~ok].tolist():
                failed.append(torch.arange(s, s + size, device=dev))
        self.fallback = (
            torch.cat(failed) if failed else torch.zeros(0, dtype=torch.long, device=dev)
        )
        self.bases, ranks = _window_bases(x, w, self.fallback)
        self.rank[self.fallback] = ranks

    def project(self, a: Tensor, out: Tensor, dtype: torch.dtype) -> None:
        """out = A_eff of this matrix's rows for attention a `[n, n]` (zero outside windows)."""
        w = self.w
        out.zero_()
        project_prefixes(a[None, :w, :w], self.head, out=out[None, :w, :w], dtype=dtype)
        for blocks in self.blocks:
            _project_blocks(a, self.x, w, blocks, out)
        rows = self.fallback
        if rows.numel():
            keys = rows[:, None] - w + 1 + torch.arange(w, device=rows.device)[None, :]  # [R, w]
            rows, keys = rows.to(a.device), keys.to(a.device)
            sub = a[rows[:, None], keys].to(self.x.device, torch.float64)[:, None]  # [R, 1, w]
            proj = (sub @ self.bases) @ self.bases.transpose(-1, -2)
            full = (self.rank.to(a.device)[rows] == w)[:, None, None].to(sub.device)
            out[rows[:, None], keys] = torch.where(full, sub, proj)[:, 0].to(out.device, out.dtype)


def _certified(x: Tensor, w: int, size: int, starts: Tensor) -> tuple[Tensor, _Blocks]:
    """Base factors of blocks of `size` rows at `starts`, and which are certified."""
    m, dev = x.shape[1], x.device
    base_len = w - size + 1
    offs = torch.arange(base_len, device=dev)
    parts: list[Tensor] = []
    batch = max(1, _SLAB_BYTES // (8 * base_len * m))
    for i in range(0, starts.numel(), batch):  # Gram of each base, a batch of blocks at a time
        s = starts[i : i + batch]
        rows = x[(s[:, None] + size - w + offs[None, :])]  # [B, base_len, m]
        parts.append(rows.transpose(-1, -2) @ rows)
    gram = torch.cat(parts)
    lower, info = torch.linalg.cholesky_ex(gram)
    eye = torch.eye(m, dtype=x.dtype, device=dev)
    lower = torch.where((info == 0)[:, None, None], lower, eye)
    l_inv = torch.linalg.solve_triangular(lower, eye, upper=False)
    # Extra keys of the block: b − 1 left of the base, b − 1 right of it (row s excluded).
    left = starts[:, None] - w + 1 + torch.arange(size - 1, device=dev)[None, :]
    right = starts[:, None] + 1 + torch.arange(size - 1, device=dev)[None, :]
    extra = x[torch.cat([left, right], dim=1)]  # [T, 2b − 2, m]
    # Certificate: λ_min(G_0) ≥ 1/‖L⁻¹‖_F² above 100 × (tolerance of the widest window)²,
    # σ_max(X[S])² ≤ ‖X[S]‖_F² ≤ ‖base‖_F² + ‖extra‖_F².
    frob2 = gram.diagonal(dim1=-2, dim2=-1).sum(-1) + extra.square().sum((-2, -1))
    tol2 = frob2 * (max(w, m) * _EPS) ** 2
    lam_min = 1.0 / l_inv.square().sum((-2, -1))
    ok = (info == 0) & (lam_min > 100.0 * tol2)
    # ... and well-conditioned, κ(base)² < 1e6 (as `_column_basis`'s Cholesky route): the
    # normal equations square κ, and a base that merely clears the tolerance lost 2.5e-4.
    ok &= lam_min * 1e6 > frob2
    p = l_inv @ extra.transpose(-1, -2)  # [T, m, 2b − 2]
    k = p.transpose(-1, -2) @ p  # [T, 2b − 2, 2b − 2]
    idx = torch.arange(size, device=dev)[:, None] + torch.arange(size - 1, device=dev)[None, :]
    runs = k[:, idx[:, :, None], idx[:, None, :]]  # [T, b, b − 1, b − 1]
    eye_b = torch.eye(size - 1, dtype=x.dtype, device=dev)
    chol, info_m = torch.linalg.cholesky_ex(eye_b + runs)
    ok &= (info_m == 0).all(-1)
    return ok, _Blocks(starts, l_inv, p, chol)


def _take(blocks: _Blocks, ok: Tensor) -> _Blocks:
    return _Blocks(blocks.starts[ok], blocks.l_inv[ok], blocks.p[ok], blocks.chol[ok])


def _project_blocks(a: Tensor, x: Tensor, w: int, blocks: _Blocks, out: Tensor) -> None:
    """A_eff of every row of these certified blocks (see the module docstring)."""
    size = blocks.chol.shape[1]
    span = w + size - 1  # keys seen by some row of a block
    dev = x.device
    offs = torch.arange(span, device=dev)
    rows_in = torch.arange(size, device=dev)
    band = (offs[None, :] >= rows_in[:, None]) & (offs[None, :] < rows_in[:, None] + w)
    idx = rows_in[:, None] + torch.arange(size - 1, device=dev)[None, :]  # each row's run
    batch = max(1, _SLAB_BYTES // (8 * size * span))
    for i in range(0, blocks.starts.numel(), batch):
        s = blocks.starts[i : i + batch]
        keys = s[:, None] - w + 1 + offs[None, :]  # [B, span]
        rws = s[:, None] + rows_in[None, :]  # [B, b]
        xk = x[keys]  # [B, span, m]
        slab = a[rws[:, :, None], keys[:, None, :]].to(dev, torch.float64)  # [B, b, span]
        o = (slab @ xk) @ blocks.l_inv[i : i + batch].transpose(-1, -2)  # rows L⁻¹ u_i
        p = blocks.p[i : i + batch]
        po = o @ p  # [B, b, 2b − 2]
        z = po.gather(2, idx.expand(po.shape[0], size, size - 1))
        q = torch.cholesky_solve(z[..., None], blocks.chol[i : i + batch])[..., 0]
        full = torch.zeros_like(po).scatter_(2, idx.expand(po.shape[0], size, size - 1), q)
        y = (o - full @ p.transpose(-1, -2)) @ blocks.l_inv[i : i + batch]  # rows G_i⁻¹ u_i
        eff = (y @ xk.transpose(-1, -2)) * band
        out[rws[:, :, None], keys[:, None, :]] = eff.to(out.device, out.dtype)


def _window_bases(x: Tensor, w: int, rows: Tensor) -> tuple[Tensor, Tensor]:
    """`[R, w, k]` orthonormal bases of col(X[S_i]) and `[R]` ranks, one per window
    (`keysets.py`'s rule: Cholesky QR when well-conditioned, else an SVD)."""
    m = x.shape[1]
    if not rows.numel():
        return x.new_zeros(0, w, min(w, m)), torch.zeros(0, dtype=torch.long, device=x.device)
    keys = rows[:, None] - w + 1 + torch.arange(w, device=x.device)[None, :]
    basis, rank, _, _ = _column_basis(x[keys], None)
    return basis, rank
