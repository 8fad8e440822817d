"""Minibatch Adam for the MLP probes, with a learning-rate schedule and validation early stopping.

The MLP (the paper's plain one-hidden-layer ReLU network, ĝ(x) = relu(z W₁ + b₁) W₂ + b
with z the standardised input) has no closed form and is too costly for full-batch
L-BFGS on a CPU budget (about five times the compute of Adam to the same validation loss
on MiniLM), so it is trained by minibatch Adam with decoupled weight decay:
- every (learning rate, weight decay) of the grid trains `select_steps` steps from the same
  start on the same minibatches; the pair with the lowest validation loss continues;
- the validation loss is checked every `eval_every` steps; after `patience` checks without a
  relative improvement of 1e-4 the learning rate is multiplied by `lr_decay` (at most
  `lr_decays` times, each from the best state seen), and after the last one the fit stops
  ("patience"). A fit that reaches `max_steps` first is recorded as "max steps";
- the best state seen (the start included) is kept.
For L2 the network predicts standardised targets (y − ȳ)/s with one scalar s, which leaves
the objective unchanged up to the constant s²; for cosine it predicts y directly (a shift
would change angles). Everything random draws from generators seeded by the caller.

The minibatch products run in bfloat16 where the device multiplies it natively
(`training_dtype`: AMX or AVX-512 BF16 CPUs, CUDA GPUs with bfloat16), the weights, Adam's
state, the loss and every validation check staying float32 (mixed precision); elsewhere,
or with `ProbeConfig(adam_precision="float32")`, everything is float32.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import cast

import torch

from identifiable.tokens.lbfgs import improved
from identifiable.tokens.probes import (
    FitInfo,
    Objective,
    Probe,
    ProbeConfig,
    objective_loss,
)
from identifiable.utils.threads import single_threaded


@dataclass(frozen=True)
class Standardised:
    """Standardised inputs of one Adam fit: z = (x − μ)/σ, μ and σ from the training inputs."""

    z: torch.Tensor  # [N, d]
    y: torch.Tensor  # [N, d_out]
    z_val: torch.Tensor  # [N_val, d]
    y_val: torch.Tensor  # [N_val, d_out]
    mean: torch.Tensor  # [d]
    scale: torch.Tensor  # [d]

    @classmethod
    def of(
        cls, x: torch.Tensor, y: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor
    ) -> Standardised:
        mean, scale = x.mean(0), x.std(0).clamp_min(1e-6)
        return cls((x - mean) / scale, y, (x_val - mean) / scale, y_val, mean, scale)

    def affine_from(self, init: Probe | None, d_out: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A linear probe re-expressed on this z, x W + b = z (σ W) + (μ W + b); zeros if None."""
        d = self.mean.numel()
        if init is None:
            return self.mean.new_zeros(d, d_out), self.mean.new_zeros(d_out)
        assert init.weight is not None and init.bias is not None
        m0 = init.in_mean if init.in_mean is not None else self.mean.new_zeros(d)
        s0 = init.in_scale if init.in_scale is not None else self.mean.new_ones(d)
        w = (self.scale / s0)[:, None] * init.weight
        return w.clone(), (((self.mean - m0) / s0) @ init.weight + init.bias).clone()


def training_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The dtype of the minibatch products: bfloat16 with "bfloat16", or with "auto" where
    `device` multiplies it natively (a CPU with AMX or AVX-512 BF16, a CUDA GPU that supports
    it); float32 otherwise. The weights and every validation check stay float32."""
    if precision == "float32":
        return torch.float32
    if precision == "bfloat16":
        return torch.bfloat16
    return torch.bfloat16 if native_bfloat16(device) else torch.float32


def native_bfloat16(device: torch.device) -> bool:
    """Whether `device` multiplies bfloat16 matrices natively (faster than float32)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type != "cpu":
        return False
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


