"""Fitting the probes of one layer to convergence, every choice made on validation data.

The protocol (stated in the report and in docs/token_identifiability.md):
- linear + L2: ridge least squares in closed form (the exact minimiser, so converged by
  construction). The ridge λ = ridge · mean eigenvalue of X_cᵀX_c is the linear probe's
  weight decay; with `ridge="auto"` it is chosen from a grid by the validation loss (one
  eigendecomposition serves the whole grid). Gram matrix and solves in float64.
- linear + cos: starts at the closed-form fit to unit-normalised targets (cosine only
  sees directions; its ridge chosen on validation by the cosine loss of that start), then
  minibatch Adam on the exact loss 1 − cos, exactly as the MLP below (learning rate and
  weight decay from the grid, early stopping). The older Gauss–Newton refinement stays an
  option (`cos_optimizer="gauss-newton"`); on MiniLM it finds no descent step after a
  few iterations and stops well short of Adam's validation loss. Each iteration reuses
  the ridge factorisation: each
  asks every prediction p_i to turn towards y_i by moving ‖p_i‖ times the part of ŷ_i
  orthogonal to p̂_i and solves for the weight change by least squares, halving the step
  until the training loss falls. Early stopping on the validation loss with
  `cos_patience` iterations of patience.
- MLP (the paper's plain one-hidden-layer ReLU network, ĝ(x) = relu(z W₁ + b₁) W₂ + b
  with z the standardised input): minibatch Adam with decoupled weight decay. Every
  (learning rate, weight decay) of the grid trains `select_steps` steps from the same
  start on the same minibatches; the one with the lowest validation loss continues until
  `patience` validation checks bring no improvement. For L2 the network predicts
  standardised targets (y − ȳ)/s with one scalar s, which leaves the objective unchanged
  up to the constant s²; for cosine it predicts y directly (a shift would change angles).
  The skip variant (affine path at the linear probe, W₂ = 0) is an option (`mlp_skip`).
- Early stopping always keeps the best state seen (the start included) and records why
  the fit ended, its loss curve and its final training and validation loss.
- Everything random draws from one `torch.Generator(seed)`.
"""

from __future__ import annotations

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


def _ridge(
    solver: RidgeSolver,
    y: torch.Tensor,
    x_val: torch.Tensor,
    y_val: torch.Tensor,
    objective: Objective,
    cfg: ProbeConfig,
) -> tuple[float, torch.Tensor, torch.Tensor, tuple[tuple[dict[str, float], float], ...]]:
    """(ridge, W, b, grid): the configured ridge, or the grid's best on validation when "auto"."""
    if cfg.ridge == "auto":
        ridge, w, b, tried = solver.select(y, x_val, y_val, objective, cfg.ridge_grid)
        return ridge, w, b, tuple(({"ridge": r}, loss) for r, loss in tried)
    return (float(cfg.ridge), *solver.solve(y, float(cfg.ridge)), ())


def linear_l2(
    solver: RidgeSolver, y: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor, cfg: ProbeConfig
) -> FitInfo:
    """Linear probe for L2: the closed-form ridge fit (ridge chosen on validation with "auto")."""
    ridge, w, b, grid = _ridge(solver, y, x_val, y_val, "l2", cfg)
    probe = Probe("linear", "l2", w, b)
    with torch.no_grad():
        v = float(objective_loss(probe(x_val), y_val, "l2"))
        t = float(objective_loss(solver.predict(w, b), y.float(), "l2"))
    return FitInfo(probe, 0, v, v, {"ridge": ridge}, t, "closed form", ((0, t, v),), grid)


