"""Fitting the probes of one layer to convergence, every choice made on validation data.

The protocol (stated in the report and in docs/token_identifiability.md):
- linear: two starts, compared on validation (the caller's score, Fig. 2: the validation
  identification rate, then the loss): the ridge fit and, where e^l and the targets share
  a space, the identity (the naive probe). The ridge fit is least squares in closed form
  (to unit-normalised targets for cosine, which only sees directions), its λ = ridge ·
  mean eigenvalue of X_cᵀX_c chosen from a grid by the validation loss with
  `ridge="auto"` (one eigendecomposition serves the grid; Gram matrix and solves in
  float64). The better start is refined by full-batch L-BFGS on the exact loss with
  validation early stopping (`identifiable.tokens.lbfgs`), except the L2 ridge fit, which
  is the exact minimiser already. For Fig. 2b both starts of linear-cos are refined and
  the better-validated fit is the probe. So no linear probe validates below the naive
  probe of its layer.
- MLP (the paper's plain one-hidden-layer ReLU network), started at the linear probe of
  its objective (`mlp_init="linear"`, pairs of hidden units) or at random: minibatch Adam
  with a learning-rate grid chosen on validation, learning-rate decay on plateaus and
  early stopping (`identifiable.tokens.adam`); from the linear start it keeps the linear
  probe unless Adam's state validates better, and it is not trained from a linear start
  that already identifies every validation token ("ceiling", as for L-BFGS). The skip
  variant (affine path at the linear probe, W₂ = 0) is an option (`mlp_skip`).
- Early stopping always keeps the best state seen (the start included) and records why
  the fit ended, its loss curve and its final training and validation loss.
- Everything random draws from one `torch.Generator(seed)`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace

import torch

from identifiable.tokens.adam import Standardised, fit_adam
from identifiable.tokens.lbfgs import SCORE_CEILING, Score, refine_linear
from identifiable.tokens.probes import (
    FitInfo,
    Objective,
    Probe,
    ProbeConfig,
    ProbeKind,
    objective_loss,
    unit_rows,
)


class RidgeSolver:
    """Closed-form affine least squares on one input matrix `x` `[N, d]`, factorised once.

    `solve(Y, ridge)` returns W, b minimising Σ‖x W + b − y‖² + λ‖W‖² (bias
    unpenalised), λ = ridge · mean eigenvalue of X_cᵀX_c. The Gram matrix is
    formed and factorised (Cholesky) in float64, once per λ; the N×d products X_cᵀY
    and X_c W run in float32 (exact to ~1e-6 relative, twice as fast). `select`
    picks λ from a grid by the validation loss, from one eigendecomposition.
    """

    def __init__(self, x: torch.Tensor) -> None:
        x64 = x.double()
        mean = x64.mean(0)
        xc64 = x64 - mean
        self.gram = xc64.T @ xc64
        self.unit = max(float(self.gram.diagonal().mean()), 1e-300)  # mean eigenvalue
        self.mean = mean.float()
        self.xc = xc64.float()
        self._chol: dict[float, torch.Tensor] = {}
        self._eig: tuple[torch.Tensor, torch.Tensor] | None = None

    def _project(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(X_cᵀ(y − ȳ) in float64, ȳ)."""
        y = y.float()
        y_mean = y.mean(0)
        return (self.xc.T @ (y - y_mean)).double(), y_mean

    def _weights(
        self, rhs: torch.Tensor, y_mean: torch.Tensor, ridge: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        lam = max(ridge * self.unit, 1e-300)
        if ridge not in self._chol:  # one Cholesky factor per ridge in use (usually one)
            self._chol[ridge] = torch.linalg.cholesky(
                self.gram
                + lam
                * torch.eye(self.gram.shape[0], dtype=self.gram.dtype, device=self.gram.device)
            )
        w = torch.cholesky_solve(rhs, self._chol[ridge]).float()
        return w, y_mean - self.mean @ w

    def solve(self, y: torch.Tensor, ridge: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
        """`y`: `[N, d_out]` → (W `[d, d_out]`, b `[d_out]`), float32."""
        return self._weights(*self._project(y), ridge)

    def select(
        self,
        y: torch.Tensor,
        x_val: torch.Tensor,
        y_val: torch.Tensor,
        objective: Objective,
        grid: tuple[float, ...],
    ) -> tuple[float, torch.Tensor, torch.Tensor, list[tuple[float, float]]]:
        """The ridge of `grid` whose fit to `y` has the lowest validation loss.

        Returns (ridge, W, b, [(ridge, validation loss) for every ridge of the grid]).
        One eigendecomposition of X_cᵀX_c serves every ridge of the grid.
        """
        if self._eig is None:
            evals, evecs = torch.linalg.eigh(self.gram)
            self._eig = (evals.clamp_min(0.0), evecs)
        evals, evecs = self._eig
        rhs, y_mean = self._project(y)
        proj = evecs.T @ rhs
        best: tuple[float, float, torch.Tensor, torch.Tensor] | None = None
        tried: list[tuple[float, float]] = []
        for ridge in grid:
            w = (evecs @ (proj / (evals + max(ridge * self.unit, 1e-300))[:, None])).float()
            b = y_mean - self.mean @ w
            loss = float(objective_loss(x_val @ w + b, y_val, objective))
            tried.append((ridge, loss))
            if best is None or loss < best[0]:
                best = (loss, ridge, w, b)
        assert best is not None
        return best[1], best[2], best[3], tried

    def predict(self, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """x W + b on the training inputs, `[N, d_out]`."""
        return self.xc @ w + (self.mean @ w + b)


def closed_form(
    solver: RidgeSolver,
    y: torch.Tensor,
    x_val: torch.Tensor,
    y_val: torch.Tensor,
    objective: Objective,
    cfg: ProbeConfig,
) -> FitInfo:
    """The closed-form linear probe of `objective`: the ridge fit to `y` (L2), or to
    unit-normalised `y` (cosine: linear-cos's start), its ridge chosen on validation by the
    objective's loss with "auto". `y`: `[N, d_out]` training targets."""
    target = unit_rows(y.float()) if objective == "cos" else y
    grid: tuple[tuple[dict[str, float], float], ...] = ()
    if cfg.ridge == "auto":
        ridge, w, b, tried = solver.select(target, x_val, y_val, objective, cfg.ridge_grid)
        grid = tuple(({"ridge": r}, loss) for r, loss in tried)
    else:
        ridge = float(cfg.ridge)
        w, b = solver.solve(target, ridge)
    probe = Probe("linear", objective, w, b)
    with torch.no_grad():
        v = float(objective_loss(probe(x_val), y_val, objective))
        t = float(objective_loss(solver.predict(w, b), y.float(), objective))
    return FitInfo(
        probe, 0, v, v, {"ridge": ridge}, t, "closed form", ((0, t, v),), grid, "closed form"
    )


ValScore = Callable[[torch.Tensor, Objective], float]  # validation predictions → higher is better


def identity_start(d: int, objective: Objective, device: torch.device) -> Probe:
    """The naive probe (e^l itself) as a linear probe: W = I, b = 0."""
    return Probe("linear", objective, torch.eye(d, device=device), torch.zeros(d, device=device))


def validation_key(
    probe: Probe,
    x_val: torch.Tensor,
    y_val: torch.Tensor,
    objective: Objective,
    score: Score | None,
) -> tuple[float, float]:
    """How well `probe` validates: (the caller's score, or −loss; −loss), higher is better,
    compared in that order (the score first: Fig. 2's validation identification rate)."""
    with torch.no_grad():
        pred = probe(x_val)
        loss = float(objective_loss(pred, y_val, objective))
    return (score(pred) if score is not None else -loss, -loss)


def linear_fits(
    solver: RidgeSolver,
    x: torch.Tensor,
    y: torch.Tensor,
    x_val: torch.Tensor,
    y_val: torch.Tensor,
    objective: Objective,
    cfg: ProbeConfig,
    score: Score | None = None,
    both: bool = False,
) -> tuple[FitInfo, dict[str, FitInfo]]:
    """The linear probe of `objective` and the fit from each start it was chosen from.

    Starts: "ridge" (`closed_form`) and, when e^l and the targets share a space and
    `cfg.identity_start`, "identity" (the naive probe). The better start on validation
    (`validation_key`) is refined by L-BFGS with validation early stopping
    (`refine_linear`), except the L2 ridge fit, which is the exact minimiser already. With
    `both`, each start is refined (Fig. 2b's two regimes) and the better-validated fit is
    the probe. So the probe never validates below the naive probe. Returns (the probe's
    fit, {start: fit}); extras["identity_start"] says where each fit began.
    """
    ridge = closed_form(solver, y, x_val, y_val, objective, cfg)
    starts = {"ridge": ridge}
    if cfg.identity_start and x.shape[1] == y.shape[1]:
        eye = identity_start(x.shape[1], objective, x.device)
        with torch.no_grad():
            v = float(objective_loss(eye(x_val), y_val, objective))
        starts["identity"] = FitInfo(eye, 0, v, v, {"ridge": float("nan")}, stopped="no fit")
    keys = {n: validation_key(f.probe, x_val, y_val, objective, score) for n, f in starts.items()}
    chosen = max(keys, key=lambda n: keys[n])
    fits: dict[str, FitInfo] = {}
    for name in starts if both else [chosen]:
        start = starts[name]
        exact = objective == "l2" and name == "ridge"  # L-BFGS would not leave the minimiser
        fit = (
            start
            if exact or cfg.cos_steps < 1
            else refine_linear(x, y, x_val, y_val, objective, start.probe, cfg, score)
        )
        extras = {**start.extras, **fit.extras, "identity_start": float(name == "identity")}
        fits[name] = replace(fit, extras=extras, grid=ridge.grid)
    if both:
        keys = {n: validation_key(f.probe, x_val, y_val, objective, score) for n, f in fits.items()}
        chosen = max(keys, key=lambda n: keys[n])
    return fits[chosen], fits


def _subset(n: int, cap: int | None, gen: torch.Generator) -> torch.Tensor | None:
    return None if cap is None or n <= cap else torch.randperm(n, generator=gen)[:cap].sort().values


def fit_probes(
    x: torch.Tensor,
    y: torch.Tensor,
    x_val: torch.Tensor,
    y_val: torch.Tensor,
    kinds: list[tuple[ProbeKind, Objective]],
    *,
    config: ProbeConfig | None = None,
    seed: int = 0,
    solver: RidgeSolver | None = None,
    val_score: ValScore | None = None,
    starts: dict[Objective, dict[str, FitInfo]] | None = None,
) -> dict[tuple[ProbeKind, Objective], FitInfo]:
    """Fit the requested probes of one layer, sharing the ridge factorisation.

    Args:
        x: `[N, d]` hidden states e^l of the training tokens; y: `[N, d_out]` their targets.
        x_val, y_val: the same for the validation tokens (hyperparameters, early stopping).
        kinds: (probe kind, objective) pairs to fit.
        config: fitting settings; seed: seeds every random choice. solver: a `RidgeSolver`
            already factorised on `x` (shared across calls on one layer).
        val_score: validation score of predictions `[N_val, d_out]` under an objective's
            metric (higher is better, e.g. the identification rate) that chooses the linear
            start, stops L-BFGS and decides whether an MLP beats its linear start (None: loss).
        starts: filled with linear-cos's fit from each start (Fig. 2b, `linear_fits`).
    Returns one `FitInfo` per requested pair, in the order of `kinds`, fitted where `x` is.
    """
    cfg = config or ProbeConfig()
    x, y, x_val, y_val = (t.float() for t in (x, y, x_val, y_val))
    gen = torch.Generator().manual_seed(seed)
    x_val_all, y_val_all = x_val, y_val  # the linear fits are full-batch: all of validation
    vsub = _subset(x_val.shape[0], cfg.val_tokens, gen)
    if vsub is not None:
        x_val, y_val = x_val[vsub], y_val[vsub]
    sub = _subset(x.shape[0], cfg.fit_tokens, gen)
    linear: dict[Objective, FitInfo] = {}
    standardised: list[Standardised] = []

    def data() -> Standardised:  # built on first use: closed-form fits never need it
        if not standardised:
            xs, ys = (x, y) if sub is None else (x[sub], y[sub])
            standardised.append(Standardised.of(xs, ys, x_val, y_val))
        return standardised[0]

    def score_of(obj: Objective) -> Score | None:
        return None if val_score is None else functools.partial(_scored, val_score, obj)

    def linear_fit(obj: Objective) -> FitInfo:
        nonlocal solver
        if obj in linear:
            return linear[obj]
        if obj == "l2" and not cfg.linear_l2_closed_form:  # a check: L-BFGS from zero
            zero = Probe(
                "linear", "l2", x.new_zeros(x.shape[1], y.shape[1]), y.new_zeros(y.shape[1])
            )
            linear[obj] = refine_linear(x, y, x_val_all, y_val_all, "l2", zero, cfg)
            return linear[obj]
        if solver is None:
            solver = RidgeSolver(x)
        both = starts is not None and obj == "cos"
        linear[obj], fits = linear_fits(
            solver, x, y, x_val_all, y_val_all, obj, cfg, score_of(obj), both
        )
        if both and starts is not None:
            starts[obj] = fits
        return linear[obj]

    out: dict[tuple[ProbeKind, Objective], FitInfo] = {}
    for kind, obj in kinds:
        if kind == "naive":
            out[(kind, obj)] = _naive(x, y, x_val, y_val, obj)
        elif kind == "linear":
            out[(kind, obj)] = linear_fit(obj)
        elif kind == "mlp":
            out[(kind, obj)] = _mlp(
                obj, linear_fit, data, cfg, seed, (x_val_all, y_val_all), score_of(obj)
            )
        else:
            raise ValueError(f"unknown probe kind {kind!r}")
    return out


def _naive(
    x: torch.Tensor, y: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor, obj: Objective
) -> FitInfo:
    same_space = x_val.shape[1] == y_val.shape[1]
    with torch.no_grad():
        v = float(objective_loss(x_val, y_val, obj)) if same_space else float("nan")
        t = float(objective_loss(x, y, obj)) if same_space else float("nan")
    return FitInfo(Probe("naive", obj), 0, v, v, {}, t, "no fit")


def _scored(val_score: ValScore, objective: Objective, pred: torch.Tensor) -> float:
    return val_score(pred, objective)


def _mlp(
    obj: Objective,
    linear_fit: Callable[[Objective], FitInfo],
    data: Callable[[], Standardised],
    cfg: ProbeConfig,
    seed: int,
    val: tuple[torch.Tensor, torch.Tensor],
    score: Score | None,
) -> FitInfo:
    """The MLP probe of `obj`. From the linear start (exact when the width is ≥ 2d) the MLP
    keeps the linear probe unless Adam's best state validates better (`validation_key` on
    all validation tokens): extras["kept_start"] is 1 then. A start that already identifies
    every validation token (the caller's score at 1) is kept without training ("ceiling")."""
    if cfg.mlp_skip:
        init = linear_fit(obj)
        fit = fit_adam("skip", obj, data(), cfg, seed + 7, init.probe)
        return replace(fit, extras={**init.extras, **fit.extras})
    start = linear_fit(obj) if cfg.mlp_init == "linear" else None
    x_val, y_val = val
    d = x_val.shape[1]
    if start is not None and score is not None and cfg.width_for(d) >= 2 * d:
        rate = score(start.probe(x_val))
        if rate >= SCORE_CEILING:  # the start identifies every validation token: keep it
            return _ceiling(start, obj, rate, cfg.width_for(d))
    fit = fit_adam("mlp", obj, data(), cfg, seed + 7, None if start is None else start.probe)
    exact = start is not None and (fit.width or 0) >= 2 * d
    if not exact or start is None:
        return fit
    if validation_key(fit.probe, x_val, y_val, obj, score) > validation_key(
        start.probe, x_val, y_val, obj, score
    ):
        return replace(fit, extras={**fit.extras, "kept_start": 0.0})
    kept = Probe("mlp", obj, start.probe.weight, start.probe.bias)
    return replace(
        fit, probe=kept, val_loss=fit.val_loss_start, extras={**fit.extras, "kept_start": 1.0}
    )


def _ceiling(start: FitInfo, obj: Objective, rate: float, width: int) -> FitInfo:
    """The MLP kept at its linear start, which already identifies every validation token (as
    L-BFGS does from such a start: no state can validate better on Fig. 2's quantity)."""
    kept = Probe("mlp", obj, start.probe.weight, start.probe.bias)
    extras = {**start.extras, "kept_start": 1.0, "val_score_start": rate, "val_score": rate}
    curve = ((0, start.train_loss, start.val_loss),)
    return FitInfo(
        kept,
        0,
        start.val_loss,
        start.val_loss,
        extras,
        start.train_loss,
        "ceiling",
        curve,
        optimizer="Adam",
        width=width,
    )


def select_adam(
    x: torch.Tensor,
    y: torch.Tensor,
    x_val: torch.Tensor,
    y_val: torch.Tensor,
    kind: tuple[ProbeKind, Objective],
    *,
    config: ProbeConfig | None = None,
    seed: int = 0,
) -> FitInfo:
    """Choose (learning rate, weight decay) of one Adam-fitted probe kind on validation data.

    Every pair of the grid trains `select_steps` steps from the same start on the same
    minibatches; the returned `FitInfo` holds the winner in `extras` and every pair's
    validation loss in `grid`. `evaluate_pairs` calls this once per probe kind on the
    deepest layer (the hardest) and reuses the choice at every layer, unless
    `select_per_layer` asks for a choice per layer.
    """
    cfg = config or ProbeConfig()
    short = replace(cfg, max_steps=cfg.select_steps, lr=None, weight_decay=None)
    return fit_probes(x, y, x_val, y_val, [kind], config=short, seed=seed)[kind]
