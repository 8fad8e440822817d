"""From squared Jacobian block norms to contributions c^l_{i,j} (docs/definitions.md#hta).

c^l_{i,j} = ‖∂e^l_i/∂x_j‖_F / Σ_k ‖∂e^l_i/∂x_k‖_F, so every row sums to 1.
"""

from __future__ import annotations

import torch


def contributions(sq: torch.Tensor) -> torch.Tensor:
    """Normalised contributions from squared norms.

    Args:
        sq: `[..., n, n]` squared Frobenius norms, indexed [..., i, j] (≥ 0; tiny
            negative rounding is clamped).
    Returns:
        `[..., n, n]` contributions, rows summing to 1 (a row of zeros, which a real
        model never produces since e^l_i depends on x_i, stays zero).
    """
    norms = sq.clamp_min(0.0).sqrt()
    total = norms.sum(-1, keepdim=True)
    return torch.where(total > 0, norms / total.clamp_min(torch.finfo(norms.dtype).tiny), 0.0)


def contribution_stderr(sq: torch.Tensor, sq_var: torch.Tensor) -> torch.Tensor:
    """Delta-method standard error of `contributions(sq)` given the variance of `sq`.

    With s_j = √q_j, S = Σ_k s_k and c_j = s_j / S: Var(s_j) ≈ Var(q_j) / (4 q_j), and
    since the probes of different input tokens j are independent,
        Var(c_j) ≈ [(S − s_j)² Var(s_j) + s_j² Σ_{k≠j} Var(s_k)] / S⁴.
    First-order only: c from √(unbiased q) carries a small Jensen bias of order Var(q)/q².

    Args:
        sq, sq_var: `[..., n, n]` estimate and its variance (indexed [..., i, j]).
    Returns:
        `[..., n, n]` standard errors (0 where q_j = 0, e.g. causally masked j > i).
    """
    q = sq.clamp_min(0.0)
    s = q.sqrt()
    var_s = torch.where(q > 0, sq_var / (4 * q.clamp_min(torch.finfo(q.dtype).tiny)), 0.0)
    total_s = s.sum(-1, keepdim=True)
    total_var = var_s.sum(-1, keepdim=True)
    var_c = ((total_s - s).square() * var_s + s.square() * (total_var - var_s)) / total_s.pow(4)
    return var_c.clamp_min(0.0).sqrt()
