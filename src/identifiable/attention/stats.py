"""Small reductions of raw vs effective attention used by the experiments and the CLI.

Pearson sums let a caller pool correlations over layers and heads while
holding one layer at a time. Token categories follow the paper (Fig. 1b/c):
[CLS], [SEP] and '.'/',', with the model's own special tokens standing in
for models that have no [CLS]/[SEP] (e.g. GPT-2's BOS), named in the output.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

PUNCTUATION = (".", ",")
_ROLE_ORDER = ("cls", "sep", "bos", "eos")
_WORD_MARKS = ("Ġ", "▁", "##", "Ċ")


def pearson_sums(x: Tensor, y: Tensor, mask: Tensor | None = None) -> Tensor:
    """`[6]` float64: count, Σx, Σy, Σx², Σy², Σxy over the entries where `mask` is True.

    Args: x, y `[...]` same shape; mask broadcastable to it (None: all entries).
    """
    if mask is not None:
        m = mask.expand_as(x)
        x, y = x[m], y[m]
    # Flat float64 dot products: no [H, n, n] temporaries beyond the float64 copies.
    x, y = x.double().reshape(-1), y.double().reshape(-1)
    return torch.stack(
        [torch.tensor(float(x.numel()), dtype=torch.float64), x.sum(), y.sum(), x @ x, y @ y, x @ y]
    )


def pearson_from_sums(s: Tensor) -> float:
    """Pearson r from `pearson_sums` (added up over any number of parts); NaN if undefined."""
    n, sx, sy, sxx, syy, sxy = (float(v) for v in s)
    cov = n * sxy - sx * sy
    var = (n * sxx - sx * sx) * (n * syy - sy * sy)
    if n < 2 or var <= 0:
        return math.nan
    return max(-1.0, min(1.0, cov / math.sqrt(var)))


def causal_mask(n: int) -> Tensor:
    """`[n, n]` bool, True where a decoder row may attend (key ≤ query)."""
    idx = torch.arange(n)
    return idx[None, :] <= idx[:, None]


def token_categories(
    tokens: list[str], special_tokens: dict[str, str]
) -> dict[str, tuple[str, Tensor]]:
    """Key categories of one sequence: name → (token text, `[n]` bool mask).

    Names: "CLS", "SEP", "BOS", "EOS" for the model's special tokens (roles
    that share one token string are merged under the first role, in that
    order), and "PUNCT" for '.' and ','. Categories absent from the model are
    left out; present-but-absent-from-the-sequence ones have an all-False mask.
    """
    out: dict[str, tuple[str, Tensor]] = {}
    seen: set[str] = set()
    for role in _ROLE_ORDER:
        tok = special_tokens.get(role)
        if tok and tok not in seen:
            seen.add(tok)
            out[role.upper()] = (tok, torch.tensor([t == tok for t in tokens], dtype=torch.bool))
    punct = torch.tensor(
        [_bare(t) in PUNCTUATION and t not in seen for t in tokens], dtype=torch.bool
    )
    out["PUNCT"] = (" ".join(PUNCTUATION), punct)
    return out


def attention_to(a: Tensor, keys: Tensor) -> Tensor:
    """Mean over query rows of the summed weight on `keys`.

    Args: a `[..., n, n]`; keys `[n]` bool. Returns `[...]` float64.
    """
    return (a.double() @ keys.double()).mean(-1)


def _bare(token: str) -> str:
    for mark in _WORD_MARKS:
        token = token.replace(mark, "")
    return token.strip()