class AdamW:
    """Adam (Kingma & Ba) with decoupled weight decay on a few tensors.

    Written out because constructing `torch.optim.Adam` first imports torch._dynamo
    (~800 modules, about 2 s), more than some probe fits. The update itself is torch's fused
    AdamW kernel (`torch._fused_adamw_`, one pass over each tensor: 3 ms instead of 11 ms
    per step for the 768 → 1536 → 768 MLP on one thread) where this torch has it for the
    parameters' device, else the same formula in separate kernels. `decay` marks the
    tensors that weight decay shrinks (weight matrices, never biases). Checked against
    torch's Adam, both ways.
    """

    def __init__(
        self,
        params: list[torch.Tensor],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        decay: list[bool] | None = None,
        fused: bool = True,
    ) -> None:
        self.params, self.lr, self.betas, self.eps, self.t = params, lr, betas, eps, 0
        self.weight_decay = weight_decay
        self.decay = decay if decay is not None else [True] * len(params)
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.fused = fused and hasattr(torch, "_fused_adamw_")
        self._steps = [torch.zeros((), device=p.device) for p in params]  # the fused kernel's

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        if self.fused:
            try:
                self._fused_step()
                return
            except (RuntimeError, NotImplementedError):  # no fused kernel for this device
                self.fused = False
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

    def _fused_step(self) -> None:
        """One step of torch's fused AdamW kernel: decayed tensors, then the others."""
        for decayed in (True, False):
            group = [
                i
                for i, p in enumerate(self.params)
                if p.grad is not None and self.decay[i] == decayed
            ]
            if not group:
                continue
            for i in group:
                self._steps[i].fill_(self.t)
            torch._fused_adamw_(
                [self.params[i] for i in group],
                [cast(torch.Tensor, self.params[i].grad) for i in group],
                [self.m[i] for i in group],
                [self.v[i] for i in group],
                [],
                [self._steps[i] for i in group],
                lr=self.lr,
                beta1=self.betas[0],
                beta2=self.betas[1],
                weight_decay=self.weight_decay if decayed else 0.0,
                eps=self.eps,
                amsgrad=False,
                maximize=False,
            )
        for p in self.params:
            p.grad = None


