"""Slow reference route: SVD of the full n×d matrix T = V H per head (and per row for decoders).

This is the route of the paper's public code, kept as an independent check of
the fast n×d_v route (tests) and as the benchmark's baseline. Do not use it
for real work: it costs O(n²·d) per head instead of O(n·d_v²).
"""

from __future__ import annotations

import torch
from torch import Tensor

from identifiable.attention.linalg import column_basis, project_rows


def effective_rows_reference(
    a: Tensor, t: Tensor, *, stochastic: bool, causal: bool, d_v: int
) -> Tensor:
    """Effective attention of one head from the explicit T.

    Args:
        a: `[n, n]` float64 attention; t: `[n, d]` float64 T = V H.
        d_v: head width (the rank tolerance's max(n, d_v), as in the fast route).
        stochastic: project onto col([T, 1]) instead of col(T).
        causal: row i uses T[:i+1] (one SVD per row).
    Returns: `[n, n]` float64.
    """
    n = t.shape[0]
    if not causal:
        return _project(a, t, stochastic, d_v)
    out = torch.zeros_like(a)
    for i in range(n):
        out[i, : i + 1] = _project(a[i : i + 1, : i + 1], t[: i + 1], stochastic, d_v)[0]
    return out


def effective_attention_reference(
    attentions: Tensor, values: Tensor, out_proj: Tensor, *, stochastic: bool, causal: bool
) -> Tensor:
    """All heads: attentions `[L, H, n, n]`, values `[L, H, n, d_v]`, out_proj `[L, H, d_v, d]`."""
    out = torch.empty(attentions.shape, dtype=torch.float64)
    for layer in range(attentions.shape[0]):
        for head in range(attentions.shape[1]):
            t = values[layer, head].double() @ out_proj[layer, head].double()
            a = attentions[layer, head].double()
            out[layer, head] = effective_rows_reference(
                a, t, stochastic=stochastic, causal=causal, d_v=values.shape[-1]
            )
    return out


def _project(a: Tensor, t: Tensor, stochastic: bool, d_v: int) -> Tensor:
    if stochastic:  # the definition: one SVD of [T, s·1] with ‖s·1‖ = σ_max(T) (1 if T = 0)
        smax = float(torch.linalg.matrix_norm(t, ord=2))
        ones = torch.full_like(t[:, :1], (smax if smax > 0 else 1.0) * t.shape[0] ** -0.5)
        t, d_v = torch.cat([t, ones], -1), d_v + 1
    q, rank, _ = column_basis(t, width=d_v)
    if int(rank) == t.shape[0]:
        return a.clone()
    return project_rows(a, q)
