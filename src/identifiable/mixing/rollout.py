"""Attention rollout and its building blocks (Abnar & Zuidema 2020), on plain tensors.

Conventions: maps are `[L, n, n]` with rows = receiving token i, columns = source j;
"row-stochastic" means every row sums to 1. Rollout composes layer maps from the input
upwards, R_1 = M_1 and R_l = M_l · R_{l−1}, so row i of R_l is a distribution over input
tokens whenever every M_l is row-stochastic.
"""

from __future__ import annotations

import torch
from torch import Tensor

from identifiable.errors import IdentifiableError


def _check_maps(maps: Tensor, what: str) -> None:
    if maps.dim() != 3 or maps.shape[1] != maps.shape[2] or maps.shape[0] < 1:
        raise IdentifiableError(f"{what} must be [L, n, n] with L ≥ 1, got {tuple(maps.shape)}")


def head_average(attentions: Tensor) -> Tensor:
    """`[L, H, n, n]` → `[L, n, n]` float64 mean over heads (rows of A stay row-stochastic)."""
    if attentions.dim() != 4:
        raise IdentifiableError(f"attentions must be [L, H, n, n], got {tuple(attentions.shape)}")
    return attentions.double().mean(1)


def row_normalise(maps: Tensor) -> Tensor:
    """Divide every row by its sum; rows summing to 0 stay 0. Entries must be ≥ 0."""
    sums = maps.sum(-1, keepdim=True)
    return torch.where(sums > 0, maps / torch.where(sums > 0, sums, 1.0), 0.0)


def with_residual(maps: Tensor, weight: float = 0.5) -> Tensor:
    """weight·M + (1 − weight)·I, rows renormalised to sum to 1 (Abnar & Zuidema's Ã).

    For a row-stochastic M the renormalisation changes nothing; it matters only for maps
    whose rows do not sum to 1, and keeps rollout's rows distributions in every case.
    """
    _check_maps(maps, "maps")
    if not 0.0 <= weight <= 1.0:
        raise IdentifiableError(f"residual weight must be in [0, 1], got {weight}")
    eye = torch.eye(maps.shape[-1], dtype=maps.dtype, device=maps.device)
    return row_normalise(weight * maps + (1.0 - weight) * eye)


def rollout(maps: Tensor) -> Tensor:
    """`[L, n, n]` → `[L, n, n]`: R_0 = M_0, R_l = M_l · R_{l−1} (0-based layers)."""
    _check_maps(maps, "maps")
    out = torch.empty_like(maps)
    out[0] = maps[0]
    for layer in range(1, maps.shape[0]):
        out[layer] = maps[layer] @ out[layer - 1]
    return out


def clip_renormalise(maps: Tensor, fallback: Tensor) -> tuple[Tensor, int]:
    """Effective attention is no distribution: set negative entries to 0 and renormalise rows.

    Args:
        maps: `[L, n, n]` head-averaged effective attention (entries may be < 0).
        fallback: `[L, n, n]` row-stochastic map used for any row with no positive entry
            (the raw attention row); cannot arise when the row's raw weights sum to 1
            and its null part sums to 0, but effective attention's paper variant does
            not guarantee that.
    Returns:
        (row-stochastic maps, number of rows that fell back).
    """
    clipped = maps.clamp_min(0.0)
    sums = clipped.sum(-1, keepdim=True)
    empty = sums <= 0
    out = torch.where(empty, fallback.to(maps.dtype), clipped / torch.where(empty, 1.0, sums))
    return out, int(empty.sum())
