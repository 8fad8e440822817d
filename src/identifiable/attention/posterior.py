"""Probabilistic effective attention: a posterior over the attention rows that give the
same head output (docs/posterior.md).

For query row i of a head, with key set K_i, the valid rows form the polytope

    P_i = {ã : ã ≥ 0 on K_i, ã = 0 off K_i, Σ ã = 1, ã T = a T}

(T = E W_V H; with Σ ã = 1 the value bias changes nothing). `attention_posterior` puts a
prior on P_i (uniform, or a Dirichlet centred on the raw row) and summarises it from
Markov chains (the billiard walk, `billiard`, by default, or hit-and-run, `hitrun`; run by
`chains`): the mean row, central credible intervals, P(key j is
the top key), P(the raw top key stays on top), P(a weight reaches half its certified
maximum), beside the certified intervals (`interval_map`), the paper's A_eff and the
constrained row (`constrained_attention`). Each row carries its effective sample size and
split-R̂, and flags (`chains.FLAG_TEXT`) wherever they fall short.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from identifiable.attention import chains as chain_runs
from identifiable.attention.checks import check_finite, check_trace
from identifiable.attention.constrained import constrained_attention
from identifiable.attention.hitrun import Polytopes
from identifiable.attention.intervals import IntervalMap, interval_map
from identifiable.attention.linalg import add_ones, column_basis, head_factors, row_ids
from identifiable.errors import IdentifiableError, seconds
from identifiable.models.trace import Trace
from identifiable.results import Result
from identifiable.utils.checks import count, indices, number, whole
from identifiable.utils.progress import task_bar, watching
from identifiable.utils.threads import engine_threads

if TYPE_CHECKING:  # pragma: no cover - types only
    import pandas as pd
    from matplotlib.figure import Figure

PRIORS: tuple[str, ...] = ("uniform", "dirichlet")
PIN = 1e-9  # a key whose certified maximum is below this is held at its raw weight
MEMORY = 1 << 30  # bytes of metric and draws per batch of rows (rows are cut to fit)
MAX_TAU = 25  # a row gets up to MAX_TAU · samples / chains draws per chain
_KEY_DIMS = ("head", "row", "key")
_ROW_DIMS = ("head", "row")


@dataclass(frozen=True)
class AttentionPosterior(
    Result,
    dims={
        "mean": _KEY_DIMS,
        "credible_lower": _KEY_DIMS,
        "credible_upper": _KEY_DIMS,
        "raw": _KEY_DIMS,
        "effective": _KEY_DIMS,
        "constrained": _KEY_DIMS,
        "lower": _KEY_DIMS,
        "upper": _KEY_DIMS,
        "p_top": _KEY_DIMS,
        "p_half": _KEY_DIMS,
        "mcse": _KEY_DIMS,
        "keys": ("row", "key"),
        "dim": _ROW_DIMS,
        "ess": _ROW_DIMS,
        "rhat": _ROW_DIMS,
        "draws": _ROW_DIMS,
        "flags": _ROW_DIMS,
        "p_top_stays": _ROW_DIMS,
        "samples_kept": ("head", "row", "draw", "key"),
    },
    plot={"kind": "interval"},
    summary=("layer", "heads", "prior", "alpha", "samples", "chains", "seed", "level", "walk"),
):
    """A posterior over the valid attention rows of some rows of some heads of one layer.

    Shapes: H = len(heads), R = len(rows), n keys (n_k for cross-attention); arrays are
    float64 on the CPU, and 0 outside a row's key set.

    Attributes:
        layer, heads, rows: what was computed (0-based).
        prior, alpha: the prior ("uniform", or "dirichlet" with density ∝ Π ã_j^{α a_j}
            on P_i: its mode is the raw row a); samples, chains, seed, level: as asked.
        raw, effective, constrained: `[H, R, n]` the raw row a, the paper's effective row
            (a Q_T Q_Tᵀ; not a distribution) and the constrained row (the valid row
            closest to uniform).
        lower, upper: `[H, R, n]` the certified interval of each weight (`interval_map`).
        mean, credible_lower, credible_upper: `[H, R, n]` the posterior mean and the
            central credible interval at `level`.
        p_top: `[H, R, n]` P(key j holds the row's largest weight).
        p_half: `[H, R, n]` P(ã_j ≥ upper_j / 2).
        mcse: `[H, R, n]` the Monte Carlo standard error of `mean`.
        keys: `[R, n]` bool, each row's key set.
        dim: `[H, R]` int64 dim P_i (0: the posterior is the point a).
        ess, rhat: `[H, R]` the row's effective sample size (the smallest over its
            weights) and split-R̂ (the largest); NaN for a point.
        draws: `[H, R]` int64 draws pooled over the chains.
        flags: `[H, R]` int64 bits (`flag_text`): 1 R̂ > 1.01, 2 ESS below `samples`,
            4 a point (dim P_i = 0), 8 stopped by the time budget.
        samples_kept: `[H, R, S, n]` S = `samples` draws per row spread over the chains
            (`keep_draws=True`), else None.
        seconds: wall time; tokens, key_tokens, model_name: labels of the trace.
        walk: the Markov chain asked for ("auto", "billiard" or "hitrun").
    """

    layer: int
    heads: tuple[int, ...]
    rows: tuple[int, ...]
    prior: str
    alpha: float
    samples: int
    chains: int
    seed: int
    level: float
    raw: Tensor
    effective: Tensor
    constrained: Tensor
    lower: Tensor
    upper: Tensor
    mean: Tensor
    credible_lower: Tensor
    credible_upper: Tensor
    p_top: Tensor
    p_half: Tensor
    mcse: Tensor
    keys: Tensor
    dim: Tensor
    ess: Tensor
    rhat: Tensor
    draws: Tensor
    flags: Tensor
    seconds: float
    samples_kept: Tensor | None = None
    tokens: list[str] | None = None
    key_tokens: list[str] | None = None
    model_name: str = ""
    walk: str = "auto"

    @property
    def p_top_stays(self) -> Tensor:
        """`[H, R]` P(the raw row's top key stays on top)."""
        return self.p_top.gather(-1, self.raw.argmax(-1, keepdim=True)).squeeze(-1)

    @property
    def credible_width(self) -> Tensor:
        """`[H, R, n]` credible_upper − credible_lower."""
        return self.credible_upper - self.credible_lower

    @property
    def certified_width(self) -> Tensor:
        """`[H, R, n]` upper − lower."""
        return self.upper - self.lower

    def flag_text(self, head: int = 0, row: int = 0) -> str:
        """The flags of one row in words ("" when it has none); `head` and `row` are
        positions in `heads` and `rows`."""
        return chain_runs.flag_text(int(self.flags[head, row]))

    def rows_table(self) -> pd.DataFrame:
        """One line per head and row: dim P_i, ESS, split-R̂, draws, the raw top key,
        P(it stays on top) and the flags in words (empty when the row is sound)."""
        import pandas as pd

        out = []
        stays, top = self.p_top_stays, self.raw.argmax(-1)
        for h, head in enumerate(self.heads):
            for r, row in enumerate(self.rows):
                out.append(
                    {
                        "head": head,
                        "row": row,
                        "row_token": self.tokens[row] if self.tokens else None,
                        "dim": int(self.dim[h, r]),
                        "ess": float(self.ess[h, r]),
                        "rhat": float(self.rhat[h, r]),
                        "draws": int(self.draws[h, r]),
                        "top_key": int(top[h, r]),
                        "p_top_stays": float(stays[h, r]),
                        "flags": self.flag_text(h, r),
                    }
                )
        return pd.DataFrame(out)

    def to_pandas(self, *fields: str, **sel: Any) -> pd.DataFrame:
        """As `Result.to_pandas`; the default per-key table also carries each row's dim,
        ess, rhat and flags (in words), so that a flagged row is flagged on every line."""
        table = super().to_pandas(*fields, **sel)
        if fields or not {"head", "row"} <= set(table.columns):
            return table
        rows = self.rows_table()[["head", "row", "dim", "ess", "rhat", "flags"]]
        return table.merge(rows, on=["head", "row"], how="left")

    def plot(self, *fields: str, **sel: Any) -> Figure:
        """One row on one axis: the certified interval (light band), the credible band
        (dark band), the raw row, the paper's A_eff, the constrained row and the posterior
        mean; the row's flags in the title. `head=`, `row=` choose it (model indices,
        default the first); `max_keys=` (48) keeps the keys with the widest intervals."""
        from identifiable.attention.posterior_plot import row_figure

        return row_figure(self, **sel)


def _check_request(
    prior: str,
    alpha: float,
    samples: int,
    chains: int,
    level: float,
    time_budget: float | None,
    walk: str = "auto",
) -> None:
    """One line for each setting that cannot work, before anything runs."""
    if prior not in PRIORS:
        raise IdentifiableError(f"unknown prior {prior!r}: use one of {', '.join(PRIORS)}")
    if walk not in chain_runs.WALKS:
        raise IdentifiableError(
            f"unknown walk {walk!r}: use one of {', '.join(chain_runs.WALKS)} (--walk)"
        )
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not alpha > 0:
        raise IdentifiableError(f"alpha must be a positive number, got {alpha!r}")
    if not math.isfinite(alpha):
        raise IdentifiableError(f"alpha must be finite, got {alpha!r}")
    for name, value, least in (("samples", samples, 1), ("chains", chains, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise IdentifiableError(f"{name} must be an integer ≥ {least}, got {value!r}")
    if isinstance(level, bool) or not (isinstance(level, int | float) and 0 < level < 1):
        raise IdentifiableError(f"level must be a number between 0 and 1, got {level!r}")
    if time_budget is not None:
        number(time_budget, "time_budget", "--time-budget", low_open=True)


def attention_posterior(
    trace: Trace,
    layer: int,
    head: int | Sequence[int],
    rows: Sequence[int] | None = None,
    *,
    prior: str = "uniform",
    alpha: float = 1.0,
    samples: int = 1000,
    chains: int = 4,
    seed: int = 0,
    time_budget: float | None = None,
    level: float = 0.95,
    keep_draws: bool = False,
    walk: str = "auto",
    device: str | torch.device | None = None,
    progress: bool | None = None,
    threads: int | None = None,
) -> AttentionPosterior:
    """The posterior over the valid attention rows of `rows` of `head` (see the module
    docstring and `AttentionPosterior`).

    Args:
        head: one head or a list of heads, sampled together (batched with the rows).
        rows: query rows (default all).
        prior: "uniform" (every valid row equally likely) or "dirichlet" (density
            ∝ Π ã_j^{α a_j} on P_i, whose mode is the raw row; `alpha` > 0 sets how
            strongly it is held there; unused by the uniform prior).
        samples: effective samples wanted per row (the smallest ESS over its weights).
        chains: chains per row (split-R̂ compares them).
        seed: the seed of every random draw; a fixed seed gives bit-identical output on
            the same device, thread count and inputs.
        time_budget: seconds for the whole call; a probe (a few timed steps of the first
            batch of rows) refuses a request that cannot fit before the warm-up starts,
            and rows still short at the deadline are flagged.
        level: the probability of the central credible intervals.
        keep_draws: keep `samples` draws per row (`samples_kept`).
        walk: "billiard" (the billiard walk: about two steps per effective sample, each
            meeting about k facets, k = dim P_i), "hitrun" (hit-and-run: about k^2.2
            cheap steps) or "auto" (the billiard walk on the CPU, where it runs
            compiled; elsewhere hit-and-run on batches of rows with k ≤ 16 and the
            billiard walk above); all are exact (docs/posterior.md#the-sampler).
        device: where the chains run (default: the trace's device).
        progress: a bar of the rows done on stderr (None: when a person is watching).
        threads: CPU threads of the compiled billiard walk (default: torch's intra-op
            thread count); the draws do not depend on it.

    Raises IdentifiableError for an unknown prior or walk, alpha ≤ 0, samples or chains < 1,
    an index out of range, a corrupt trace, or a budget too small for the request.
    """
    check_trace(trace)
    _check_request(prior, alpha, samples, chains, level, time_budget, walk)
    seed = count(seed, "seed", "--seed", minimum=0)
    start = time.perf_counter()
    trace.check_layer(whole(layer, "layer", "--layer"))
    heads = indices([head] if isinstance(head, int) else head, trace.n_heads, "heads", "--head")
    row_list = (
        list(range(trace.n_tokens))
        if rows is None
        else indices(rows, trace.n_tokens, "rows", "--row")
    )
    imap = interval_map(
        trace, layers=[layer], heads=heads, rows=row_list, time_budget=time_budget, progress=False
    )
    problems = _row_problems(trace, layer, heads, row_list, imap)
    settings = (prior, float(alpha), samples, chains, int(seed), level, keep_draws)
    where = torch.device(device) if device is not None else trace.attentions.device
    lanes = engine_threads(threads)
    out = _sample_rows(problems, settings, (walk, lanes), (time_budget, start), where, progress)
    eff, con = _references(trace, layer, heads, row_list)
    return _assemble(
        trace, layer, heads, row_list, imap, eff, con, problems, out, settings, start, walk
    )


def _sample_rows(
    problems: list[_Row],
    settings: tuple[str, float, int, int, int, float, bool],
    walk: tuple[str, int],
    timing: tuple[float | None, float],
    where: torch.device,
    progress: bool | None,
) -> dict[int, tuple[chain_runs.Summary, int]]:
    """Sample every row with a bar of the rows done; `walk` is (walk, CPU threads),
    `timing` (time_budget, start)."""
    prior, alpha, samples, chains, seed, level, keep_draws = settings
    time_budget, start = timing
    weight = 0.0 if prior == "uniform" else alpha
    gen = torch.Generator(device=where).manual_seed(seed)
    deadline = None if time_budget is None else start + 1.05 * time_budget
    budget = (time_budget, start, len(problems))
    shown = watching() if progress is None else progress
    with task_bar("attention posterior (rows)", len(problems), enabled=shown) as bar:
        bar.advance(sum(p.dim == 0 for p in problems))
        return _sample_all(
            problems,
            weight,
            samples,
            chains,
            level,
            keep_draws,
            deadline,
            budget,
            where,
            gen,
            bar.advance,
            walk,
        )


def _references(
    trace: Trace, layer: int, heads: list[int], rows: list[int]
) -> tuple[Tensor, Tensor]:
    """`[H, R, n]` the paper's effective rows and the constrained rows."""
    parts = [constrained_attention(trace, layer, h, rows=rows) for h in heads]
    return torch.stack([c.effective for c in parts]), torch.stack([c.weights for c in parts])


@dataclass(frozen=True)
class _Row:
    """One row's polytope: its keys (indices), raw weights over them, which keys move,
    and an orthonormal basis `[s, k]` of the left null space of [T, 1] over the moving
    keys (zero rows elsewhere)."""

    head: int
    row: int
    keys: Tensor
    raw: Tensor
    live: Tensor
    null: Tensor
    half_max: Tensor

    @property
    def dim(self) -> int:
        return self.null.shape[1]


def _null_space(basis: Tensor) -> Tensor:
    """`[s, s − m]` an orthonormal basis of the complement of col(basis) (`[s, m]`,
    orthonormal columns): the trailing columns of its complete QR."""
    q = torch.linalg.qr(basis, mode="complete")[0]
    return q[:, basis.shape[1] :]


def _row_problems(
    trace: Trace, layer: int, heads: list[int], rows: list[int], imap: IntervalMap
) -> list[_Row]:
    """The polytope of every (head, row), in head-major order. Keys whose certified
    maximum is below `PIN` (zero in every valid row, up to the LPs' accuracy) are held at
    their raw weight; the basis comes from the same factor and rank decisions as the
    interval map's (`column_basis` of V F over the keys, `add_ones` with `row_ids` of V)."""
    mask = trace.keys_seen(layer).cpu()
    out = []
    for hi, h in enumerate(heads):
        values = trace.values[layer, h].double().cpu()
        check_finite(values[None], "values (E·W_V)", layer=layer)
        vf = values @ head_factors(trace.out_proj[layer, h].double().cpu())[0]
        ids = row_ids(values)
        att = trace.attentions[layer, h].double().cpu()
        cache: dict[bytes, Tensor] = {}
        for ri, r in enumerate(rows):
            keys = mask[r].nonzero().flatten()
            upper = imap.upper[0, hi, ri, keys]
            live = upper > PIN
            idx = keys[live]
            tag = idx.numpy().tobytes()
            if tag not in cache:
                q, rank, _ = column_basis(vf[idx])
                qa, _ = add_ones(q, rank, ids[idx])
                cache[tag] = _null_space(qa[:, torch.linalg.vector_norm(qa, dim=0) > 0])
            null = torch.zeros(len(keys), cache[tag].shape[1], dtype=torch.float64)
            null[live] = cache[tag]
            raw = att[r, keys] / att[r, keys].sum()  # Σ = 1 in float64 (float32 rows: ±1e-7)
            out.append(_Row(h, r, keys, raw, live, null, upper / 2))
    return out


def _batches(problems: list[_Row], chains: int, samples: int) -> list[list[int]]:
    """Indices of the rows with dim > 0, cut into batches whose rounding (s·k floats a
    row) and draws fit `MEMORY` at the batch's widest row; rows of similar size go
    together (sorted by their number of keys)."""
    todo = sorted(
        (i for i, p in enumerate(problems) if p.dim > 0), key=lambda i: (len(problems[i].keys), i)
    )
    per_chain = math.ceil(2 * chain_runs.TAU_GUESS * samples / chains) + 8
    out: list[list[int]] = []
    for i in todo:
        s = len(problems[i].keys)  # the widest so far: rows come sorted
        cost = 8 * (2 * s * s + chains * per_chain * s)
        if out and (len(out[-1]) + 1) * cost <= MEMORY:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _stack(
    problems: list[_Row], idx: list[int], weight: float, where: torch.device
) -> tuple[Polytopes, Tensor]:
    """The padded `hitrun.Polytopes` of some rows, and half their keys' maxima `[R, s]`."""
    s = max(len(problems[i].keys) for i in idx)
    k = max(problems[i].dim for i in idx)
    raw = torch.zeros(len(idx), s, dtype=torch.float64)
    null = torch.zeros(len(idx), s, k, dtype=torch.float64)
    live = torch.zeros(len(idx), s, dtype=torch.bool)
    half = torch.zeros_like(raw)
    for j, i in enumerate(idx):
        p = problems[i]
        size = len(p.keys)
        raw[j, :size], live[j, :size], half[j, :size] = p.raw, p.live, p.half_max
        null[j, :size, : p.dim] = p.null
    poly = Polytopes(raw, null, live, weight * raw * live)
    return Polytopes(*(t.to(where) for t in vars(poly).values())), half.to(where)


def _sample_all(
    problems, weight, samples, chains, level, keep, deadline, budget, where, gen, advance, walk
) -> dict[int, tuple[chain_runs.Summary, int]]:
    """Sample every batch; returns, per problem index, its summary and its place in it."""
    walk, threads = walk
    fast = chain_runs.compiled(where, threads)
    out: dict[int, tuple[chain_runs.Summary, int]] = {}
    batches = _batches(problems, chains, samples)
    for b, idx in enumerate(batches):
        poly, half = _stack(problems, idx, weight, where)
        s = poly.raw.shape[1]
        room = MEMORY // max(1, 8 * len(idx) * chains * s)
        cap = max(8, min(MAX_TAU * samples // chains + 8, room))
        cfg = chain_runs.Settings(
            samples, chains, level, cap, deadline, samples if keep else 0, walk, threads
        )
        share = _cost(problems, idx, walk, fast) / max(
            1.0, sum(_cost(problems, i, walk, fast) for i in batches)
        )
        probe = _probe(budget, share, chains, samples) if b == 0 else None
        summary = chain_runs.sample(poly, half, cfg, gen, advance, probe)
        for j, i in enumerate(idx):
            out[i] = (summary, j)
    return out


def _cost(problems: list[_Row], idx: list[int], walk: str, fast: bool) -> float:
    """The work of a sweep of every row of `idx`, up to a constant: steps × keys × dim
    (a billiard step meets about dim facets; `fast`: it runs compiled)."""
    ways = [chain_runs.resolve(walk, problems[i].dim, fast) for i in idx]
    return float(
        sum(
            chain_runs.sweep(problems[i].dim, w)
            * len(problems[i].keys)
            * problems[i].dim ** (2 if w == "billiard" else 1)
            for i, w in zip(idx, ways, strict=True)
        )
    )


def _probe(budget: tuple[float | None, float, int], share: float, chains: int, samples: int):
    """The check made after a few timed steps of the first batch (`share` of the whole
    work): refuse (one line, with an estimate) a request that cannot end in the budget."""
    limit, start, total = budget
    if limit is None:
        return None

    def check(per_step: float, steps: float) -> None:
        estimate = (time.perf_counter() - start) + per_step * steps / max(share, 1e-12)
        if estimate > limit:
            raise IdentifiableError(
                f"the attention posterior of {total} rows needs about {seconds(estimate)} "
                f"({samples} effective samples per row; {per_step * 1e3:.2g} ms per step measured), "
                f"more than the time budget of {limit:g} s: raise the "
                "budget (time_budget=, CLI --time-budget), ask for fewer samples "
                "(samples=, --samples) or fewer rows (rows=, --row)"
            )

    return check


def _assemble(trace, layer, heads, rows, imap, eff, con, problems, out, settings, start, walk):
    """The result's `[H, R, n]` arrays from the summaries (points: the raw row itself)."""
    n_h, n_r, n = len(heads), len(rows), trace.n_keys
    prior, alpha, samples, chains, seed, level, keep = settings
    key_arrays = {
        k: torch.zeros(n_h, n_r, n, dtype=torch.float64)
        for k in ("mean", "credible_lower", "credible_upper", "p_top", "p_half", "mcse")
    }
    kept = torch.zeros(n_h, n_r, samples, n, dtype=torch.float64) if keep else None
    dims = torch.zeros(n_h, n_r, dtype=torch.long)
    ess, rhat = torch.full((n_h, n_r), math.nan), torch.full((n_h, n_r), math.nan)
    ess, rhat = ess.double(), rhat.double()
    draws, flags = torch.zeros_like(dims), torch.zeros_like(dims)
    for i, p in enumerate(problems):
        h, r = divmod(i, n_r)
        dims[h, r] = p.dim
        if p.dim == 0:
            _point(key_arrays, h, r, p)
            flags[h, r] = chain_runs.FLAG_POINT
            if kept is not None:
                kept[h, r][:, p.keys] = p.raw
            continue
        summary, k = out[i]
        size = len(p.keys)
        for name, field in (
            ("mean", "mean"),
            ("credible_lower", "lower"),
            ("credible_upper", "upper"),
            ("p_top", "p_top"),
            ("p_half", "p_half"),
            ("mcse", "mcse"),
        ):
            key_arrays[name][h, r, p.keys] = getattr(summary, field)[k, :size].cpu()
        ess[h, r], rhat[h, r] = float(summary.ess[k]), float(summary.rhat[k])
        draws[h, r], flags[h, r] = int(summary.draws[k]), int(summary.flags[k])
        if kept is not None:
            kept[h, r][:, p.keys] = summary.kept[k, :, :size].cpu()
    return AttentionPosterior(
        layer,
        tuple(heads),
        tuple(rows),
        prior,
        alpha,
        samples,
        chains,
        seed,
        level,
        imap.raw[0],
        eff,
        con,
        imap.lower[0],
        imap.upper[0],
        **key_arrays,
        keys=imap.keys[0],
        dim=dims,
        ess=ess,
        rhat=rhat,
        draws=draws,
        flags=flags,
        seconds=time.perf_counter() - start,
        samples_kept=kept,
        tokens=list(trace.tokens),
        key_tokens=trace.key_tokens,
        model_name=trace.model_name,
        walk=walk,
    )


def _point(arrays: dict[str, Tensor], h: int, r: int, p: _Row) -> None:
    """The summaries of a posterior that is the point a (dim P_i = 0)."""
    keys, a = p.keys, p.raw
    arrays["mean"][h, r, keys] = a
    arrays["credible_lower"][h, r, keys] = a
    arrays["credible_upper"][h, r, keys] = a
    arrays["p_top"][h, r, keys[int(a.argmax())]] = 1.0
    arrays["p_half"][h, r, keys] = (a >= p.half_max).double()
