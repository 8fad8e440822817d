"""Reverse-mode reference: one backward pass per output coordinate per layer.

This is how Jacobian norms are usually computed in analysis scripts: for each layer
l, output token i and coordinate a, `autograd.grad(e^l_{i,a}, x)` gives row a of
every block ∂e^l_i/∂x_j at once, and squared norms are summed over a. It needs
L·n·d backward passes against the n·d JVPs of `jacobian_sq_norms`; it is kept as an
independent check for tests and as the baseline of `benchmarks/bench_attribution.py`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from identifiable.attribution.jacobian import LayerFn


def reverse_mode_sq_norms(
    f: LayerFn,
    e0: torch.Tensor,
    *,
    rows: Iterable[tuple[int, int]] | None = None,
) -> torch.Tensor:
    """‖∂e^l_i/∂x_j‖_F² by L·n·d scalar backward passes.

    Args:
        f: e0 `[n, d]` -> `[L+1, n, d]` (index 0 = e0).
        e0: `[n, d]` the primal input.
        rows: (layer l in 1..L, token i) pairs to compute; all of them if None. Rows
            not computed are NaN (lets a benchmark time a sample of rows).
    Returns:
        `[L, n, n]` float64 indexed [l-1, i, j].
    """
    x = e0.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        out = f(x)
    n_layers, n, d = out.shape[0] - 1, out.shape[1], out.shape[2]
    wanted = (
        rows
        if rows is not None
        else [(layer, i) for layer in range(1, n_layers + 1) for i in range(n)]
    )
    sq = torch.full((n_layers, n, n), float("nan"), dtype=torch.float64)
    for layer, i in wanted:
        acc = torch.zeros(n, dtype=torch.float64)
        for a in range(d):
            (g,) = torch.autograd.grad(out[layer, i, a], x, retain_graph=True)
            acc += g.double().square().sum(-1).cpu()
        sq[layer - 1, i] = acc
    return sq
