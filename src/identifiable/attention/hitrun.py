"""Hit-and-run over the polytopes of valid attention rows, batched over rows and chains,
in torch on the device of its input (docs/posterior.md#the-sampler).

One row's polytope, over its s live keys, with N (s × k, orthonormal) spanning the left
null space of [T, 1] there:

    P = {x = a + N z ≥ 0}.

1. Centre (`centre`): the analytic centre x_c = argmax Σ log x_i over P, by damped
   Newton steps in z from a strictly interior start (`_interior`).
2. Rounding (`rounding`): with M = diag(1/x_c) N = Q R (thin QR), the Dikin ellipsoid at
   x_c is {x_c + N R⁻¹ w : |w| ≤ 1} ⊂ P. Directions are u = S g, S = N R⁻¹, g ~ N(0, I_k):
   this is plain hit-and-run in the coordinates w = R z, and a fixed linear change of
   coordinates maps the uniform distribution to the uniform distribution.
3. Step (`step`): the chord {x + t u ≥ 0} has exact end points t_lo = −min_{u_i>0} x_i/u_i
   and t_hi = min_{u_i<0} x_i/(−u_i); t ~ U[t_lo, t_hi] and x ← x + t u. For the uniform
   prior this is Smith's hit-and-run, whose stationary law is uniform on P. A Dirichlet
   prior π(x) ∝ Π x_i^{w_i} accepts the point with probability min(1, π(x')/π(x)) (the
   chord proposal is symmetric, so π is stationary).

Keys outside a row's key set, padding and pinned keys hold u = 0 and never bind.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from identifiable.errors import IdentifiableError

PROJECT_EVERY = 64  # steps between returns of every chain to its plane (round-off drift)
_NEWTON_STEPS = 80


@dataclass(frozen=True)
class Polytopes:
    """R rows' polytopes, each over its own keys, padded to s keys and k directions.

    Attributes:
        raw: `[R, s]` float64, the raw row a (0 on padding; pinned keys keep a_i).
        null: `[R, s, k]` float64, orthonormal columns spanning the left null space of
            [T, 1] over the row's live keys (zero rows off them, zero padding columns).
        live: `[R, s]` bool, the keys the walk moves.
        weights: `[R, s]` float64, the prior's exponents w_i (zero for the uniform prior).
    """

    raw: Tensor
    null: Tensor
    live: Tensor
    weights: Tensor

    def select(self, rows: Tensor) -> Polytopes:
        """The polytopes of some rows `[R']`."""
        return Polytopes(*(t.index_select(0, rows) for t in vars(self).values()))


def _barrier_step(null: Tensor, x: Tensor, live: Tensor) -> tuple[Tensor, Tensor]:
    """The Newton step dz `[R, k]` of −Σ log x_i in z, and its decrement squared `[R]`."""
    inv = torch.where(live, 1.0 / torch.where(live, x, 1.0), 0.0)
    grad = -(inv.unsqueeze(1) @ null).squeeze(1)  # [R, k]
    m = inv.unsqueeze(-1) * null
    hess = m.mT @ m
    pad = null.abs().sum(1) == 0  # [R, k] padding directions
    hess = hess + torch.diag_embed(pad.to(hess.dtype))
    dz = -torch.linalg.solve(hess, grad.unsqueeze(-1)).squeeze(-1)
    return dz, -(grad * dz).sum(-1)


def _interior(poly: Polytopes) -> Tensor:
    """`[R, s]` a point strictly inside each P: the mean of the 2k chord mid-points of
    ±axis directions from a (a may touch the boundary where a weight underflowed)."""
    x = torch.where(poly.live, poly.raw, 1.0)
    k = poly.null.shape[-1]
    pad = poly.null.abs().sum(1) == 0  # [R, k]: padding directions (a row of smaller dim)
    for _ in range(3):  # each pass moves further from the walls
        dirs = poly.null.mT  # [R, k, s]: every column of N
        lo, hi = chord(x.unsqueeze(1).expand(-1, k, -1), dirs)
        lo, hi = lo.masked_fill(pad, 0.0), hi.masked_fill(pad, 0.0)  # unbounded chords: stay
        mid = x.unsqueeze(1) + (0.5 * (lo + hi)).unsqueeze(-1) * dirs
        x = torch.where(poly.live, mid.mean(1), 1.0)
    return x


def centre(poly: Polytopes) -> Tensor:
    """`[R, s]` the analytic centre of each polytope (1.0 on keys the walk does not move).

    Raises IdentifiableError when a polytope has no interior over its live keys.
    """
    live, null = poly.live, poly.null
    x = _interior(poly)
    if not bool((torch.where(live, x, 1.0).amin(-1) > 0).all()):
        raise IdentifiableError(
            "a polytope of valid rows has no interior over its keys (a key fixed at zero "
            "was not pinned); report this with the trace"
        )
    for _ in range(_NEWTON_STEPS):
        dz, dec = _barrier_step(null, x, live)
        if bool((dec <= 1e-14).all()):
            break
        dx = (null @ dz.unsqueeze(-1)).squeeze(-1)
        shrink = live & (dx < 0)
        room = torch.where(shrink, x / torch.where(shrink, -dx, 1.0), math.inf).amin(-1)
        t = torch.clamp(0.95 * room, max=1.0 / (1.0 + dec.clamp_min(0).sqrt()))
        t = torch.where(dec <= 0.25, torch.clamp(0.95 * room, max=1.0), t)  # quadratic phase
        x = torch.where(live, x + t.unsqueeze(-1) * dx, 1.0)
    return x


def rounding(poly: Polytopes, x_c: Tensor) -> Tensor:
    """`[R, s, k]` S = N R⁻¹ from the thin QR of diag(1/x_c) N (module docstring, step 2)."""
    null = poly.null
    m = torch.where(poly.live, 1.0 / x_c, 0.0).unsqueeze(-1) * null
    r = torch.linalg.qr(m, mode="r")[1]
    pad = null.abs().sum(1) == 0
    r = torch.where(pad.unsqueeze(-1) | pad.unsqueeze(-2), 0.0, r) + torch.diag_embed(
        pad.to(r.dtype)
    )
    sign = torch.where(torch.diagonal(r, dim1=-2, dim2=-1) < 0, -1.0, 1.0)
    r = r * sign.unsqueeze(-1)  # a positive diagonal: the same factor on every platform
    inv = torch.linalg.solve_triangular(
        r, torch.eye(r.shape[-1], dtype=r.dtype, device=r.device).expand_as(r), upper=True
    )
    return null @ inv


def chord(x: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """The exact chord {x + t u ≥ 0} = [lo, hi] for points `x` and directions `u`
    `[..., s]` (keys with u = 0 never bind); x ≥ 0 gives lo ≤ 0 ≤ hi."""
    pos, neg = u > 0, u < 0
    room = x.clamp_min(0)
    hi = torch.where(neg, room / torch.where(neg, -u, 1.0), math.inf).amin(-1)
    lo = -torch.where(pos, room / torch.where(pos, u, 1.0), math.inf).amin(-1)
    return lo, hi


def log_prior(weights: Tensor, x: Tensor) -> Tensor:
    """`[R, C]` Σ w_i log x_i for states `x` `[R, C, s]` (weights `[R, s]`)."""
    return torch.xlogy(weights.unsqueeze(1), x).sum(-1)


def step(poly: Polytopes, spread: Tensor, x: Tensor, gen: torch.Generator) -> Tensor:
    """One hit-and-run step of every chain: `x` `[R, C, s]` → the next states."""
    r, c, _ = x.shape
    k = spread.shape[-1]
    g = torch.randn(r, c, k, generator=gen, dtype=x.dtype, device=x.device)
    pick = torch.rand(r, c, generator=gen, dtype=x.dtype, device=x.device)
    u = g @ spread.mT  # [R, C, s]
    lo, hi = chord(x, u)
    t = lo + pick * (hi - lo)
    new = torch.addcmul(x, t.unsqueeze(-1), u).clamp_min_(0.0)
    if not bool((poly.weights != 0).any()):
        return new
    mh = torch.rand(r, c, generator=gen, dtype=x.dtype, device=x.device)
    ok = torch.log(mh) < log_prior(poly.weights, new) - log_prior(poly.weights, x)
    return torch.where(ok.unsqueeze(-1), new, x)


def project(poly: Polytopes, x: Tensor) -> Tensor:
    """States `x` `[R, C, s]` put back on their planes a + col(N) (round-off drift) and
    floored at 0 (each entry moves by round-off only)."""
    off = torch.where(poly.live, poly.raw, 0.0).unsqueeze(1)
    d = x - off
    d = (d @ poly.null) @ poly.null.mT
    return torch.where(poly.live.unsqueeze(1), (off + d).clamp_min(0.0), x)


def starts(spread: Tensor, x_c: Tensor, chains: int, gen: torch.Generator) -> Tensor:
    """`[R, C, s]` dispersed starts: x_c + 0.9 S w/|w| lies in the Dikin ellipsoid ⊂ P."""
    r, _, k = spread.shape
    g = torch.randn(r, chains, k, generator=gen, dtype=x_c.dtype, device=x_c.device)
    g = g / torch.linalg.vector_norm(g, dim=-1, keepdim=True).clamp_min(1e-300)
    return (x_c.unsqueeze(1) + 0.9 * g @ spread.mT).clamp_min(0.0)


class Moments:
    """Running sums of the null-space coordinates z = Nᵀ(x − a) of every state seen, per
    row (pooled over chains): the covariance that `adapted` rounds with."""

    def __init__(self, poly: Polytopes) -> None:
        r, _, k = poly.null.shape
        self.total = poly.raw.new_zeros(r, k)
        self.outer = poly.raw.new_zeros(r, k, k)
        self.count = 0

    def add(self, poly: Polytopes, x: Tensor) -> None:
        z = (torch.where(poly.live.unsqueeze(1), x - poly.raw.unsqueeze(1), 0.0)) @ poly.null
        self.total += z.sum(1)
        self.outer += z.mT @ z
        self.count += z.shape[1]


def adapted(poly: Polytopes, spread: Tensor, moments: Moments) -> Tensor:
    """`[R, s, k]` directions from the covariance Σ of the warm-up's states (blended with
    1 % of the Dikin ellipsoid's, so that it is positive definite): S = N L, L Lᵀ = Σ.
    Hit-and-run with directions from any fixed N(0, Σ) keeps the uniform law (a linear
    change of coordinates); it is fixed before any draw is kept."""
    n = max(moments.count, 2)
    mean = moments.total / n
    emp = (moments.outer - n * mean.unsqueeze(-1) * mean.unsqueeze(-2)) / (n - 1)
    dikin_l = poly.null.mT @ spread  # [R, k, k]: L of the Dikin covariance in z
    dikin = dikin_l @ dikin_l.mT
    ratio = _trace(emp) / _trace(dikin).clamp_min(1e-300)
    cov = 0.99 * emp + 0.01 * ratio[:, None, None] * dikin
    pad = poly.null.abs().sum(1) == 0
    cov = torch.where(pad.unsqueeze(-1) | pad.unsqueeze(-2), 0.0, cov)
    cov = cov + torch.diag_embed(pad.to(cov.dtype))
    chol, info = torch.linalg.cholesky_ex(cov)
    new = poly.null @ chol
    return torch.where((info == 0)[:, None, None], new, spread)


def _trace(m: Tensor) -> Tensor:
    return torch.diagonal(m, dim1=-2, dim2=-1).sum(-1)


def rows_of(poly: Polytopes, x: Tensor) -> Tensor:
    """`[R, C, s]` the attention rows of states `x`: live keys from x, the others raw."""
    return torch.where(poly.live.unsqueeze(1), x, poly.raw.unsqueeze(1))
