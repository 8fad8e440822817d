"""Convergence diagnostics and summaries of Markov chains, batched, in torch.

Definitions (Gelman et al., Bayesian Data Analysis, 3rd ed., §11.4-11.5, as Stan computes
them; docs/posterior.md#diagnostics):

- split-R̂: each of the C chains of D draws is cut in halves (M = 2C chains of N = ⌊D/2⌋
  draws); with W the mean within-chain variance and B/N the variance of the chain means,
  var⁺ = (N − 1)/N · W + B/N and R̂ = √(var⁺ / W). R̂ > 1.01 flags a row.
- effective sample size: ρ_t = 1 − (W − mean_m γ_m(t)) / var⁺ from the chains'
  autocovariances γ_m (FFT), summed in pairs P_k = ρ_2k + ρ_2k+1 up to the first negative
  pair and made non-increasing (Geyer's initial monotone sequence): τ = −1 + 2 Σ P_k,
  ESS = M N / τ, at most M N log10(M N).

A quantity with no spread (a weight every valid row gives the same value) has no ESS or R̂:
both are NaN there, and a row's summary (`row_ess`, `row_rhat`) ignores it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _split(draws: Tensor) -> Tensor:
    """`[..., C, D]` → `[..., 2C, ⌊D/2⌋]`: each chain's first and second half."""
    half = draws.shape[-1] // 2
    first, second = draws[..., :half], draws[..., draws.shape[-1] - half :]
    return torch.cat([first, second], dim=-2)


def _moments(chains: Tensor) -> tuple[Tensor, Tensor]:
    """W (mean within-chain variance) and var⁺ of `[..., M, N]` chains."""
    n = chains.shape[-1]
    within = chains.var(-1, correction=1).mean(-1)
    between = chains.mean(-1).var(-1, correction=1) if chains.shape[-2] > 1 else 0.0 * within
    return within, (n - 1) / n * within + between


def split_rhat(draws: Tensor) -> Tensor:
    """`[...]` split-R̂ of `[..., C, D]` draws (C chains, D ≥ 4 draws each); NaN where
    the draws do not vary."""
    within, var_plus = _moments(_split(draws))
    return torch.where(within > 0, (var_plus / within.clamp_min(1e-300)).sqrt(), math.nan)


def ess(draws: Tensor) -> Tensor:
    """`[...]` effective sample size of `[..., C, D]` draws; NaN where they do not vary."""
    chains = _split(draws)
    m, n = chains.shape[-2:]
    within, var_plus = _moments(chains)
    centred = chains - chains.mean(-1, keepdim=True)
    size = _fft_length(n)
    spec = torch.fft.rfft(centred, n=size)
    acov = torch.fft.irfft(spec * spec.conj(), n=size)[..., :n] / n  # biased γ_m(t)
    rho = 1.0 - (within[..., None] - acov.mean(-2)) / var_plus.clamp_min(1e-300)[..., None]
    rho[..., 0] = 1.0
    if n % 2:
        rho = rho[..., :-1]
    pairs = rho.unflatten(-1, (-1, 2)).sum(-1)  # P_k = ρ_2k + ρ_2k+1
    positive = torch.cumprod((pairs > 0).to(pairs.dtype), dim=-1)  # up to the first negative
    monotone = torch.cummin(pairs, dim=-1).values  # made non-increasing
    tau = (-1.0 + 2.0 * (monotone * positive).sum(-1)).clamp_min(1.0 / math.log10(m * n))
    out = m * n / tau
    return torch.where(within > 0, out, math.nan)


def _fft_length(n: int) -> int:
    """A fast FFT length ≥ 2n − 1 (any such length makes the circular correlation of n
    draws linear): scipy's next 5-smooth length."""
    from scipy.fft import next_fast_len

    return int(next_fast_len(2 * n - 1, real=True))


def row_ess(per_key: Tensor) -> Tensor:
    """`[...]` the smallest ESS over the last axis (keys), NaN-free where any key varies."""
    return torch.where(per_key.isnan(), math.inf, per_key).amin(-1)


def row_rhat(per_key: Tensor) -> Tensor:
    """`[...]` the largest split-R̂ over the last axis (keys)."""
    return torch.where(per_key.isnan(), -math.inf, per_key).amax(-1)


def central_interval(pooled: Tensor, level: float) -> tuple[Tensor, Tensor]:
    """The (1 − level)/2 and (1 + level)/2 quantiles of `[..., S]` draws (linear
    interpolation between order statistics, as `torch.quantile`), from one sort."""
    ordered = pooled.sort(-1).values
    size = ordered.shape[-1]

    def at(q: float) -> Tensor:
        pos = q * (size - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, size - 1)
        frac = pos - lo
        return ordered[..., lo] * (1 - frac) + ordered[..., hi] * frac

    return at((1 - level) / 2), at((1 + level) / 2)
