"""The samplers (billiard walk, hit-and-run) against the exact uniform distribution on
small polytopes.

Polytopes of dimension 1-3 come from hand-built T (s keys, d value columns: dim P =
s − d − 1); the exact CDF of each weight is a volume ratio (tests/helpers/polytopes.py,
scipy's ConvexHull). Draws are the end states of many independent chains after a long
walk, so a Kolmogorov-Smirnov test applies; each is run at the level 0.001 (Bonferroni
over the weights tested), and a deliberately biased variant of each walk must fail it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import kstest

from helpers.polytopes import ExactMarginal, null_basis
from identifiable.attention import billiard, hitrun, mcmc

LEVEL = 1e-3
CHAINS = 600


def _polytope(s: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A raw row a (softmax of random scores) and an orthonormal N of null([T, 1]ᵀ)."""
    rng = np.random.default_rng(seed)
    t = rng.standard_normal((s, d))
    a = np.exp(rng.standard_normal(s))
    a /= a.sum()
    basis, _ = np.linalg.qr(np.hstack([t, np.ones((s, 1))]))
    return a, null_basis(basis)


def _poly(a: np.ndarray, null: np.ndarray, weights: np.ndarray | None = None) -> hitrun.Polytopes:
    raw = torch.tensor(a)[None]
    w = torch.zeros_like(raw) if weights is None else torch.tensor(weights)[None]
    return hitrun.Polytopes(
        raw, torch.tensor(null)[None], torch.ones_like(raw, dtype=torch.bool), w
    )


def _billiard(poly, spread, x, gen, threads=0):
    k = spread.shape[-1]
    metric, length = billiard.gram(spread), billiard.scale(poly)
    return billiard.step(poly, spread, metric, length, x, gen, billiard.cap(k), threads)


def _compiled(poly, spread, x, gen):
    return _billiard(poly, spread, x, gen, threads=2)


WALKS = {
    "hitrun": (hitrun.step, lambda k: 30 * k * k + 60),
    "billiard": (_billiard, lambda k: 10 * k + 30),
    "compiled": (_compiled, lambda k: 10 * k + 30),
}


def _walk(poly: hitrun.Polytopes, steps: int, step=hitrun.step, seed: int = 0) -> np.ndarray:
    """`[CHAINS, s]` end states of independent chains started in the Dikin ellipsoid
    (directions from its rounding)."""
    gen = torch.Generator().manual_seed(seed)
    x_c = hitrun.centre(poly)
    spread = hitrun.rounding(poly, x_c)
    x = hitrun.starts(spread, x_c, CHAINS, gen)
    for i in range(steps):
        x = step(poly, spread, x, gen)
        if i % hitrun.PROJECT_EVERY == 0:
            x = hitrun.project(poly, x)
    return x[0].numpy()


def _biased_step(poly, spread, x, gen):
    """Hit-and-run that lands in the outer fifth of each chord: mass piles up at walls."""
    u = torch.randn(*x.shape[:2], spread.shape[-1], generator=gen, dtype=x.dtype) @ spread.mT
    lo, hi = hitrun.chord(x, u)
    pick = torch.rand(x.shape[:2], generator=gen, dtype=x.dtype)
    t = torch.where(pick < 0.5, lo * (0.8 + 0.4 * pick), hi * (0.8 + 0.4 * (pick - 0.5)))
    return torch.addcmul(x, t.unsqueeze(-1), u).clamp_min(0.0)


def _biased_billiard(poly, spread, x, gen):
    """A billiard step whose path ends at the first wall it meets (no reflection): mass
    piles up on the facets."""
    g = torch.randn(*x.shape[:2], spread.shape[-1], generator=gen, dtype=x.dtype)
    u = (g / g.norm(dim=-1, keepdim=True)) @ spread.mT
    tau = 2 * billiard.scale(poly)[:, None] * torch.rand(x.shape[:2], generator=gen, dtype=x.dtype)
    _, hi = hitrun.chord(x, u)
    return torch.addcmul(x, torch.minimum(hi, tau).unsqueeze(-1), u).clamp_min(0.0)


BIASED = {"hitrun": _biased_step, "billiard": _biased_billiard, "compiled": _biased_billiard}


