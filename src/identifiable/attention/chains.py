"""Running Markov chains (the billiard walk, `billiard`, or hit-and-run, `hitrun`) until
every row has its effective samples, and the summaries of their draws (what
`attention_posterior` reports).

Per batch of polytopes: centre and rounding (`hitrun.centre`, `hitrun.rounding`), `chains`
chains per row from dispersed starts in the Dikin ellipsoid; `warmup(k, walk)` sweeps (a
sweep is `sweep(k, walk)` steps) whose states give the rounding the walk uses from then on
(`hitrun.adapted`), as many more discarded, then one draw kept per sweep in rounds: the chains
run until they hold the round's draws; each row whose smallest per-weight ESS reaches
`samples` with split-R̂ ≤ `RHAT_MAX` is summarised and leaves the batch; the others get
more draws, scaled by the ESS still missing, up to `max_draws` per chain or the deadline.
A row that stops short is flagged, never dropped.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from identifiable.attention import billiard, billiard_cpu, hitrun, mcmc
from identifiable.store import jitcache
from identifiable.utils.threads import one_thread

WALKS: tuple[str, ...] = ("auto", "billiard", "hitrun")
AUTO_HITRUN = 16  # "auto" runs hit-and-run on batches up to this dim P_i (cheaper there)
RHAT_MAX = 1.01
WARMUP = 20  # sweeps per chain in each half of the warm-up (rounding, then burn-in)
TAU_GUESS = 3.0  # kept draws per effective sample of the worst weight (first round's plan)
TAU_BILLIARD = 2.0  # the same for the billiard walk (about 2 at dim 74: one round for most rows)
FLAG_RHAT, FLAG_ESS, FLAG_POINT, FLAG_BUDGET = 1, 2, 4, 8
FLAG_TEXT = {
    FLAG_RHAT: f"R̂ > {RHAT_MAX}",
    FLAG_ESS: "ESS below target",
    FLAG_POINT: "point (dim P = 0)",
    FLAG_BUDGET: "stopped by the time budget",
}


def flag_text(flags: int) -> str:
    """The flags of a row in words ("" for none)."""
    return "; ".join(text for bit, text in FLAG_TEXT.items() if flags & bit)


@dataclass(frozen=True)
class Settings:
    """What the chains aim for: `samples` effective samples per row from `chains` chains,
    central credible intervals at `level`, at most `max_draws` kept draws per chain,
    stopping at `deadline` (a `time.perf_counter()` value, or None); `keep` draws per row
    are returned (thinned, pooled over chains); `walk` is one of `WALKS` ("auto": `resolve`);
    `threads` ≥ 1 runs the billiard walk compiled on that many CPU threads (`billiard_cpu`),
    0 in torch."""

    samples: int
    chains: int
    level: float
    max_draws: int
    deadline: float | None = None
    keep: int = 0
    walk: str = "auto"
    threads: int = 0


@dataclass(frozen=True)
class Summary:
    """Per polytope (R of them, s keys), `[R, s]` unless said: mean; lower, upper: the
    central credible interval; p_top: P(the key holds the row's largest weight); p_half:
    P(x_j ≥ half_max_j); mcse: Monte Carlo standard error of the mean; ess, rhat, draws
    (pooled), flags: `[R]`; kept: `[R, keep, s]`."""

    mean: Tensor
    lower: Tensor
    upper: Tensor
    p_top: Tensor
    p_half: Tensor
    mcse: Tensor
    ess: Tensor
    rhat: Tensor
    draws: Tensor
    flags: Tensor
    kept: Tensor


@dataclass(frozen=True)
class Diagnosis:
    """Per key (`[R, s]`) and per row (`[R]`): ESS and split-R̂ of the draws, the row's
    smallest ESS and largest R̂, and its flags (`FLAG_RHAT`, `FLAG_ESS`)."""

    ess_key: Tensor
    rhat_key: Tensor
    ess: Tensor
    rhat: Tensor
    flags: Tensor

    def select(self, rows: Tensor) -> Diagnosis:
        """The diagnosis of some rows `[R']`."""
        return Diagnosis(*(t.index_select(0, rows) for t in vars(self).values()))


def diagnose(draws: Tensor, samples: int) -> Diagnosis:
    """Convergence of `[R, s, C, D]` draws against `samples` effective samples a row."""
    ess_key, rhat_key = mcmc.ess(draws), mcmc.split_rhat(draws)
    ess, rhat = mcmc.row_ess(ess_key), mcmc.row_rhat(rhat_key)
    return Diagnosis(ess_key, rhat_key, ess, rhat, _flags(ess, rhat, samples))


def summarise(
    draws: Tensor, half_max: Tensor, cfg: Settings, budget_hit: bool, diag: Diagnosis
) -> Summary:
    """Summaries of `[R, s, C, D]` draws (`half_max` `[R, s]`, `diag` their `diagnose`)."""
    r, s, c, d = draws.shape
    pooled = draws.reshape(r, s, c * d)
    lower, upper = mcmc.central_interval(pooled, cfg.level)
    top = pooled.argmax(1)  # [R, C·D]
    hits = torch.zeros(r, s, dtype=torch.long, device=draws.device)
    hits.scatter_add_(1, top, torch.ones_like(top))
    p_half = (pooled >= half_max[..., None]).to(draws.dtype).mean(-1)
    spread = pooled.var(-1, correction=1)
    mcse = torch.where(diag.ess_key.isnan(), 0.0, (spread / diag.ess_key).sqrt())
    flags = diag.flags | (FLAG_BUDGET if budget_hit else 0)
    pick = torch.linspace(0, c * d - 1, cfg.keep, device=draws.device).round().long()
    return Summary(
        pooled.mean(-1),
        lower,
        upper,
        hits.to(draws.dtype) / (c * d),
        p_half,
        mcse,
        diag.ess,
        diag.rhat,
        torch.full((r,), c * d, device=draws.device),
        flags,
        pooled[..., pick].transpose(1, 2),
    )


def sweep(k: int, walk: str = "hitrun") -> int:
    """Steps between kept draws in dimension k: hit-and-run needs about k^2.2-2.4 steps
    per effective sample of its worst weight here (benchmarks/records/posterior.md), so
    it keeps a draw every k^2.4 / 4 steps (`TAU_GUESS` ≈ 3 draws per effective sample);
    the billiard walk needs about one step per effective sample and keeps every step."""
    return 1 if walk == "billiard" else max(1, math.ceil(k**2.4 / 4))


def warmup(k: int, walk: str = "hitrun") -> int:
    """Sweeps in each half of the warm-up: `WARMUP`, and for the billiard walk (one step a
    sweep, each close to an independent draw) k / 2 more, so that the covariance it
    rounds with sees more than 2k states of its 4 chains."""
    return WARMUP + (k // 2 if walk == "billiard" else 0)


def resolve(walk: str, k: int, compiled: bool = False) -> str:
    """The walk that runs a batch of largest dim k: "auto" is the billiard walk where it
    runs `compiled` (fewer steps per effective sample at every k, and each step a few
    microseconds); in torch, hit-and-run up to `AUTO_HITRUN` (its steps are cheap there)
    and the billiard walk above, where it wins on seconds per effective sample
    (benchmarks/records/posterior.md)."""
    if walk != "auto":
        return walk
    return "hitrun" if k <= AUTO_HITRUN and not compiled else "billiard"


def compiled(device: torch.device, threads: int) -> bool:
    """Whether the billiard walk runs compiled on `device`: the CPU, with threads."""
    return threads > 0 and device.type == "cpu" and jitcache.available()


Move = Callable[[Tensor, torch.Generator], Tensor]


def mover(walk: str, poly: hitrun.Polytopes, spread: Tensor, threads: int = 0) -> Move:
    """One step of `walk` for every chain, `x` `[R, C, s]` → next states, with directions
    from the rounding `spread` (the billiard walk compiled on `threads` CPU threads, or in
    torch with 0)."""
    if walk == "hitrun":
        return lambda x, gen: hitrun.step(poly, spread, x, gen)
    metric, length = billiard.gram(spread), billiard.scale(poly)
    most = billiard.cap(poly.null.shape[-1])
    return lambda x, gen: billiard.step(poly, spread, metric, length, x, gen, most, threads)


def _flags(ess: Tensor, rhat: Tensor, samples: int) -> Tensor:
    return torch.where(rhat > RHAT_MAX, FLAG_RHAT, 0) | torch.where(ess < samples, FLAG_ESS, 0)


def _sweeps(
    poly: hitrun.Polytopes,
    move: Move,
    x: Tensor,
    n: int,
    thin: int,
    gen: torch.Generator,
    deadline: float | None,
    moments: hitrun.Moments | None = None,
) -> tuple[Tensor, list[Tensor], bool]:
    """`n` sweeps of `thin` steps from `x`; returns the last states, one draw per sweep
    (`[R, C, s]` each) and False when the deadline cut it short. `moments` sees every
    state. On the CPU torch's part of a step is small kernels, which a second OpenMP
    thread slows (benchmarks/records/posterior.md): they run on one."""
    with one_thread() if x.device.type == "cpu" else nullcontext():
        out: list[Tensor] = []
        steps = 0
        for _ in range(n):
            for _ in range(thin):
                x = move(x, gen)
                if moments is not None:
                    moments.add(poly, x)
                steps += 1
                if steps % hitrun.PROJECT_EVERY == 0:
                    x = hitrun.project(poly, x)
                    if deadline is not None and time.perf_counter() > deadline:
                        return x, [*out, hitrun.rows_of(poly, x)], False
            out.append(hitrun.rows_of(poly, x))
            if deadline is not None and time.perf_counter() > deadline:
                return x, out, False
        return x, out, True


def sample(
    poly: hitrun.Polytopes,
    half_max: Tensor,
    cfg: Settings,
    gen: torch.Generator,
    done: Callable[[int], None] | None = None,
    probe: Callable[[float, float], None] | None = None,
) -> Summary:
    """Run `cfg.chains` chains on each polytope until each has `cfg.samples` effective
    samples (module docstring); `done(k)` is told as rows finish, and `probe(seconds per
    step, planned steps)` is called after a few timed steps, before the warm-up (it may
    raise to refuse the request)."""
    rows = poly.raw.shape[0]
    x_c = hitrun.centre(poly)
    spread = hitrun.rounding(poly, x_c)
    threads = cfg.threads if compiled(x_c.device, cfg.threads) else 0
    walk = resolve(cfg.walk, poly.null.shape[-1], threads > 0)
    thin, warm = sweep(poly.null.shape[-1], walk), warmup(poly.null.shape[-1], walk)
    tau = TAU_BILLIARD if walk == "billiard" else TAU_GUESS
    x = hitrun.starts(spread, x_c, cfg.chains, gen)
    if walk == "billiard" and threads:
        billiard_cpu.ready()  # a compile is not a step: the probe below times steps
    move = mover(walk, poly, spread, threads)
    if probe is not None:  # time a few steps, then rewind: a budget leaves the draws as they are
        state, y = gen.get_state(), x.clone()
        t0, tries = time.perf_counter(), min(thin, 8 if walk == "billiard" else 64)
        y, _, _ = _sweeps(poly, move, y, 1, tries, gen, None)
        planned = thin * (2 * warm + tau * cfg.samples / cfg.chains)
        probe((time.perf_counter() - t0) / tries, planned)
        gen.set_state(state)
    moments = hitrun.Moments(poly)
    x, _, on_time = _sweeps(poly, move, x, warm, thin, gen, cfg.deadline, moments)
    spread = hitrun.adapted(poly, spread, moments)
    move = mover(walk, poly, spread, threads)
    x, _, on_time = _sweeps(poly, move, x, warm, thin, gen, cfg.deadline)
    target = min(cfg.max_draws, max(4, math.ceil(tau * cfg.samples / cfg.chains)))
    kept: list[Tensor] = []
    ids = torch.arange(rows, device=x.device)
    results: dict[int, Summary] = {}
    while len(ids):
        x, more, on_time = _sweeps(poly, move, x, target - len(kept), thin, gen, cfg.deadline)
        kept += more
        draws = torch.stack(kept, -1).permute(0, 2, 1, 3)  # [R', s, C, D]
        if draws.shape[-1] < 4:  # the deadline came before four draws: repeat what there is
            draws = draws.repeat_interleave(4, -1)
        diag = diagnose(draws, cfg.samples)
        finished = (diag.flags == 0) | (not on_time) | (len(kept) >= cfg.max_draws)
        ended = finished.nonzero().flatten()
        if len(ended):  # summarised once, when they leave (sorting the draws is the cost)
            summary = summarise(
                draws.index_select(0, ended),
                half_max.index_select(0, ids.index_select(0, ended)),
                cfg,
                not on_time,
                diag.select(ended),
            )
            for j, k in enumerate(ended.tolist()):
                results[int(ids[k])] = Summary(*(getattr(summary, f)[j : j + 1] for f in _FIELDS))
        if done is not None and len(ended):
            done(len(ended))
        worst = float(diag.ess[~finished].clamp_min(1).amin()) if (~finished).any() else 1.0
        left = (~finished).nonzero().flatten()
        ids, poly, x = ids[left], poly.select(left), x.index_select(0, left)
        spread, half_max = spread.index_select(0, left), half_max
        move = mover(walk, poly, spread, threads)
        kept = [k.index_select(0, left) for k in kept]
        grow = max(1.25, 1.1 * cfg.samples / worst)
        target = min(cfg.max_draws, math.ceil(len(kept) * grow))
    return Summary(*(torch.cat([getattr(results[r], f) for r in range(rows)]) for f in _FIELDS))


_FIELDS = tuple(Summary.__dataclass_fields__)