class Net:
    """The trainable part of an MLP probe and how it predicts.

    kinds: "mlp" (relu(z W₁ + b₁) W₂ + b; random start, or at the linear probe `init`:
    `_start_at`) and "skip" (the MLP branch added
    to an affine path that starts at a given linear probe, W₂ = 0). For L2 the output is
    de-standardised: ŷ = ȳ + s·net(z).
    """

    def __init__(
        self,
        kind: str,
        data: Standardised,
        objective: Objective,
        cfg: ProbeConfig,
        gen: torch.Generator,
        init: Probe | None = None,
    ) -> None:
        d, d_out = data.z.shape[1], data.y.shape[1]
        h = cfg.width_for(d)
        dev = data.z.device  # random draws on the CPU generator, then moved: same on any device
        self.kind, self.data = kind, data
        if objective == "l2":  # standardise targets by one scalar: the L2 optimum is unchanged
            self.y_mean = data.y.mean(0)
            spread = (data.y - self.y_mean).pow(2).sum(-1).mean().sqrt().clamp_min(1e-12)
            self.y_scale = float(spread) / d_out**0.5
        else:
            self.y_mean, self.y_scale = data.y.new_zeros(d_out), 1.0
        self.w: torch.Tensor | None = None
        self.base: tuple[torch.Tensor, torch.Tensor] | None = None
        self.w1 = (torch.randn(d, h, generator=gen) * (2.0 / d) ** 0.5).to(dev)
        self.b1 = data.z.new_zeros(h)
        if kind == "mlp":
            self.w2 = (torch.randn(h, d_out, generator=gen) * (1.0 / h) ** 0.5).to(dev)
            self.b = data.z.new_zeros(d_out)
            if init is not None:
                self._start_at(init)
            self.params = [self.w1, self.b1, self.w2, self.b]
            self.decay = [True, False, True, False]
            return
        # skip: affine path at the linear probe (in standardised output units), branch silent
        w, b = data.affine_from(init, d_out)
        self.w, self.b = w / self.y_scale, (b - self.y_mean) / self.y_scale
        self.w2 = data.z.new_zeros(h, d_out)
        if cfg.mlp_train_skip:
            self.params = [self.w, self.b, self.w1, self.b1, self.w2]
            self.decay = [True, False, True, False, True]
        else:  # the affine path does not change: compute it once
            self.base = (data.z @ self.w + self.b, data.z_val @ self.w + self.b)
            self.params, self.decay = [self.w1, self.b1, self.w2], [True, False, True]

    def _start_at(self, init: Probe) -> None:
        """Start the plain MLP at the linear probe `init`: relu(u) − relu(−u) = u, so r pairs
        of hidden units (W₁ columns ±U_r, W₂ rows ±U_rᵀW) carry z U_r U_rᵀ W, with U_r the
        top r = min(rank, h/2) left singular vectors of W (in standardised units). With
        h ≥ 2d this is exactly the linear probe; the other units keep their random W₁ and
        start silent (W₂ rows 0)."""
        w, b = self.data.affine_from(init, self.w2.shape[1])
        w, b = w / self.y_scale, (b - self.y_mean) / self.y_scale
        u = torch.linalg.svd(w, full_matrices=False)[0]
        r = min(u.shape[1], self.w1.shape[1] // 2)
        u = u[:, :r]
        self.w1[:, : 2 * r] = torch.cat([u, -u], 1)
        self.b1.zero_()
        self.w2.zero_()
        self.w2[: 2 * r] = torch.cat([u.T @ w, -(u.T @ w)], 0)
        self.b = b.clone()

    def __call__(self, rows: torch.Tensor | None) -> torch.Tensor:
        """Predictions (original target units) on training `rows`, or on validation (None)."""
        z = self.data.z_val if rows is None else self.data.z[rows]
        if self.base is not None:
            out = self.base[1] if rows is None else self.base[0][rows]
        elif self.w is not None:
            out = z @ self.w + self.b
        else:
            out = self.b
        out = out + torch.relu(torch.addmm(self.b1, z, self.w1)) @ self.w2
        return self.y_mean + self.y_scale * out.float()

    def probe(self, objective: Objective) -> Probe:
        """The fitted probe, with the output standardisation folded into its weights."""
        s, m = self.y_scale, self.y_mean
        w = None if self.w is None else self.w * s
        d = self.data
        return Probe(
            "mlp", objective, w, m + s * self.b, d.mean, d.scale, self.w1, self.b1, self.w2 * s
        )


class Run:
    """One Adam run with its minibatch stream, validation checks, schedule and best state."""

    def __init__(
        self, net: Net, objective: Objective, cfg: ProbeConfig, lr: float, wd: float, seed: int
    ) -> None:
        self.net, self.objective, self.cfg = net, objective, cfg
        for p in net.params:
            p.requires_grad_(True)
        self.opt = AdamW(net.params, lr=lr, weight_decay=wd, decay=net.decay)
        self.dtype = training_dtype(cfg.adam_precision, net.data.z.device)
        self.gen = torch.Generator().manual_seed(seed)  # same minibatches for every grid point
        self.n = net.data.z.shape[0]
        self.bs = min(cfg.batch_size, self.n)
        self.perm, self.pos = torch.randperm(self.n, generator=self.gen), 0
        self.step = 0
        self.start = self.best = self.val_loss()
        self.best_state = [p.detach().clone() for p in net.params]
        self.curve: list[tuple[int, float, float]] = [(0, float("nan"), self.start)]
        self.bad, self.decays = 0, 0
        self.stopped = "max steps"
        self._train_sum, self._train_count = 0.0, 0

    def val_loss(self) -> float:
        with torch.no_grad():
            return float(objective_loss(self.net(None), self.net.data.y_val, self.objective))

    def _minibatch(self) -> None:
        if self.pos + self.bs > self.n:
            self.perm, self.pos = torch.randperm(self.n, generator=self.gen), 0
        rows = self.perm[self.pos : self.pos + self.bs]
        self.pos += self.bs
        with self._precision():
            pred = self.net(rows)
        loss = objective_loss(pred, self.net.data.y[rows], self.objective)
        loss.backward()
        self.opt.step()
        self.step += 1
        self._train_sum += float(loss.detach())
        self._train_count += 1

    def _precision(self) -> contextlib.AbstractContextManager[object]:
        """bfloat16 products under autocast, or nothing (autocast refuses some devices, e.g.
        meta, even when disabled)."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.net.data.z.device.type, self.dtype)

    def _plateau(self) -> bool:
        """Patience ran out: lower the learning rate from the best state, or stop (True)."""
        if self.decays >= self.cfg.lr_decays:
            self.stopped = "patience"
            return True
        self.decays += 1
        self.bad = 0
        self.opt.lr *= self.cfg.lr_decay
        with torch.no_grad():
            for p, s in zip(self.net.params, self.best_state, strict=True):
                p.copy_(s)
        return False

    def train(self, until: int, early_stop: bool) -> None:
        """Adam steps up to step `until` (checking validation every `eval_every` steps)."""
        while self.step < until:
            self._minibatch()
            if self.step % self.cfg.eval_every and self.step != until:
                continue
            current = self.val_loss()
            self.curve.append((self.step, self._train_sum / self._train_count, current))
            self._train_sum, self._train_count = 0.0, 0
            if improved(current, self.best):
                self.best, self.bad = current, 0
                self.best_state = [p.detach().clone() for p in self.net.params]
            else:
                self.bad += 1
                if early_stop and self.bad >= self.cfg.patience and self._plateau():
                    return

    def finish(self) -> tuple[float, float]:
        """Restore the best state; returns (training loss on every training token, val loss)."""
        with torch.no_grad():
            for p, s in zip(self.net.params, self.best_state, strict=True):
                p.copy_(s)
                p.requires_grad_(False)
            rows = torch.arange(self.n, device=self.net.data.z.device)
            train = float(objective_loss(self.net(rows), self.net.data.y, self.objective))
        return train, self.best


@single_threaded
def fit_adam(
    kind: str,
    objective: Objective,
    data: Standardised,
    cfg: ProbeConfig,
    seed: int,
    init: Probe | None = None,
) -> FitInfo:
    """Grid selection on validation (`select_steps` each), then the winner trains to convergence
    (on one intra-op thread, see `one_thread`)."""
    grid = cfg.adam_grid()
    best_run: Run | None = None
    best_hp: tuple[float, float] = grid[0]
    tried: list[tuple[dict[str, float], float]] = []
    select = min(cfg.select_steps, cfg.max_steps) if len(grid) > 1 else 0
    for lr, wd in grid:
        gen = torch.Generator().manual_seed(seed)  # same start for every grid point
        run = Run(Net(kind, data, objective, cfg, gen, init), objective, cfg, lr, wd, seed + 1)
        run.train(select, early_stop=False)
        tried.append(({"lr": lr, "weight_decay": wd}, run.best))
        if best_run is None or run.best < best_run.best:
            best_run, best_hp = run, (lr, wd)
    assert best_run is not None
    best_run.train(cfg.max_steps, early_stop=True)
    train, val = best_run.finish()
    return FitInfo(
        best_run.net.probe(objective),
        best_run.step,
        best_run.start,
        val,
        {"lr": best_hp[0], "weight_decay": best_hp[1], "lr_decays": float(best_run.decays)},
        train,
        best_run.stopped,
        tuple(best_run.curve),
        tuple(tried),
        optimizer="Adam",
        width=best_run.net.w1.shape[1],
    )
