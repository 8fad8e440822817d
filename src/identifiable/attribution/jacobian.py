"""Squared Frobenius norms of every Jacobian block ∂e^l_i/∂x_j, by forward mode.

One JVP with a tangent that is zero except for token j's row (a direction u in R^d)
returns J^l_{ij} u for every layer l and output token i at once. Summing ‖J^l_{ij} u‖²
over an orthonormal basis of R^d gives ‖J^l_{ij}‖_F² exactly (n·d JVPs for the whole
sequence, all layers included); summing over k random orthonormal probes and scaling
by d/k gives an unbiased estimate (n·k JVPs).

Standard error of the estimator. Per probe, y_a = d·‖J p_a‖² has mean ‖J‖_F² and some
variance σ². Probes of one token are orthonormal, hence exchangeable and negatively
correlated: the d columns of a full frame sum to the constant d·‖J‖_F², which forces
Cov(y_a, y_b) = −σ²/(d−1). Therefore
    Var(ȳ) = σ²/k · (d−k)/(d−1),       E[s²] = σ²·d/(d−1)
for the sample variance s² of y_1..y_k, and the unbiased variance estimate is
    Var̂(ȳ) = s² · (d−k) / (d·k),
which is 0 at k = d (exact) and undefined (NaN) at k = 1.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from identifiable.attribution.memory import DEFAULT_MEMORY_BUDGET, ModelDims, plan_chunk_size
from identifiable.attribution.random_probes import ProbeBank
from identifiable.errors import IdentifiableError

LayerFn = Callable[[torch.Tensor], torch.Tensor]
"""f(e0 `[n, d]`) -> hidden states `[L+1, n, d]`, index 0 = e0; pure and differentiable."""

CPU_MAX_CHUNK = 512
"""Default cap on tangents per chunk on the CPU: larger chunks measured no faster per JVP
(MiniLM, n = 8 and 32) and only cost memory."""

ProgressFn = Callable[[int, int], None]
"""Called after each chunk with (tangents done, tangents in all)."""


@dataclass(frozen=True)
class JacobianNorms:
    """‖∂e^l_i/∂x_j‖_F² for layers 1..L (layer 0 is the identity and is left out).

    Attributes:
        sq: `[L, n, n]` float64, indexed [l-1, i, j]; exact, or the unbiased estimate.
        sq_var: `[L, n, n]` float64 estimated variance of `sq` (estimator only; None
            in exact mode; NaN where k = 1).
        probes: tangents per input token (d in exact mode).
        exact: whether an orthonormal basis of the full space was used.
        n_jvps: JVPs run in all (n·probes).
        chunk_size: tangents per vmapped batch.
    """

    sq: torch.Tensor
    sq_var: torch.Tensor | None
    probes: int
    exact: bool
    n_jvps: int
    chunk_size: int


def _check_input(e0: torch.Tensor) -> None:
    if e0.dim() != 2 or e0.shape[0] < 1 or e0.shape[1] < 1:
        raise IdentifiableError(
            f"e0 must be a non-empty [n, d] matrix, got shape {tuple(e0.shape)}"
        )
    if not e0.is_floating_point():
        raise IdentifiableError(f"e0 must be floating point, got {e0.dtype}")


def _push_chunk(
    batched: Callable[[torch.Tensor], torch.Tensor], tangents: torch.Tensor
) -> torch.Tensor:
    """Run one vmapped JVP chunk; a layer function that torch.func cannot transform gets a
    clear error instead of a deep traceback from inside the transform."""
    try:
        with torch.no_grad():
            return batched(tangents)
    except (RuntimeError, NotImplementedError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise IdentifiableError(
            "the model's layer function cannot be differentiated in forward mode under "
            f"torch.func.vmap/jvp ({first}); this architecture is not supported by "
            "Hidden Token Attribution yet, please report it"
        ) from exc


def jacobian_sq_norms(
    f: LayerFn,
    e0: torch.Tensor,
    *,
    probes: int | None = None,
    seed: int = 0,
    dims: ModelDims | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    chunk_size: int | None = None,
    on_progress: ProgressFn | None = None,
    pace: Pace | None = None,
) -> JacobianNorms:
    """Exact (probes=None) or estimated (probes=k) squared Jacobian block norms.

    Args:
        f: e0 `[n, d]` -> `[L+1, n, d]`, compatible with `torch.func.jvp` under `vmap`.
        e0: `[n, d]` the primal input x = e^0.
        probes: None for exact mode, or k in 1..d random orthonormal probes per token;
            seeded by `seed` (ignored in exact mode).
        dims: model sizes for the memory estimate (guessed from f's output if None).
        memory_budget: bytes one chunk may use; checked before any JVP runs.
        chunk_size: tangents per batch (default: what the budget allows, ≤ `CPU_MAX_CHUNK` on CPU).
        on_progress: called with (done, total) after each chunk; pace: a time budget.
    """
    _check_input(e0)
    n, d = e0.shape
    bank = ProbeBank(n, d, probes, seed)  # validates k before any model call
    e0 = e0.detach()
    total = n * bank.k
    what = "exact Hidden Token Attribution" if bank.exact else f"{bank.k}-probe estimation"
    itemsize = e0.element_size()
    if dims is not None:  # the plan is a formula: refuse before the model runs at all
        chunk = plan_chunk_size(n, dims, itemsize, total, memory_budget, chunk_size, what=what)
    with torch.no_grad():
        primal = f(e0)
    n_layers = _layers_of(primal, n, d)
    if dims is None:
        dims = ModelDims.guess(n_layers, d)
        chunk = plan_chunk_size(n, dims, itemsize, total, memory_budget, chunk_size, what=what)
    if chunk_size is None and e0.device.type == "cpu":
        chunk = min(chunk, CPU_MAX_CHUNK)

    def push(tangent: torch.Tensor) -> torch.Tensor:
        return torch.func.jvp(f, (e0,), (tangent,))[1]

    batched = torch.func.vmap(push, randomness="same")  # 4.x FSMT draws numbers it never uses
    s1 = torch.zeros(n_layers, n, n, dtype=torch.float64, device=e0.device)
    s2 = None if bank.exact else torch.zeros_like(s1)
    scale = float(d)  # estimator: y_a = d·‖J p_a‖²; exact mode sums ‖J e_a‖² unscaled
    start = 0
    while start < total:
        stop = min(start + (chunk if pace is None else pace.chunk(chunk)), total)
        tokens, vectors = bank.directions(start, stop)
        tokens = tokens.to(e0.device)
        tangents = torch.zeros(stop - start, n, d, dtype=e0.dtype, device=e0.device)
        tangents[torch.arange(stop - start, device=e0.device), tokens] = vectors.to(tangents)
        out = _push_chunk(batched, tangents)  # [B, L+1, n, d]
        # ‖J^l_{ij} u‖² for every chunk member b, layer l ≥ 1 and output token i: [L, n, B]
        norms2 = torch.linalg.vector_norm(out[:, 1:], dim=-1).double().square().permute(1, 2, 0)
        del out
        if not torch.isfinite(norms2).all():
            raise IdentifiableError(
                "the Jacobian has non-finite entries (overflow in a low-precision dtype?); "
                "load the model in float32"
            )
        if bank.exact:
            s1.index_add_(2, tokens, norms2)
        else:
            y = scale * norms2
            s1.index_add_(2, tokens, y)
            s2.index_add_(2, tokens, y.square())  # type: ignore[union-attr]
        if on_progress is not None:
            on_progress(stop, total)
        if pace is not None:
            pace.check(stop, total)
        start = stop
    if bank.exact:
        return JacobianNorms(s1, None, d, True, total, chunk)
    mean, var = _estimate(s1, s2, bank.k, d)  # type: ignore[arg-type]
    return JacobianNorms(mean, var, bank.k, False, total, chunk)


class Pace:
    """A time budget for `jacobian_sq_norms`. Every JVP costs about one forward pass, so
    timed chunks price the rest: the first chunk is one JVP, later chunks take at most a
    twentieth of the budget, and the run is refused as soon as its estimate exceeds the
    budget (twice it after the first chunk, a batch of one, which runs slower per JVP),
    or when the budget plus 5 % has run out. `refusal(estimate, done, total)` builds the
    error. Setup (encoding, the primal forward) counts as elapsed, not as JVP time."""

    def __init__(
        self, seconds: float, refusal: Callable[[float, int, int], Exception], start: float
    ) -> None:
        self.seconds, self.refusal, self.start = seconds, refusal, start
        self.checks, self.done = 0, 0
        self.jvps, self.secs = 0, 0.0  # the chunk timed first; from the second on, the rest
        self.chunk_start = start

    def chunk(self, planned: int) -> int:
        """The next chunk's JVPs: one first, then what a twentieth of the budget buys."""
        self.chunk_start = time.perf_counter()
        if self.checks == 0:
            return 1
        per_jvp = self.secs / self.jvps
        return max(1, min(planned, int(self.seconds / 20 / max(per_jvp, 1e-9))))

    def check(self, done: int, total: int) -> None:
        now = time.perf_counter()
        jvps, secs = done - self.done, now - self.chunk_start
        if self.checks <= 1:  # the batch of one prices alone, then gives way to real chunks
            self.jvps, self.secs = jvps, secs
        else:
            self.jvps, self.secs = self.jvps + jvps, self.secs + secs
        self.checks, self.done = self.checks + 1, done
        elapsed = now - self.start
        estimate = elapsed + self.secs / self.jvps * (total - done)
        slack = 2.0 if self.checks == 1 else 1.0
        if done < total and (estimate > slack * self.seconds or elapsed > 1.05 * self.seconds):
            raise self.refusal(estimate, done, total)


def _layers_of(primal: torch.Tensor, n: int, d: int) -> int:
    """L, from the layer function's output `[L+1, n, d]`; one line if it is not that."""
    if primal.dim() != 3 or primal.shape[1:] != (n, d) or primal.shape[0] < 2:
        raise IdentifiableError(
            f"the layer function must return [L+1, n, d] = [L+1, {n}, {d}] with L ≥ 1, "
            f"got {tuple(primal.shape)}"
        )
    return int(primal.shape[0]) - 1


def _estimate(
    s1: torch.Tensor, s2: torch.Tensor, k: int, d: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """ȳ (the unbiased estimate of ‖J‖_F²) and its estimated variance (module docstring)."""
    mean = s1 / k
    if k == 1:
        return mean, torch.full_like(mean, float("nan"))
    sample_var = ((s2 - k * mean.square()) / (k - 1)).clamp_min(0.0)
    return mean, sample_var * (d - k) / (d * k)
