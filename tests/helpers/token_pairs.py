"""Synthetic `TokenPairs` with known structure, for tests that need no model.

e^0_i is the embedding of a vocabulary id (optionally plus a position vector);
each layer applies a random invertible linear map, mixes in the sequence mean
and adds noise. So naive look-up degrades with depth, a linear probe undoes the
maps, and, without positions, repeated ids give bit-identical e^0 (ties).
"""

from __future__ import annotations

import torch

from identifiable.tokens.extract import TokenPairs


def synthetic_pairs(
    *,
    n_seq: int = 40,
    seq_len: tuple[int, int] = (8, 20),
    d: int = 16,
    n_layers: int = 3,
    vocab: int = 500,
    positions: bool = True,
    mix: float = 0.3,
    noise: float = 0.05,
    seed: int = 0,
) -> TokenPairs:
    g = torch.Generator().manual_seed(seed)
    word = torch.randn(vocab, d, generator=g)
    pos = torch.randn(seq_len[1], d, generator=g) * 0.5
    maps = [
        torch.linalg.qr(torch.randn(d, d, generator=g))[0] * (1.0 + 0.5 * i)
        for i in range(n_layers)
    ]
    mixers = [torch.randn(d, d, generator=g) / d**0.5 for _ in range(n_layers)]
    states, seq_ids, ids, posns = [], [], [], []
    for s in range(n_seq):
        n = int(torch.randint(seq_len[0], seq_len[1] + 1, (1,), generator=g))
        tok = torch.randint(0, vocab, (n,), generator=g)
        e = word[tok] + (pos[:n] if positions else 0.0)
        layers = [e]
        for q, m in zip(maps, mixers, strict=True):
            e = e @ q + mix * e.mean(0, keepdim=True) @ m + noise * torch.randn(n, d, generator=g)
            layers.append(e)
        states.append(torch.stack(layers, 1))
        seq_ids.append(torch.full((n,), s))
        ids.append(tok)
        posns.append(torch.arange(n))
    return TokenPairs(torch.cat(states), torch.cat(seq_ids), torch.cat(ids), torch.cat(posns))


def vocabulary(pairs: TokenPairs, *, vocab: int = 500, d: int = 16, seed: int = 0) -> torch.Tensor:
    """The word-embedding matrix `synthetic_pairs` drew with the same seed and sizes."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, d, generator=g)
