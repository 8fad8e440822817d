"""Per-sequence statistics of contributions c `[L, n, n]` for paper Figs. 3-4.

All functions are pure and take c indexed [layer, i (hidden token), j (input token)].
"""

from __future__ import annotations

import torch

# Neighbour-distance groups of paper Fig. 4a: (label, lowest |i-j|, highest |i-j| or None).
DISTANCE_GROUPS: tuple[tuple[str, int, int | None], ...] = (
    ("1", 1, 1),
    ("2", 2, 2),
    ("3", 3, 3),
    ("4-5", 4, 5),
    ("6-10", 6, 10),
    ("11+", 11, None),
)


def own_contribution(c: torch.Tensor) -> torch.Tensor:
    """`[L, n]` c^l_{i,i}: the share of hidden token i that comes from its own input."""
    return torch.diagonal(c, dim1=-2, dim2=-1)


def top_contributor(c: torch.Tensor) -> torch.Tensor:
    """`[L, n]` argmax_j c^l_{i,j} (lowest j on exact ties)."""
    return c.argmax(-1)


def own_is_top(c: torch.Tensor) -> torch.Tensor:
    """`[L, n]` bool: whether token i's own input is (one of) its largest contributors.

    Ties count as "own is top", so P̃_l = 1 − mean(own_is_top) never counts a tie as a loss.
    """
    return own_contribution(c) >= c.max(-1).values


def distance_matrix(n: int) -> torch.Tensor:
    """`[n, n]` |i − j|."""
    idx = torch.arange(n)
    return (idx[:, None] - idx[None, :]).abs()


def distance_group_sums(c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Contribution of neighbours by distance group, per hidden token.

    Returns:
        sums: `[L, n, G]` Σ_{j : |i−j| in group g} c^l_{i,j}.
        counts: `[n, G]` number of positions j in group g for token i (0 near the ends
            of short sequences, where the group is empty).
    """
    n = c.shape[-1]
    dist = distance_matrix(n)
    masks = []
    for _, lo, hi in DISTANCE_GROUPS:
        upper = dist <= hi if hi is not None else torch.ones_like(dist, dtype=torch.bool)
        masks.append((dist >= lo) & upper)
    m = torch.stack(masks, -1).to(c.dtype)  # [n, n, G]
    sums = torch.einsum("lij,ijg->lig", c, m)
    return sums, m.sum(1)


def relative_position_totals(
    c: torch.Tensor, max_offset: int = 60
) -> tuple[torch.Tensor, torch.Tensor]:
    """Total contribution per relative position r = j − i, for r in −max_offset..max_offset.

    Returns:
        totals: `[L, 2·max_offset+1]` Σ_i c^l_{i,i+r} (0 where no pair is that far apart).
        pairs: `[2·max_offset+1]` number of (i, j) pairs at each offset.
    """
    n = c.shape[-1]
    offsets = torch.arange(-max_offset, max_offset + 1)
    totals = torch.zeros(c.shape[0], offsets.numel(), dtype=c.dtype)
    pairs = torch.zeros(offsets.numel(), dtype=torch.long)
    for k, r in enumerate(offsets.tolist()):
        if abs(r) < n:
            diag = torch.diagonal(c, offset=r, dim1=-2, dim2=-1)  # entries c[i, i+r]
            totals[:, k] = diag.sum(-1)
            pairs[k] = diag.shape[-1]
    return totals, pairs


def special_share(c: torch.Tensor, special: torch.Tensor) -> torch.Tensor:
    """`[L, n]` Σ_{j special} c^l_{i,j}: the share of token i coming from special tokens.

    Args:
        special: `[n]` bool mask of the input positions to count.
    """
    return (c * special.to(c.dtype)).sum(-1)
