"""Synthetic traces, exact ranks and a plain LP reference for the attention tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linprog

from identifiable.models.trace import Trace

TEXT_SHORT = "the cat sat."  # n ≤ 16 = tiny head width: attention identifiable
TEXT_LONG = (
    "the cat sat on the mat. the dog sat on the log, and the bird sat on the cat while "
    "the fish swam in the bowl."
)  # n ≈ 30 > 16


def synthetic_trace(
    n: int = 12,
    *,
    layers: int = 2,
    heads: int = 3,
    d_v: int = 4,
    d: int = 10,
    causal: bool = False,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Trace:
    """A random but internally consistent Trace (attention rows sum to 1, causal zeros)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(layers, heads, n, n, generator=g)
    if causal:
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    att = torch.softmax(logits, -1)
    values = torch.randn(layers, heads, n, d_v, generator=g)
    value_bias = torch.randn(layers, heads, d_v, generator=g)
    out_proj = torch.randn(layers, heads, d_v, d, generator=g)
    out_bias = torch.randn(layers, d, generator=g)
    heads_out = torch.einsum("lhij,lhjv,lhvd->lid", att, values + value_bias[:, :, None], out_proj)
    return Trace(
        tokens=[f"t{i}" for i in range(n)],
        input_ids=torch.arange(n),
        attentions=att.to(dtype),
        values=values.to(dtype),
        value_bias=value_bias.to(dtype),
        out_proj=out_proj.to(dtype),
        out_bias=out_bias.to(dtype),
        hidden_states=torch.zeros(layers + 1, n, d, dtype=dtype),
        attn_outputs=(heads_out + out_bias[:, None]).to(dtype),
        is_causal=causal,
        kv_head_of=torch.arange(heads),
        special_tokens={},
        model_name="synthetic",
        architecture="synthetic",
    )


def exact_rank(x: torch.Tensor, width: int) -> int:
    """Rank by SVD with the rank tolerance σ_max · max(n, width) · eps(float64)."""
    s = torch.linalg.svdvals(x.double())
    if s.numel() == 0 or s[0] == 0:
        return 0
    return int((s > s[0] * max(x.shape[0], width) * torch.finfo(torch.float64).eps).sum())


def plain_bounds(a: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Independent reference for interval bounds: one scipy linprog per key and sense on
    the raw constraints x ≥ 0, Σx = Σa, xᵀV = aᵀV (no orthonormal basis, no shortcuts)."""
    n = a.size
    eq = np.vstack([np.ones(n), v.T])
    lo, hi = np.empty(n), np.empty(n)
    for j in range(n):
        for sense, out in ((1, lo), (-1, hi)):
            res = linprog(sense * np.eye(n)[j], A_eq=eq, b_eq=eq @ a, bounds=(0, None),
                          method="highs")  # fmt: skip
            out[j] = res.x[j]
    return lo, hi


def shared_rows(n: int, d_v: int, rows: int, seed: int, twins: bool = False):
    """An engine problem of `rows` rows sharing one key set of n keys: random values V
    `[n, d_v]` and softmax rows a `[rows, n]`; returns (A = Qᵀ `[1, m, n]` with Q an
    orthonormal basis of col([V, 1]), a, movable keys `[rows, n]`, V as numpy).

    twins: the first n / 2 value vectors repeated once, as repeated tokens give: keys with
    equal columns of A, whose reduced costs are 0 when their twin is basic."""
    from identifiable.attention.certificates import movable_keys
    from identifiable.attention.linalg import add_ones, column_basis

    g = torch.Generator().manual_seed(seed)
    if twins:
        half = torch.randn(n // 2, d_v, generator=g, dtype=torch.float64)
        v = torch.cat([half, half])
    else:
        v = torch.randn(n, d_v, generator=g, dtype=torch.float64)
    a = torch.softmax(torch.randn(rows, n, generator=g, dtype=torch.float64) * 2, 1).numpy()
    q, r, _ = column_basis(v)
    qa, _ = add_ones(q, r)
    basis = qa[:, torch.linalg.vector_norm(qa, dim=0) > 0].numpy()
    return basis.T[None], a, np.repeat(movable_keys(basis)[None], rows, 0), v.numpy()


def assert_certified(sol, a: np.ndarray, v: np.ndarray, resid: float = 1e-9) -> None:
    """The bounds of an `IntervalSolution` of rows a `[R, n]` over values v `[n, d_v]`
    equal per-key scipy LPs (`plain_bounds`, 1e-8), and every witness it kept is a point
    of P (x ≥ 0, Σx = Σa, ‖(x − a)ᵀV‖∞ < resid) attaining its bound."""
    for i in range(a.shape[0]):
        lo, hi = plain_bounds(a[i], v)
        np.testing.assert_allclose(sol.lower[i], lo, atol=1e-8)
        np.testing.assert_allclose(sol.upper[i], hi, atol=1e-8)
    for (i, j, s), x in (sol.vertices or {}).items():
        assert (x >= 0).all() and abs(x.sum() - a[i].sum()) < 1e-9
        assert np.abs((x - a[i]) @ v).max() < resid
        assert x[j] == pytest.approx((sol.upper if s > 0 else sol.lower)[i, j], abs=1e-12)


def engine(aq, a, allowed, movable, **options):
    """`lp.bound_keys` on the rows (aq `[R or 1, m, n]`, a, allowed, movable `[R, n]`) with
    `EngineOptions(**options)`, every bound and every LP's final basis checked by the
    independent verifier (verify="all", unless the caller says otherwise), on the compiled
    engine unless the caller names another backend."""
    from identifiable.attention.lp import BoundProblem, EngineOptions, bound_keys

    options.setdefault("verify", "all")
    options.setdefault("backend", "engine")
    return bound_keys(BoundProblem(aq, a, allowed, movable), EngineOptions(**options))
