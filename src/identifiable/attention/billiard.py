"""The billiard walk over the polytopes of valid attention rows (Gryazina & Polyak 2014,
as in volesti), batched over rows and chains, in torch on the device of its input
(docs/posterior.md#the-sampler).

In the coordinates w of a fixed rounding x = x_0 + S w (S `[s, k]`, `hitrun.rounding` or
`hitrun.adapted`), one step from x: draw a direction v uniformly on the unit sphere and a
length τ ~ U[0, 2L] independent of x; move along u = S v for a total length τ, and at each
facet x_j = 0 met on the way reflect v specularly in w-space (v ← v − 2 (v·g)/|g|² g with
g = S_j, the facet's normal; in x: u ← u − 2 u_j / G_jj · G_j with G = S Sᵀ). A step that
would need more than `cap(k)` reflections stays at x.

Why the uniform law is stationary: the billiard flow Φ_τ preserves Lebesgue measure on
P × S^{k-1} (straight motion and specular reflection are volume-preserving), and the map
F(x, v) = (Φ_τ(x, v) with its velocity reversed) is an involution, since the flow runs
backwards along the same path with the same number of reflections. So F preserves the
set of (x, v) whose path has at most `cap(k)` reflections, and the kernel "move by F
there, stay elsewhere" is reversible with respect to the uniform law on P, for every τ;
τ drawn independently of x keeps it so (any law of τ does: U[0, 2L] rather than the
paper's L · Exp(1) because the chains of a batch move in lockstep and wait for the
longest path). A fixed linear change of coordinates maps uniform to uniform. For a
Dirichlet prior the end point is a proposal from this Lebesgue-symmetric kernel,
accepted with probability min(1, π(x')/π(x)) (Metropolis-Hastings).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from identifiable.attention import billiard_cpu
from identifiable.attention.hitrun import Polytopes, log_prior

LENGTH = 6.0  # L = LENGTH · √k in rounded coordinates (benchmarks/records/posterior.md)


def cap(k: int) -> int:
    """Reflections allowed per step in dimension k: a path of length L meets about
    0.3 · L √k facets here (about 2k at `LENGTH`), so 24 k + 64 is seldom reached."""
    return 24 * k + 64


def gram(spread: Tensor) -> Tensor:
    """`[R, s, s]` G = S Sᵀ: column j is the move of x per unit reflection off facet j."""
    return spread @ spread.mT


def scale(poly: Polytopes) -> Tensor:
    """`[R]` the mean path length L = `LENGTH` · √(dim P) of each row."""
    dims = (poly.null.abs().sum(1) > 0).sum(-1).clamp_min(1)
    return LENGTH * dims.to(poly.raw.dtype).sqrt()


def step(
    poly: Polytopes,
    spread: Tensor,
    metric: Tensor,
    length: Tensor,
    x: Tensor,
    gen: torch.Generator,
    most: int,
    threads: int = 0,
) -> Tensor:
    """One billiard step of every chain: `x` `[R, C, s]` → the next states; `metric` is
    `gram(spread)`, `length` `[R]` the mean path length L, `most` the reflection cap. On the
    CPU with `threads` ≥ 1 the paths run compiled (`billiard_cpu`) on that many threads;
    otherwise in torch (`paths`). Both draw the same numbers and follow the same paths."""
    r, c = x.shape[:2]
    g = torch.randn(r, c, spread.shape[-1], generator=gen, dtype=x.dtype, device=x.device)
    pick = torch.rand(r, c, generator=gen, dtype=x.dtype, device=x.device)
    if threads and x.device.type == "cpu":
        new = billiard_cpu.step(spread, metric, length, x, g, pick, most, threads)
    else:
        new = paths(spread, metric, length, x, g, pick, most)
    if not bool((poly.weights != 0).any()):
        return new
    mh = torch.rand(r, c, generator=gen, dtype=x.dtype, device=x.device)
    ok = torch.log(mh) < log_prior(poly.weights, new) - log_prior(poly.weights, x)
    return torch.where(ok.unsqueeze(-1), new, x)


def paths(
    spread: Tensor, metric: Tensor, length: Tensor, x: Tensor, g: Tensor, pick: Tensor, most: int
) -> Tensor:
    """The end points of every chain's path in torch, all chains in lock step (on any
    device): `g` `[R, C, k]` Gaussian directions, `pick` `[R, C]` uniforms for the lengths."""
    r, c, s = x.shape
    g = g / torch.linalg.vector_norm(g, dim=-1, keepdim=True).clamp_min(1e-300)
    u = g @ spread.mT
    left = 2.0 * length[:, None] * pick  # τ ~ U[0, 2L]
    y = x
    for _ in range(most + 1):
        neg = u < 0
        room = torch.where(neg, y / torch.where(neg, -u, 1.0), math.inf)
        h, j = room.min(-1)  # [R, C]: the first facet met and the length to it
        hit = h < left
        move = torch.minimum(h, left)
        y = torch.addcmul(y, move.unsqueeze(-1), u).clamp_min_(0.0)
        left = left - move
        if not bool(hit.any()):
            break
        col = torch.gather(metric, 1, j.unsqueeze(-1).expand(r, c, s))  # G_j `[R, C, s]`
        diag = col.gather(-1, j.unsqueeze(-1)).squeeze(-1)
        coef = torch.where(hit, 2.0 * u.gather(-1, j.unsqueeze(-1)).squeeze(-1) / diag, 0.0)
        u = torch.addcmul(u, coef.unsqueeze(-1), col, value=-1.0)
    return torch.where((left > 0).unsqueeze(-1), x, y)  # over the cap: stay
