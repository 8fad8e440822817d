"""Fitting the probes of one layer: closed form, Gauss–Newton and Adam, with early stopping.

- linear + L2: ridge least squares in closed form on all training tokens
  (λ = ridge · mean eigenvalue of X_cᵀX_c: tiny, but the fit stays well posed for
  rank-deficient data), Gram matrix and solve in float64. The Cholesky factor of
  X_cᵀX_c + λI is computed once per layer and shared by every linear fit of that
  layer, the control included.
- linear + cos: starts at the closed-form fit to unit-normalised targets (cosine
  only sees directions), then Gauss–Newton iterations on the exact loss 1 − cos
  reuse the same factor: each asks every prediction p_i to turn towards y_i by
  moving ‖p_i‖ times the part of ŷ_i orthogonal to p̂_i (which rotates p_i onto
  ŷ_i to first order) and solves for the weight change by least squares, halving
  the step until the training loss falls. Big matrix products instead of many
  small Adam steps keep this cheap on a CPU.
- MLP: ĝ(x) = z A + b + relu(z W₁ + b₁) W₂ with z the standardised input; the
  affine path starts at (and by default stays at) the linear probe of the same
  objective and W₂ starts at zero, so the MLP starts at the linear probe; minibatch
  Adam trains the hidden branch.
- Early stopping: the validation loss is checked every `eval_every` Adam steps or
  every Gauss–Newton iteration; after `patience` checks without improvement the
  fit stops, and the best state seen (the start included) is kept.
- Everything random draws from one `torch.Generator(seed)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from identifiable.tokens.probes import (
    FitInfo,
    Objective,
    Probe,
    ProbeConfig,
    ProbeKind,
    objective_loss,
    unit_rows,
)


def _improved(current: float, best: float) -> bool:
    return current < best - (1e-4 * abs(best) + 1e-8)  # a real improvement, not rounding


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
                self.gram + lam * torch.eye(self.gram.shape[0], dtype=self.gram.dtype)
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
    ) -> tuple[float, torch.Tensor, torch.Tensor]:
        """The ridge of `grid` whose fit to `y` has the lowest validation loss: (ridge, W, b).

        One eigendecomposition of X_cᵀX_c serves every ridge of the grid.
        """
        if self._eig is None:
            evals, evecs = torch.linalg.eigh(self.gram)
            self._eig = (evals.clamp_min(0.0), evecs)
        evals, evecs = self._eig
        rhs, y_mean = self._project(y)
        proj = evecs.T @ rhs
        best: tuple[float, float, torch.Tensor, torch.Tensor] | None = None
        for ridge in grid:
            w = (evecs @ (proj / (evals + max(ridge * self.unit, 1e-300))[:, None])).float()
            b = y_mean - self.mean @ w
            loss = float(objective_loss(x_val @ w + b, y_val, objective))
            if best is None or loss < best[0]:
                best = (loss, ridge, w, b)
        assert best is not None
        return best[1], best[2], best[3]

    def predict(self, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """x W + b on the training inputs, `[N, d_out]`."""
        return self.xc @ w + (self.mean @ w + b)


def _ridge(
    solver: RidgeSolver,
    y: torch.Tensor,
    x_val: torch.Tensor,
    y_val: torch.Tensor,
    objective: Objective,
    cfg: ProbeConfig,
) -> tuple[float, torch.Tensor, torch.Tensor]:
    """(ridge, W, b): the configured ridge, or the grid's best on validation when "auto"."""
    if cfg.ridge == "auto":
        return solver.select(y, x_val, y_val, objective, cfg.ridge_grid)
    return (float(cfg.ridge), *solver.solve(y, float(cfg.ridge)))


def refine_cos(
    solver: RidgeSolver, y: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor, cfg: ProbeConfig
) -> FitInfo:
    """Linear probe for the cosine objective: closed-form start, Gauss–Newton refinement.

    Args:
        solver: factorised on the training inputs `[N, d]`; y: `[N, d_out]` targets.
        x_val, y_val: validation tokens for early stopping.
    """
    target = unit_rows(y.float())
    ridge, w, b = _ridge(solver, target, x_val, y_val, "cos", cfg)

    def val_loss(w: torch.Tensor, b: torch.Tensor) -> float:
        return float(objective_loss(x_val @ w + b, y_val, "cos"))

    best = start = val_loss(w, b)
    best_wb, bad, it = (w, b), 0, 0
    if cfg.cos_steps < 1:
        return FitInfo(Probe("linear", "cos", w, b), 0, start, start, {"ridge": ridge})
    pred = solver.predict(w, b)
    loss = float(objective_loss(pred, target, "cos"))
    for it in range(1, cfg.cos_steps + 1):  # noqa: B007 - the count is reported
        norm = torch.linalg.vector_norm(pred, dim=-1, keepdim=True).clamp_min(1e-12)
        u = pred / norm
        move = norm * (target - (u * target).sum(-1, keepdim=True) * u)  # tangential, [N, d_out]
        dw, db = solver.solve(move, ridge)
        dpred = solver.predict(dw, db)
        step, new_loss = 1.0, float("inf")
        while step >= 1 / 64:
            new_pred = pred + step * dpred
            new_loss = float(objective_loss(new_pred, target, "cos"))
            if new_loss < loss:
                break
            step /= 2
        if not new_loss < loss:
            break  # no descent left along the Gauss–Newton direction
        w, b, pred, loss = w + step * dw, b + step * db, new_pred, new_loss
        current = val_loss(w, b)
        if _improved(current, best):
            best, best_wb, bad = current, (w, b), 0
        else:
            bad += 1
            if bad >= cfg.patience:
                break
    probe = Probe("linear", "cos", best_wb[0], best_wb[1])
    return FitInfo(probe, it, start, best, {"ridge": ridge})


