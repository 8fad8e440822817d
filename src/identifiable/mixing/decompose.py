"""Norm-based decompositions of one attention block: Kobayashi et al. (2020), GlobEnc
(Modarressi et al. 2022) and ALTI (Ferrando et al. 2022), on plain tensors.

Shapes: H heads, n tokens, d model width, d_v head width. For layer l and head h,
f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h `[d]` is token j's transformed value and the
attention output of token i is Σ_j Σ_h α^h_ij f_h(x_j) + b_O. With the residual the
block's pre-norm sum is z_i = Σ_j z_ij + b_O, z_ij = Σ_h α^h_ij f_h(x_j) + δ_ij x_i.

A LayerNorm is linear once its per-token divisor s_i = sqrt(var(z_i) + eps) is fixed:
LN(z_i) = Σ_j P(z_ij)/s_i + P(b_O)/s_i + β with P(v) = γ ⊙ (v − mean(v)) (RMSNorm:
P(v) = γ ⊙ v, β = 0). Every decomposition here therefore sums, with its `rest` (biases
and, through a second norm, the FFN output), to the block output it decomposes; the
tests check that against the model's own captured tensors.

Norms are computed without materialising the `[n, n, d]` vectors: since P is linear,
‖Σ_h α^h_ij P f_h(x_j) + δ_ij P x_i‖² = α_ijᵀ G_j α_ij (+ residual terms on the
diagonal) with G_j = [⟨P f_h(x_j), P f_k(x_j)⟩]_hk, an `[H, H]` Gram matrix per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from identifiable.models.blocks import NormParams


@dataclass(frozen=True)
class BlockPieces:
    """One layer's attention block, as a `Trace` and a `BlockCapture` give it.

    Attributes:
        attn: `[H, n, n]` attention probabilities α.
        f: `[H, n, d]` f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h.
        out_bias: `[d]` b_O.
        residual: `[n, d]` x_i, the residual entering the sum (the layer input).
    """

    attn: Tensor
    f: Tensor
    out_bias: Tensor
    residual: Tensor


def transformed_values(values: Tensor, value_bias: Tensor, out_proj: Tensor) -> Tensor:
    """f_h(x_j) `[H, n, d]` from values `[H, n, d_v]` (bias-free), b_V `[H, d_v]`, W_O^h `[H, d_v, d]`."""
    return torch.bmm(values + value_bias[:, None, :], out_proj)


def mixed_vectors(attn: Tensor, f: Tensor) -> Tensor:
    """`[n, n, d]` Σ_h α^h_ij f_h(x_j), indexed [i, j]: one batched product over j."""
    by_key = torch.bmm(attn.permute(2, 1, 0), f.permute(1, 0, 2))  # [j, i, d]
    return by_key.permute(1, 0, 2)


def _project(norms: Sequence[NormParams], v: Tensor) -> Tensor:
    """P_k ∘ … ∘ P_1 applied to the last axis (each norm with unit divisor, no β), in v's dtype."""
    for norm in norms:
        centre = v - v.mean(-1, keepdim=True) if norm.centred else v
        v = norm.weight.to(v.dtype) * centre
    return v


def decomposition(
    p: BlockPieces,
    norms: Sequence[NormParams] = (),
    scales: Sequence[Tensor] = (),
    extra: Sequence[Tensor | None] = (),
    *,
    residual: bool = True,
) -> tuple[Tensor, Tensor]:
    """Explicit per-token parts of the block output, and the unattributed rest.

    Args:
        p: the block.
        norms: the normalisations the sum passes through, in order (none for the
            attention output alone or a pre-norm residual stream).
        scales: per norm, `[n]` the divisor s_i of its actual input.
        extra: per norm, `[n, d]` what is added to the stream just before it apart from
            the decomposed parts (the FFN output before a second norm), or None.
        residual: add δ_ij x_i (False: the attention output alone, Kobayashi's map).
    Returns:
        parts `[n, n, d]` ([i, j]: the part of token i's output due to token j) and
        rest `[n, d]`, such that parts.sum(1) + rest is the block output.
    """
    parts = mixed_vectors(p.attn, p.f)
    if residual:
        idx = torch.arange(parts.shape[0])
        parts[idx, idx] += p.residual
    rest = p.out_bias.expand(parts.shape[0], -1).clone()
    for k, (norm, scale) in enumerate(zip(norms, scales, strict=True)):
        add = extra[k] if k < len(extra) else None
        if add is not None:
            rest = rest + add
        s = scale.reshape(-1, 1)
        parts = norm.linear_part(parts, s[:, :, None])
        rest = norm.linear_part(rest, s) + norm.bias
    return parts, rest