def refine_cos(
    solver: RidgeSolver, y: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor, cfg: ProbeConfig
) -> FitInfo:
    """Linear probe for the cosine objective: closed-form start, Gauss–Newton refinement.

    Args:
        solver: factorised on the training inputs `[N, d]`; y: `[N, d_out]` targets.
        x_val, y_val: validation tokens for the ridge choice and early stopping.
    """
    target = unit_rows(y.float())
    ridge, w, b, grid = _ridge(solver, target, x_val, y_val, "cos", cfg)

    def val_loss(w: torch.Tensor, b: torch.Tensor) -> float:
        return float(objective_loss(x_val @ w + b, y_val, "cos"))

    best = start = val_loss(w, b)
    pred = solver.predict(w, b)
    loss = float(objective_loss(pred, target, "cos"))
    best_wb, best_train, bad, it = (w, b), loss, 0, 0
    curve = [(0, loss, start)]
    stopped = "closed form" if cfg.cos_steps < 1 else "max steps"
    for it in range(1, cfg.cos_steps + 1):
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
            it -= 1
            stopped = "no descent"  # no descent left along the Gauss–Newton direction
            break
        w, b, pred, loss = w + step * dw, b + step * db, new_pred, new_loss
        current = val_loss(w, b)
        curve.append((it, loss, current))
        if _improved(current, best):
            best, best_wb, best_train, bad = current, (w, b), loss, 0
        else:
            bad += 1
            if bad >= cfg.cos_patience:
                stopped = "patience"
                break
    probe = Probe("linear", "cos", best_wb[0], best_wb[1])
    return FitInfo(
        probe, it, start, best, {"ridge": ridge}, best_train, stopped, tuple(curve), grid
    )


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
    """Adam (Kingma & Ba) with decoupled weight decay (AdamW) on a few tensors.

    Written out because constructing `torch.optim.Adam` first imports torch._dynamo
    (~800 modules, about 2 s), more than many of the probe fits together. `decay` marks
    the tensors that weight decay shrinks (weight matrices, never biases).
    """

    def __init__(
        self,
        params: list[torch.Tensor],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        decay: list[bool] | None = None,
    ) -> None:
        self.params, self.lr, self.betas, self.eps, self.t = params, lr, betas, eps, 0
        self.weight_decay = weight_decay
        self.decay = decay if decay is not None else [True] * len(params)
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1**self.t, 1 - b2**self.t
        for p, m, v, dec in zip(self.params, self.m, self.v, self.decay, strict=True):
            g = p.grad
            if g is None:
                continue
            if dec and self.weight_decay:
                p.mul_(1 - self.lr * self.weight_decay)
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            p.addcdiv_(m, (v / c2).sqrt_().add_(self.eps), value=-self.lr / c1)
            p.grad = None

    def state(self) -> list[torch.Tensor]:
        return [t.clone() for t in (*self.m, *self.v)]