@dataclass(frozen=True)
class _Data:
    """Standardised inputs of one Adam fit: z = (x − μ)/σ, μ and σ from the training inputs."""

    z: torch.Tensor
    y: torch.Tensor
    z_val: torch.Tensor
    y_val: torch.Tensor
    mean: torch.Tensor
    scale: torch.Tensor

    @classmethod
    def of(
        cls, x: torch.Tensor, y: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor
    ) -> _Data:
        mean, scale = x.mean(0), x.std(0).clamp_min(1e-6)
        return cls((x - mean) / scale, y, (x_val - mean) / scale, y_val, mean, scale)

    def affine_from(self, init: Probe | None, d_out: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A linear probe re-expressed on this z, x W + b = z (σ W) + (μ W + b); zeros if None."""
        d = self.mean.numel()
        if init is None:
            return torch.zeros(d, d_out), torch.zeros(d_out)
        assert init.weight is not None and init.bias is not None
        m0 = init.in_mean if init.in_mean is not None else torch.zeros(d)
        s0 = init.in_scale if init.in_scale is not None else torch.ones(d)
        w = (self.scale / s0)[:, None] * init.weight
        return w.clone(), (((self.mean - m0) / s0) @ init.weight + init.bias).clone()


class _Adam:
    """Adam (Kingma & Ba) on a few tensors.

    Written out because constructing `torch.optim.Adam` first imports torch._dynamo
    (~800 modules, about 2 s), more than all the MLP steps of a run together.
    """

    def __init__(self, params: list[torch.Tensor], lr: float, betas=(0.9, 0.999), eps=1e-8) -> None:
        self.params, self.lr, self.betas, self.eps, self.t = params, lr, betas, eps, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1**self.t, 1 - b2**self.t
        for p, m, v in zip(self.params, self.m, self.v, strict=True):
            g = p.grad
            if g is None:
                continue
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            p.addcdiv_(m, (v / c2).sqrt_().add_(self.eps), value=-self.lr / c1)
            p.grad = None


def _adam(
    params: list[torch.Tensor],
    predict: Callable[[torch.Tensor | None], torch.Tensor],
    data: _Data,
    objective: Objective,
    cfg: ProbeConfig,
    gen: torch.Generator,
) -> tuple[int, float, float]:
    """Minibatch Adam with early stopping; `predict(rows)` on training rows, `predict(None)` on
    the validation set. Leaves `params` at the best state; returns (steps, start, best) losses."""
    for p in params:
        p.requires_grad_(True)

    def val_loss() -> float:
        with torch.no_grad():
            return float(objective_loss(predict(None), data.y_val, objective))

    best = start = val_loss()
    best_state = [p.detach().clone() for p in params]
    opt = _Adam(params, lr=cfg.lr)
    n = data.z.shape[0]
    bs = min(cfg.batch_size, n)
    perm, pos, bad, step = torch.randperm(n, generator=gen), 0, 0, 0
    for step in range(1, cfg.max_steps + 1):
        if pos + bs > n:
            perm, pos = torch.randperm(n, generator=gen), 0
        rows = perm[pos : pos + bs]
        pos += bs
        objective_loss(predict(rows), data.y[rows], objective).backward()
        opt.step()
        if step % cfg.eval_every == 0:
            current = val_loss()
            if _improved(current, best):
                best, bad = current, 0
                best_state = [p.detach().clone() for p in params]
            else:
                bad += 1
                if bad >= cfg.patience:
                    break
    with torch.no_grad():
        for p, s in zip(params, best_state, strict=True):
            p.copy_(s)
            p.requires_grad_(False)
    return step, start, best


def _fit_linear_adam(
    objective: Objective, data: _Data, cfg: ProbeConfig, gen: torch.Generator
) -> FitInfo:
    w, b = data.affine_from(None, data.y.shape[1])

    def predict(rows: torch.Tensor | None) -> torch.Tensor:
        return (data.z_val if rows is None else data.z[rows]) @ w + b

    steps, start, best = _adam([w, b], predict, data, objective, cfg, gen)
    return FitInfo(Probe("linear", objective, w, b, data.mean, data.scale), steps, start, best)


def _fit_mlp(
    objective: Objective, init: Probe | None, data: _Data, cfg: ProbeConfig, gen: torch.Generator
) -> FitInfo:
    d, d_out, h = data.z.shape[1], data.y.shape[1], cfg.mlp_width
    w1 = torch.randn(d, h, generator=gen) * (2.0 / d) ** 0.5
    b1 = torch.zeros(h)
    if init is None:  # plain MLP from a random start
        w, w2, b = None, torch.randn(h, d_out, generator=gen) * (1.0 / h) ** 0.5, torch.zeros(d_out)
        params = [w1, b1, w2, b]
    else:  # affine path at the linear probe, hidden branch silent: the start is the linear probe
        w, b = data.affine_from(init, d_out)
        w2 = torch.zeros(h, d_out)
        params = [w, b, w1, b1, w2] if cfg.mlp_train_skip else [w1, b1, w2]
    frozen = init is not None and not cfg.mlp_train_skip
    if frozen:  # the affine path does not change: compute it once
        assert w is not None
        base, base_val = data.z @ w + b, data.z_val @ w + b

    def predict(rows: torch.Tensor | None) -> torch.Tensor:
        z = data.z_val if rows is None else data.z[rows]
        branch = torch.relu(z @ w1 + b1) @ w2
        if frozen:
            return branch + (base_val if rows is None else base[rows])
        return branch + (z @ w if w is not None else 0.0) + b

    steps, start, best = _adam(params, predict, data, objective, cfg, gen)
    probe = Probe("mlp", objective, w, b, data.mean, data.scale, w1, b1, w2)
    return FitInfo(probe, steps, start, best)


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
) -> dict[tuple[ProbeKind, Objective], FitInfo]:
    """Fit the requested probes of one layer, sharing the ridge factorisation and warm starts.

    Args:
        x: `[N, d]` hidden states e^l of the training tokens; y: `[N, d_out]` their targets.
        x_val, y_val: the same for the validation tokens (early stopping only).
        kinds: (probe kind, objective) pairs to fit.
        config: fitting settings; seed: seeds every random choice.
        solver: a `RidgeSolver` already factorised on `x` (shared across calls on one layer).
    Returns:
        One `FitInfo` per requested pair, in the order of `kinds`.
    """
    cfg = config or ProbeConfig()
    x, y, x_val, y_val = (t.float() for t in (x, y, x_val, y_val))
    gen = torch.Generator().manual_seed(seed)
    vsub = _subset(x_val.shape[0], cfg.val_tokens, gen)
    if vsub is not None:
        x_val, y_val = x_val[vsub], y_val[vsub]
    sub = _subset(x.shape[0], cfg.fit_tokens, gen)
    linear: dict[Objective, FitInfo] = {}
    standardised: list[_Data] = []

    def data() -> _Data:  # built on first use: closed-form fits never need it
        if not standardised:
            xs, ys = (x, y) if sub is None else (x[sub], y[sub])
            standardised.append(_Data.of(xs, ys, x_val, y_val))
        return standardised[0]

    def linear_fit(obj: Objective) -> FitInfo:
        nonlocal solver
        if obj in linear:
            return linear[obj]
        if obj == "l2" and not cfg.linear_l2_closed_form:
            linear[obj] = _fit_linear_adam("l2", data(), cfg, gen)
            return linear[obj]
        if solver is None:
            solver = RidgeSolver(x)
        if obj == "cos":
            linear[obj] = refine_cos(solver, y, x_val, y_val, cfg)
        else:
            ridge, w, b = _ridge(solver, y, x_val, y_val, "l2", cfg)
            probe = Probe("linear", "l2", w, b)
            with torch.no_grad():
                v = float(objective_loss(probe(x_val), y_val, "l2"))
            linear[obj] = FitInfo(probe, 0, v, v, {"ridge": ridge})
        return linear[obj]

    out: dict[tuple[ProbeKind, Objective], FitInfo] = {}
    for kind, obj in kinds:
        if kind == "naive":
            same_space = x_val.shape[1] == y_val.shape[1]
            with torch.no_grad():
                v = float(objective_loss(x_val, y_val, obj)) if same_space else float("nan")
            out[(kind, obj)] = FitInfo(Probe("naive", obj), 0, v, v)
        elif kind == "linear":
            out[(kind, obj)] = linear_fit(obj)
        elif kind == "mlp":
            init = linear_fit(obj).probe if cfg.mlp_skip else None
            fit = _fit_mlp(obj, init, data(), cfg, gen)
            out[(kind, obj)] = replace(fit, extras=linear_fit(obj).extras) if cfg.mlp_skip else fit
        else:
            raise ValueError(f"unknown probe kind {kind!r}")
    return out