def part_norms(
    p: BlockPieces,
    norms: Sequence[NormParams] = (),
    scales: Sequence[Tensor] = (),
    *,
    residual: bool = True,
) -> Tensor:
    """`[n, n]` ‖parts[i, j]‖₂ of `decomposition`, by per-token Gram matrices (float64)."""
    a = p.attn.double().permute(2, 0, 1)  # [j, H, i]
    f = _project(norms, p.f.contiguous()).double().permute(1, 0, 2)  # [j, H, d]
    gram = torch.bmm(f, f.transpose(1, 2))  # [j, H, H]
    sq = (a * torch.bmm(gram, a)).sum(1).T.contiguous()  # [i, j]
    if residual:
        x = _project(norms, p.residual.to(f.dtype))  # [n, d]
        idx = torch.arange(x.shape[0])
        cross = torch.einsum("ih,ihd,id->i", a[idx, :, idx], f, x)
        sq[idx, idx] += 2 * cross + x.pow(2).sum(-1)
    total = torch.ones(sq.shape[0], dtype=torch.float64)
    for s in scales:
        total = total * s.double().reshape(-1)
    return sq.clamp_min(0).sqrt() / total[:, None]


def alti_contributions(parts: Tensor, output: Tensor, *, by_key: bool = False) -> Tensor:
    """ALTI's contributions from the L1 distance of each part to the output.

    c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_ij‖₁), rows normalised to sum to 1, where T_ij =
    parts[i, j] and y_i = output[i]. A part equal to the output scores ‖y_i‖₁, a part
    farther from y_i than the zero vector scores 0.

    Args:
        parts: `[n, n, d]` indexed [i, j] (or [j, i] with by_key=True); output: `[n, d]`.
    Returns:
        `[n, n]` float64 indexed [i, j].
    """
    if by_key:
        dist = (output[None, :, :] - parts).abs_().sum(-1).double().T
    else:
        dist = (output[:, None, :] - parts).abs().sum(-1).double()  # [n, n]
    size = output.abs().sum(-1).double()[:, None]
    c = (size - dist).clamp_min(0)
    sums = c.sum(-1, keepdim=True)
    return torch.where(sums > 0, c / torch.where(sums > 0, sums, 1.0), 0.0)


def alti_map(
    p: BlockPieces,
    output: Tensor,
    norms: Sequence[NormParams] = (),
    scales: Sequence[Tensor] = (),
    *,
    chunk: int = 4,
) -> Tensor:
    """`alti_contributions(parts, output)` of the residual decomposition, `[n, n]` float64,
    without ever holding all `[n, n, d]` parts.

    Cost: the n²·d L1 distances dominate, so they take two memory passes per block of
    keys (the product, then max and sum) and nothing more. The divisor s_i of the norms is moved to the other side,
    ‖y_i − T'_ij/s_i‖₁ = ‖s_i·y_i − T'_ij‖₁ / s_i, so the unscaled parts T'_ij =
    Σ_h α^h_ij P f_h(x_j) are compared with s_i·y_i straight out of one batched product;
    the residual δ_ij P x_i touches only the diagonal, which is computed apart in O(n·d).
    Keys go `chunk` at a time so that a block (chunk·n·d floats) stays in cache.
    Precision: products, maxima and each sum over d in the dtype of p.f (float32 for a
    float32 model), combined in float64: a distance is exact to about 1e-6 of
    ‖y_i‖₁ + ‖T_ij‖₁; divisors, contributions and normalisation are float64.
    """
    f = _project(norms, p.f).permute(1, 0, 2).contiguous()  # [j, H, d]
    x = _project(norms, p.residual.to(f.dtype))  # [n, d]
    attn = p.attn.to(f.dtype).permute(2, 1, 0).contiguous()  # [j, i, H]
    n = attn.shape[0]
    divisor = torch.ones(n, dtype=torch.float64)
    for s in scales:
        divisor = divisor * s.double().reshape(-1)
    y = output.double()
    sy = (y * divisor[:, None]).to(f.dtype)  # s_i·y_i [n, d]
    # ‖u − v‖₁ = 2·Σ max(u, v) − Σ u − Σ v: two memory passes over each block instead of
    # three, and Σ_c T'_ijc = Σ_h α^h_ij Σ_c f'_hjc is one small product.
    dist = torch.empty(n, n, dtype=torch.float64)  # [j, i]: ‖s_i y_i − T'_ij‖₁
    block = torch.empty(min(chunk, n), n, f.shape[-1], dtype=f.dtype)
    part_sums = torch.bmm(attn, f.sum(-1, keepdim=True)).squeeze(-1).double()  # [j, i]
    sy_sums = sy.double().sum(-1)  # [i]
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        out = block[: stop - start]
        torch.bmm(attn[start:stop], f[start:stop], out=out)
        dist[start:stop] = torch.maximum(out, sy, out=out).sum(-1)
    dist.mul_(2).sub_(part_sums).sub_(sy_sums)
    keys = torch.arange(n)
    diag = torch.bmm(attn[keys, keys][:, None, :], f).squeeze(1) + x  # T'_ii with residual
    dist[keys, keys] = (diag - sy).abs().sum(-1).double()
    size = y.abs().sum(-1)[:, None]
    c = (size - dist.T / divisor[:, None]).clamp_min(0)
    sums = c.sum(-1, keepdim=True)
    return torch.where(sums > 0, c / torch.where(sums > 0, sums, 1.0), 0.0)