class _Net:
    """The trainable part of an Adam-fitted probe and how it predicts.

    kinds: "linear" (z W + b), "mlp" (relu(z W₁ + b₁) W₂ + b) and "skip" (the MLP
    branch added to an affine path that starts at a given linear probe). For L2 the
    output is de-standardised: ŷ = ȳ + s·net(z).
    """

    def __init__(
        self,
        kind: str,
        data: _Data,
        objective: Objective,
        cfg: ProbeConfig,
        gen: torch.Generator,
        init: Probe | None = None,
    ) -> None:
        d, d_out, h = data.z.shape[1], data.y.shape[1], cfg.mlp_width
        self.kind, self.data = kind, data
        if objective == "l2":  # standardise targets by one scalar: the L2 optimum is unchanged
            self.y_mean = data.y.mean(0)
            self.y_scale = float(
                (data.y - self.y_mean).pow(2).sum(-1).mean().sqrt().clamp_min(1e-12)
            )
            self.y_scale /= d_out**0.5
        else:
            self.y_mean, self.y_scale = torch.zeros(d_out), 1.0
        self.w = self.b = self.w1 = self.b1 = self.w2 = None
        self.base: tuple[torch.Tensor, torch.Tensor] | None = None
        if kind == "linear":  # from zero, or from a given linear probe (a warm start)
            w, b = data.affine_from(init, d_out)
            self.w, self.b = w / self.y_scale, (b - self.y_mean) / self.y_scale
            self.params, self.decay = [self.w, self.b], [True, False]
            return
        self.w1 = torch.randn(d, h, generator=gen) * (2.0 / d) ** 0.5
        self.b1 = torch.zeros(h)
        if kind == "mlp":
            self.w2 = torch.randn(h, d_out, generator=gen) * (1.0 / h) ** 0.5
            self.b = torch.zeros(d_out)
            self.params, self.decay = (
                [self.w1, self.b1, self.w2, self.b],
                [True, False, True, False],
            )
            return
        # skip: affine path at the linear probe (in standardised output units), branch silent
        w, b = data.affine_from(init, d_out)
        self.w, self.b = w / self.y_scale, (b - self.y_mean) / self.y_scale
        self.w2 = torch.zeros(h, d_out)
        if cfg.mlp_train_skip:
            self.params = [self.w, self.b, self.w1, self.b1, self.w2]
            self.decay = [True, False, True, False, True]
        else:  # the affine path does not change: compute it once
            self.base = (data.z @ self.w + self.b, data.z_val @ self.w + self.b)
            self.params, self.decay = [self.w1, self.b1, self.w2], [True, False, True]

    def __call__(self, rows: torch.Tensor | None) -> torch.Tensor:
        """Predictions (original target units) on training `rows`, or on validation (None)."""
        z = self.data.z_val if rows is None else self.data.z[rows]
        if self.base is not None:
            out = self.base[1] if rows is None else self.base[0][rows]
        elif self.w is not None:
            out = z @ self.w + self.b
        else:
            out = self.b
        if self.w1 is not None:
            out = out + torch.relu(z @ self.w1 + self.b1) @ self.w2
        return self.y_mean + self.y_scale * out

    def probe(self, objective: Objective) -> Probe:
        """The fitted probe, with the output standardisation folded into its weights."""
        s, m = self.y_scale, self.y_mean
        w = None if self.w is None else self.w * s
        b = m + s * self.b if self.b is not None else m
        w2 = None if self.w2 is None else self.w2 * s
        kind: ProbeKind = "linear" if self.kind == "linear" else "mlp"
        d = self.data
        return Probe(kind, objective, w, b, d.mean, d.scale, self.w1, self.b1, w2)


class _Run:
    """One Adam run with its minibatch stream, validation checks and best state."""

    def __init__(
        self, net: _Net, objective: Objective, cfg: ProbeConfig, lr: float, wd: float, seed: int
    ) -> None:
        self.net, self.objective, self.cfg = net, objective, cfg
        for p in net.params:
            p.requires_grad_(True)
        self.opt = _Adam(net.params, lr=lr, weight_decay=wd, decay=net.decay)
        self.gen = torch.Generator().manual_seed(seed)  # same minibatches for every grid point
        self.n = net.data.z.shape[0]
        self.bs = min(cfg.batch_size, self.n)
        self.perm, self.pos = torch.randperm(self.n, generator=self.gen), 0
        self.step = 0
        self.start = self.best = self.val_loss()
        self.best_state = [p.detach().clone() for p in net.params]
        self.curve: list[tuple[int, float, float]] = [(0, float("nan"), self.start)]
        self.bad = 0
        self.stopped = "max steps"
        self._train_sum, self._train_count = 0.0, 0

    def val_loss(self) -> float:
        with torch.no_grad():
            return float(objective_loss(self.net(None), self.net.data.y_val, self.objective))

    def train(self, until: int, early_stop: bool) -> None:
        """Adam steps up to step `until` (checking validation every `eval_every` steps)."""
        data = self.net.data
        while self.step < until:
            if self.pos + self.bs > self.n:
                self.perm, self.pos = torch.randperm(self.n, generator=self.gen), 0
            rows = self.perm[self.pos : self.pos + self.bs]
            self.pos += self.bs
            loss = objective_loss(self.net(rows), data.y[rows], self.objective)
            loss.backward()
            self.opt.step()
            self.step += 1
            self._train_sum += float(loss.detach())
            self._train_count += 1
            if self.step % self.cfg.eval_every == 0 or self.step == until:
                current = self.val_loss()
                self.curve.append((self.step, self._train_sum / self._train_count, current))
                self._train_sum, self._train_count = 0.0, 0
                if _improved(current, self.best):
                    self.best, self.bad = current, 0
                    self.best_state = [p.detach().clone() for p in self.net.params]
                else:
                    self.bad += 1
                    if early_stop and self.bad >= self.cfg.patience:
                        self.stopped = "patience"
                        return

    def finish(self) -> tuple[float, float]:
        """Restore the best state; returns (training loss on every training token, val loss)."""
        with torch.no_grad():
            for p, s in zip(self.net.params, self.best_state, strict=True):
                p.copy_(s)
                p.requires_grad_(False)
            rows = torch.arange(self.n)
            train = float(objective_loss(self.net(rows), self.net.data.y, self.objective))
        return train, self.best


