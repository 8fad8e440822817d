"""Model-based maps from perturbed re-runs: Value Zeroing (Mohebbi et al. 2023), erasure
and input × gradient, reduced from plain tensors.

Shapes: L layers, n tokens, d model width, B perturbed copies; `columns[b]` is the token
j perturbed in copy b, so a copy fills column j of every `[L, n, n]` map.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from identifiable.errors import IdentifiableError


def cosine_distances(clean: Tensor, perturbed: Tensor) -> Tensor:
    """`[B, L, n]` 1 − cos(clean[l, i], perturbed[b, l, i]) in float64, clamped to [0, 2].

    Args: clean `[L, n, d]`; perturbed `[B, L, n, d]`.
    """
    a = clean.double()[None]
    b = perturbed.double()
    cos = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(1e-300)
    return (1.0 - cos).clamp(0.0, 2.0)


def change_norms(clean: Tensor, perturbed: Tensor) -> Tensor:
    """`[B, L, n]` ‖clean[l, i] − perturbed[b, l, i]‖₂ in float64."""
    return (perturbed.double() - clean.double()[None]).norm(dim=-1)


def causal_mask_(maps: Tensor) -> Tensor:
    """Zero every entry j > i in place. In a causal model token j > i cannot reach token i;
    a perturbed copy's output for such i is the clean one up to kernel rounding, which
    would otherwise show as ~1e-7 (a cosine of two equal vectors is 1 only up to rounding)."""
    n = maps.shape[-1]
    maps.masked_fill_(torch.ones(n, n, dtype=torch.bool).triu(1), 0.0)
    return maps


def input_times_jacobian(f: Callable[[Tensor], Tensor], e0: Tensor, columns: Tensor) -> Tensor:
    """`[B, L+1, n, d]` J_{·j} x_j for each j = columns[b]: one JVP whose tangent is e0 with
    every row but j set to 0, i.e. the first-order change of every hidden state when token
    j's input x_j is scaled, Σ_k x_{jk} ∂h_i/∂x_{jk}.

    f maps e0 `[n, d]` to `[L+1, n, d]` and must work under `torch.func.jvp`/`vmap`.
    """
    n = e0.shape[0]
    onehot = torch.zeros(len(columns), n, 1, dtype=e0.dtype, device=e0.device)
    onehot[torch.arange(len(columns)), columns.to(e0.device)] = 1.0
    tangents = onehot * e0[None]

    def push(t: Tensor) -> Tensor:
        return torch.func.jvp(f, (e0,), (t,))[1]

    try:
        with torch.no_grad():
            return torch.func.vmap(push)(tangents)
    except (RuntimeError, NotImplementedError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise IdentifiableError(
            f"grad-input needs derivatives of the model, which failed ({first}); use the "
            "erasure method, which needs none"
        ) from exc
