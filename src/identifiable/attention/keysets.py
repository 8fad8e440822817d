"""Null spaces and effective attention when each query row sees its own set of keys.

Sliding windows, local attention and padding give row i a key set S_i that is
neither "all keys" (encoders, `linalg.py`) nor "keys ≤ i" (decoders,
`causal.py`). Row i's matrix is then X[S_i] (X = V' or [V', s·1], see
`linalg.py`): its null space lives in R^{|S_i|}, rank(X[S_i]) and
dim LN(X[S_i]) = |S_i| − rank are per row, and the effective row is a_i[S_i]
projected onto col(X[S_i]), scattered back with exact zeros outside S_i.

Method: rows with identical key sets share one basis. The distinct sets are
grouped by size and each group's matrices X[S] go through one batched
`_column_basis` (Cholesky QR when well-conditioned, else an SVD with the rank
tolerance σ_max(X[S]) · max(|S|, m) · eps, m = X's width), so a sliding window
of w keys costs O(n · w · m²) per head instead of n SVDs of the full prefix.
A row whose X[S_i] has full row rank keeps a_i unchanged (identity projection).

Row-stochastic variant: whether the ones vector adds a direction to col(X[S]) is
decided exactly where the distinct rows of X[S] are independent (`linalg.ones_inside`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from identifiable.attention.linalg import _column_basis, add_ones, project_rows
from identifiable.errors import IdentifiableError
from identifiable.models.trace import Trace


@dataclass(frozen=True)
class KeySetGroup:
    """Distinct key sets of one size s and the rows that use them.

    Attributes:
        keys: `[G, s]` int64 key indices of each set (ascending).
        rows: list of G `[r_g]` int64 query rows using set g.
        basis: `[H, G, s, k]` orthonormal basis of col(X[S]) (zero columns beyond the rank).
        rank: `[H, G]` int64.
        basis_stochastic, rank_stochastic: the same for [X[S], s·1].
    """

    keys: Tensor
    rows: list[Tensor]
    basis: Tensor
    rank: Tensor
    basis_stochastic: Tensor
    rank_stochastic: Tensor


def keyset_groups(x: Tensor, mask: Tensor, ids: Tensor) -> list[KeySetGroup]:
    """Bases of col(X[S]) and col([X[S], 1]) for every distinct key set of `mask`.

    Args:
        x: `[H, n, m]` float64 (V' = V F of each head).
        mask: `[n, n]` bool, mask[i, j]: row i sees key j.
        ids: `[H, n]` `linalg.row_ids` of V (not of x: a product need not round equal rows
            equally).
    Returns: one `KeySetGroup` per distinct set size (sets of size 0 are skipped).
    """
    n_h, _, m = x.shape
    sets, inverse = torch.unique(mask, dim=0, return_inverse=True)  # [U, n], [n]
    sizes = sets.sum(-1)
    groups = []
    for size in sorted(set(sizes.tolist())):
        if size == 0:
            continue
        members = (sizes == size).nonzero()[:, 0]
        keys = torch.stack([sets[u].nonzero()[:, 0] for u in members.tolist()])  # [G, s]
        rows = [(inverse == u).nonzero()[:, 0] for u in members.tolist()]
        g = keys.shape[0]
        sub = x[:, keys]  # [H, G, s, m]
        basis, rank, _, _ = _column_basis(sub.reshape(n_h * g, size, m), None)
        basis_a, rank_a = add_ones(basis, rank, ids[:, keys].reshape(n_h * g, size))
        groups.append(
            KeySetGroup(
                keys=keys,
                rows=rows,
                basis=basis.reshape(n_h, g, size, -1),
                rank=rank.reshape(n_h, g),
                basis_stochastic=basis_a.reshape(n_h, g, size, -1),
                rank_stochastic=rank_a.reshape(n_h, g),
            )
        )
    return groups


def keyset_ranks(groups: list[KeySetGroup], n_heads: int, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row rank, dim LN and dim LN([·, 1]), each `[H, n]` int64."""
    dev = groups[0].rank.device if groups else None
    rank = torch.zeros(n_heads, n, dtype=torch.long, device=dev)
    rank_a = torch.zeros(n_heads, n, dtype=torch.long, device=dev)
    seen = torch.zeros(n, dtype=torch.long, device=dev)
    for grp in groups:
        size = grp.keys.shape[1]
        for g, rows in enumerate(grp.rows):
            rank[:, rows] = grp.rank[:, g, None]
            rank_a[:, rows] = grp.rank_stochastic[:, g, None]
            seen[rows] = size
    return rank, seen - rank, seen - rank_a


def project_rows_keysets(a: Tensor, groups: list[KeySetGroup], *, stochastic: bool) -> Tensor:
    """Each row a_i projected onto col(X[S_i]) within its keys; zero outside S_i.

    Args:
        a: `[H, n, n]` attention (zero outside each row's keys), any float dtype.
        groups: from `keyset_groups`.
        stochastic: project onto col([X[S], 1]) (row-stochastic variant).
    Returns: `[H, n, n]` float64.
    """
    out = torch.zeros(a.shape, dtype=torch.float64, device=a.device)
    for grp in groups:
        basis = grp.basis_stochastic if stochastic else grp.basis
        rank = grp.rank_stochastic if stochastic else grp.rank
        size = grp.keys.shape[1]
        counts = {int(r.numel()) for r in grp.rows}
        if len(counts) == 1:  # e.g. sliding windows: one row per set, all batched
            rows = torch.stack(grp.rows)  # [G, R]
            idx_r, idx_k = rows[:, :, None], grp.keys[:, None, :]
            sub = a[:, idx_r, idx_k].double()  # [H, G, R, s]
            proj = project_rows(sub, basis)
            full = (rank == size)[:, :, None, None]
            out[:, idx_r, idx_k] = torch.where(full, sub, proj)
            continue
        for g, rows in enumerate(grp.rows):
            idx_r, idx_k = rows[:, None], grp.keys[g][None, :]
            sub = a[:, idx_r, idx_k].double()  # [H, r, s]
            proj = project_rows(sub, basis[:, g])
            full = (rank[:, g] == size)[:, None, None]
            out[:, idx_r, idx_k] = torch.where(full, sub, proj)
    return out


def layer_key_mask(trace: Trace, layer: int, key_mask: Tensor | None = None) -> Tensor:
    """`[n, n_k]` bool: the keys each query row of `layer` may attend to.

    Order of precedence: `key_mask` (`[n, n_k]` or `[L, n, n_k]`), then the trace's own key
    sets (`Trace.keys_seen`: windows, causal, or all n_k keys; n_k = n except for
    cross-attention, whose keys are the encoder's).
    """
    n, nk = trace.n_tokens, trace.n_keys
    if key_mask is None:
        return trace.keys_seen(layer)
    mask = torch.as_tensor(key_mask, dtype=torch.bool)
    if mask.dim() == 3:
        mask = mask[layer]
    if tuple(mask.shape) != (n, nk):
        raise IdentifiableError(
            f"key mask has shape {tuple(mask.shape)}, expected [n, n_k] or [L, n, n_k] "
            f"with n = {n}, n_k = {nk}"
        )
    return mask
