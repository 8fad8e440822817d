"""A small pure-function Transformer (post-LN encoder or pre-LN causal decoder) for tests.

Independent of Hugging Face, so the attribution maths is tested on its own.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def make_toy(
    n_layers: int = 2,
    d: int = 16,
    heads: int = 4,
    *,
    causal: bool = False,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
):
    """Return f: e0 [n, d] -> [L+1, n, d] with fixed random weights."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=dtype) / math.sqrt(shape[0])

    layers = [
        {
            "wq": w(d, d),
            "wk": w(d, d),
            "wv": w(d, d),
            "wo": w(d, d),
            "w1": w(d, 2 * d),
            "w2": w(2 * d, d),
            "b1": 0.1 * torch.randn(2 * d, generator=g, dtype=dtype),
        }
        for _ in range(n_layers)
    ]
    dh = d // heads

    def attend(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = ((x @ p[m]).reshape(n, heads, dh).transpose(0, 1) for m in ("wq", "wk", "wv"))
        scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
        if causal:
            mask = torch.ones(n, n, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        ctx = scores.softmax(-1) @ v  # [heads, n, dh]
        return ctx.transpose(0, 1).reshape(n, d) @ p["wo"]

    def mlp(x: torch.Tensor, p: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.gelu(x @ p["w1"] + p["b1"]) @ p["w2"]

    def f(e0: torch.Tensor) -> torch.Tensor:
        outs = [e0]
        h = e0
        for p in layers:
            if causal:  # pre-LN, as in GPT-2
                h = h + attend(F.layer_norm(h, (d,)), p)
                h = h + mlp(F.layer_norm(h, (d,)), p)
            else:  # post-LN, as in BERT
                h = F.layer_norm(h + attend(h, p), (d,))
                h = F.layer_norm(h + mlp(h, p), (d,))
            outs.append(h)
        return torch.stack(outs)

    return f


def toy_input(
    n: int, d: int = 16, seed: int = 1, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)