@pytest.mark.parametrize("walk", list(WALKS))
@pytest.mark.parametrize(("s", "d", "seed"), [(4, 2, 0), (5, 2, 1), (6, 2, 2)])
def test_marginals_match_the_exact_uniform_distribution(
    s: int, d: int, seed: int, walk: str
) -> None:
    a, null = _polytope(s, d, seed)
    k = null.shape[1]
    assert k == s - d - 1
    step, steps = WALKS[walk]
    x = _walk(_poly(a, null), steps(k), step=step)
    for j in range(s):
        cdf = ExactMarginal(a, null, j)
        result = kstest(x[:, j], cdf)
        assert result.pvalue > LEVEL / s, (k, j, result)


@pytest.mark.parametrize("walk", list(WALKS))
@pytest.mark.parametrize(("s", "d", "seed"), [(5, 2, 1), (6, 2, 2)])
def test_a_biased_walk_fails_the_test(s: int, d: int, seed: int, walk: str) -> None:
    a, null = _polytope(s, d, seed)
    k = null.shape[1]
    x = _walk(_poly(a, null), WALKS[walk][1](k), step=BIASED[walk])
    worst = min(kstest(x[:, j], ExactMarginal(a, null, j)).pvalue for j in range(s))
    assert worst < LEVEL / s / 100


@pytest.mark.parametrize("walk", list(WALKS))
def test_every_state_stays_in_the_polytope(walk: str) -> None:
    a, null = _polytope(8, 3, 3)
    poly = _poly(a, null)
    x = _walk(poly, 500 if walk == "hitrun" else 100, step=WALKS[walk][0])
    assert x.min() >= 0
    np.testing.assert_allclose(x.sum(-1), 1.0, atol=1e-12)
    assert np.abs((x - a) @ (np.eye(8) - null @ null.T)).max() < 1e-12


@pytest.mark.parametrize("walk", list(WALKS))
def test_the_dirichlet_prior_pulls_towards_the_raw_row(walk: str) -> None:
    """On a segment (dim 1) the exact Dirichlet marginal is a 1-D density ∝ Π x_i^{w_i}:
    the walk's mean matches its numerical integral."""
    a, null = _polytope(4, 2, 0)
    weights = 20.0 * a
    x = _walk(_poly(a, null, weights), 150, step=WALKS[walk][0])
    cdf = ExactMarginal(a, null, 0)
    lo, hi = cdf.ends
    grid = np.linspace(lo, hi, 20001)[1:-1]
    t = (grid - a[0]) / null[0, 0]
    pts = a[None] + t[:, None] * null[:, 0][None]
    logp = (weights * np.log(np.clip(pts, 1e-300, None))).sum(-1)
    dens = np.exp(logp - logp.max())
    exact_mean = float((grid * dens).sum() / dens.sum())
    se = x[:, 0].std() / np.sqrt(CHAINS)
    assert abs(x[:, 0].mean() - exact_mean) < 4 * se
    uniform_mean = (lo + hi) / 2
    assert abs(exact_mean - uniform_mean) > 8 * se  # the prior moved it


def test_fft_lengths_are_scipy_fast_lengths() -> None:
    """The autocorrelations' FFT length is the smallest 5-smooth length ≥ 2n − 1, as
    scipy.fft.next_fast_len computes it for real input."""
    from scipy.fft import next_fast_len

    from identifiable.attention.mcmc import _fft_length

    assert all(_fft_length(n) == next_fast_len(2 * n - 1, real=True) for n in range(1, 1500))
    assert all(_fft_length(n) >= 2 * n - 1 for n in range(1, 1500))


def test_ess_and_rhat_against_known_chains() -> None:
    """ESS of independent draws ≈ their number; of an AR(1) chain with ρ = 0.5 it is
    N (1 − ρ)/(1 + ρ); split-R̂ flags chains that sit at different levels."""
    g = torch.Generator().manual_seed(0)
    iid = torch.randn(4, 2000, generator=g, dtype=torch.float64)
    assert 0.85 * 8000 < float(mcmc.ess(iid)) < 1.15 * 8000
    e = torch.randn(4, 20000, generator=g, dtype=torch.float64)
    y = torch.zeros_like(e)
    for t in range(1, e.shape[1]):
        y[:, t] = 0.5 * y[:, t - 1] + e[:, t]
    assert abs(float(mcmc.ess(y)) / (80000 / 3) - 1) < 0.1
    assert float(mcmc.split_rhat(iid)) < 1.01
    shifted = iid + torch.tensor([0.0, 0.0, 0.0, 0.5], dtype=torch.float64)[:, None]
    assert float(mcmc.split_rhat(shifted)) > 1.01