def _fit_adam(
    kind: str,
    objective: Objective,
    data: _Data,
    cfg: ProbeConfig,
    seed: int,
    init: Probe | None = None,
) -> FitInfo:
    """Grid selection on validation (`select_steps` each), then the winner trains to convergence."""
    grid = cfg.adam_grid()
    init_seed = seed
    best_run: _Run | None = None
    best_hp: tuple[float, float] = grid[0]
    tried: list[tuple[dict[str, float], float]] = []
    select = min(cfg.select_steps, cfg.max_steps) if len(grid) > 1 else 0
    for lr, wd in grid:
        gen = torch.Generator().manual_seed(init_seed)  # same start for every grid point
        run = _Run(_Net(kind, data, objective, cfg, gen, init), objective, cfg, lr, wd, seed + 1)
        run.train(select, early_stop=False)
        tried.append(({"lr": lr, "weight_decay": wd}, run.best))
        if best_run is None or run.best < best_run.best:
            best_run, best_hp = run, (lr, wd)
    assert best_run is not None
    best_run.train(cfg.max_steps, early_stop=True)
    train, val = best_run.finish()
    probe = best_run.net.probe(objective)
    return FitInfo(
        probe,
        best_run.step,
        best_run.start,
        val,
        {"lr": best_hp[0], "weight_decay": best_hp[1]},
        train,
        best_run.stopped,
        tuple(best_run.curve),
        tuple(tried),
    )


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
    """Fit the requested probes of one layer, sharing the ridge factorisation.

    Args:
        x: `[N, d]` hidden states e^l of the training tokens; y: `[N, d_out]` their targets.
        x_val, y_val: the same for the validation tokens (hyperparameters, early stopping).
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
            linear[obj] = _fit_adam("linear", "l2", data(), cfg, seed)
            return linear[obj]
        if solver is None:
            solver = RidgeSolver(x)
        if obj == "l2":
            linear[obj] = linear_l2(solver, y, x_val, y_val, cfg)
        elif cfg.cos_optimizer == "adam" and cfg.cos_steps > 0:  # closed-form start, then Adam
            start = refine_cos(solver, y, x_val, y_val, replace(cfg, cos_steps=0))
            fit = _fit_adam("linear", "cos", data(), cfg, seed + 3, start.probe)
            linear[obj] = replace(
                fit, extras={**start.extras, **fit.extras}, grid=start.grid + fit.grid
            )
        else:
            linear[obj] = refine_cos(solver, y, x_val, y_val, cfg)
        return linear[obj]

    out: dict[tuple[ProbeKind, Objective], FitInfo] = {}
    for kind, obj in kinds:
        if kind == "naive":
            same_space = x_val.shape[1] == y_val.shape[1]
            with torch.no_grad():
                v = float(objective_loss(x_val, y_val, obj)) if same_space else float("nan")
                t = float(objective_loss(x, y, obj)) if same_space else float("nan")
            out[(kind, obj)] = FitInfo(Probe("naive", obj), 0, v, v, {}, t, "no fit")
        elif kind == "linear":
            out[(kind, obj)] = linear_fit(obj)
        elif kind == "mlp":
            if cfg.mlp_skip:
                init = linear_fit(obj)
                fit = _fit_adam("skip", obj, data(), cfg, seed + 7, init.probe)
                out[(kind, obj)] = replace(fit, extras={**init.extras, **fit.extras})
            else:
                out[(kind, obj)] = _fit_adam("mlp", obj, data(), cfg, seed + 7)
        else:
            raise ValueError(f"unknown probe kind {kind!r}")
    return out


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