def test_auto_takes_hit_and_run_up_to_dim_16_and_the_billiard_walk_above() -> None:
    """In torch; compiled, "auto" is the billiard walk at every dimension."""
    from identifiable.attention.chains import AUTO_HITRUN, resolve

    dims = (1, AUTO_HITRUN, AUTO_HITRUN + 1, 383)
    assert [resolve("auto", k) for k in dims] == ["hitrun", "hitrun", "billiard", "billiard"]
    assert [resolve("auto", k, compiled=True) for k in dims] == ["billiard"] * 4
    assert resolve("hitrun", 383) == "hitrun" and resolve("billiard", 2) == "billiard"
    assert resolve("hitrun", 383, compiled=True) == "hitrun"


def _batch(seed: int) -> tuple[hitrun.Polytopes, torch.Tensor]:
    """Three rows of different sizes padded together (the middle one with a pinned key,
    held at its raw weight 0.05), and the Dikin rounding: what `attention_posterior` hands
    the walk."""
    s, k = 12, 7
    raw = torch.zeros(3, s, dtype=torch.float64)
    null = torch.zeros(3, s, k, dtype=torch.float64)
    live = torch.zeros(3, s, dtype=torch.bool)
    for r, (first, size, d) in enumerate([(0, 6, 2), (1, 9, 3), (0, 12, 4)]):
        a, n = _polytope(size - first, d, seed + r)
        share = 1.0 - 0.05 * first
        raw[r, first:size] = share * torch.tensor(a)
        null[r, first:size, : n.shape[1]] = torch.tensor(n)
        live[r, first:size] = True
    raw[1, 0] = 0.05
    poly = hitrun.Polytopes(raw, null, live, torch.zeros_like(raw))
    return poly, hitrun.rounding(poly, hitrun.centre(poly))


@pytest.mark.parametrize("seed", [0, 1])
def test_the_compiled_walk_follows_the_torch_walk(seed: int) -> None:
    """From the same states with the same draws, the compiled paths end where torch's do
    (to round-off), on padded rows of different dimensions, and the draws do not depend
    on the thread count (bit for bit)."""
    poly, spread = _batch(seed)
    gen = torch.Generator().manual_seed(seed)
    x = start = hitrun.starts(spread, hitrun.centre(poly), 4, gen)
    moved = 0.0
    for _ in range(20):
        state = gen.get_state()
        ends = {}
        for threads in (0, 1, 2, 3):
            gen.set_state(state)
            ends[threads] = _billiard(poly, spread, x, gen, threads)
        assert (ends[0] - ends[1]).abs().max() < 1e-12
        assert torch.equal(ends[1], ends[2]) and torch.equal(ends[1], ends[3])
        moved = max(moved, float((ends[1] - x).abs().max()))
        x = ends[1]
    assert moved > 1e-3  # the chains moved: the comparison is not of still states
    still = ~poly.live.unsqueeze(1).expand_as(x)  # the pinned key and the padding
    assert torch.equal(x[still], start[still]), "keys the walk does not move stay put"


def test_a_compiled_step_over_the_cap_stays_where_torch_stays() -> None:
    """With a reflection cap of 0, every path that meets a facet stays put, in both."""
    poly, spread = _batch(2)
    gen = torch.Generator().manual_seed(0)
    x = hitrun.starts(spread, hitrun.centre(poly), 64, gen)
    metric, length = billiard.gram(spread), billiard.scale(poly)
    state = gen.get_state()
    torch_end = billiard.step(poly, spread, metric, length, x, gen, 0)
    gen.set_state(state)
    compiled_end = billiard.step(poly, spread, metric, length, x, gen, 0, threads=2)
    stayed = (compiled_end == x).all(-1)
    assert stayed.any() and (~stayed).any()  # some paths met a facet, some did not
    assert torch.equal(stayed, (torch_end == x).all(-1))
    assert (compiled_end - torch_end).abs().max() < 1e-12
