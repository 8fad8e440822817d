"""Full-batch L-BFGS refinement of a linear probe, with validation early stopping.

The cosine objective of a linear probe, mean_i 1 − cos(x_i W + b, y_i), is smooth and
has 148k parameters on MiniLM (d = 384): a quasi-Newton method on the full training set
converges where minibatch Adam from the closed-form start never left it (on MiniLM every
Adam setting ended at the start's validation loss). `torch.optim.LBFGS` with the
strong-Wolfe line search runs `lbfgs_every` iterations between validation checks; the
best state seen (the start included) is kept. Why a fit ends (`FitInfo.stopped`):
- "patience": the best validation loss improved by less than a relative `cos_tol` over the
  last `cos_patience` checks (with `cos_patience=None` there is no early stopping: the fit
  runs until L-BFGS stops moving, and still keeps the best validation state);
- "converged": the optimiser stopped moving (the training loss changed by less than a
  relative 1e-7 between two checks);
- "max steps": the iteration cap `cos_steps` (the record says whether it was still improving).

The inputs are centred with the training mean (x − μ) W + b′, which leaves the model
unchanged and spares the line search the bias's scale.
"""

from __future__ import annotations

import torch

from identifiable.tokens.probes import FitInfo, Objective, Probe, ProbeConfig, objective_loss
from identifiable.tokens.threads import one_thread

RELATIVE_IMPROVEMENT = 1e-4  # a real improvement of the validation loss, not rounding
STALL = 1e-7  # relative change of the training loss below which the optimiser has stopped


def improved(current: float, best: float) -> bool:
    """Whether `current` is a real (relative 1e-4) improvement on `best`."""
    return current < best - (RELATIVE_IMPROVEMENT * abs(best) + 1e-8)


def refine_linear(
    x: torch.Tensor,
    y: torch.Tensor,
    x_val: torch.Tensor,
    y_val: torch.Tensor,
    objective: Objective,
    start: Probe,
    cfg: ProbeConfig,
) -> FitInfo:
    """Refine the linear probe `start` by full-batch L-BFGS on one intra-op thread
    (`identifiable.tokens.threads.one_thread`); see `_refine`."""
    with one_thread():
        return _refine(x, y, x_val, y_val, objective, start, cfg)


def _refine(
    x: torch.Tensor,
    y: torch.Tensor,
    x_val: torch.Tensor,
    y_val: torch.Tensor,
    objective: Objective,
    start: Probe,
    cfg: ProbeConfig,
) -> FitInfo:
    """Refine the linear probe `start` on the exact objective by full-batch L-BFGS.

    Args:
        x: `[N, d]` training inputs; y: `[N, d_out]` targets (raw: cosine ignores norms).
        x_val, y_val: validation tokens for early stopping.
        objective: "cos" (the Fig. 2 use) or "l2" (a check against the closed form).
        start: a linear probe on raw inputs (`in_mean`/`in_scale` None).
        cfg: `cos_steps` (iteration cap), `lbfgs_every`, `lbfgs_history`, `cos_patience`,
            `cos_tol`.
    Returns:
        The best probe seen on validation and its convergence record; `steps` counts
        L-BFGS iterations, `extras["evaluations"]` the loss-and-gradient evaluations.
    """
    assert start.weight is not None and start.bias is not None
    mean = x.mean(0)
    xc, xc_val = x - mean, x_val - mean
    # contiguous copies: L-BFGS flattens gradients with view(-1), which fails on the
    # transposed layout a Cholesky solve returns
    w = start.weight.detach().clone(memory_format=torch.contiguous_format)
    b = (start.bias + mean @ start.weight).detach().clone(memory_format=torch.contiguous_format)
    w.requires_grad_(True)
    b.requires_grad_(True)

    def losses() -> tuple[float, float]:
        with torch.no_grad():
            return (
                float(objective_loss(xc @ w + b, y, objective)),
                float(objective_loss(xc_val @ w + b, y_val, objective)),
            )

    train, start_val = losses()
    best, best_state, best_train = start_val, (w.detach().clone(), b.detach().clone()), train
    curve = [(0, train, start_val)]
    if cfg.cos_steps < 1:
        return _record(start, 0, start_val, start_val, train, "closed form", curve, 0)
    every = max(1, min(cfg.lbfgs_every, cfg.cos_steps))
    opt = _lbfgs([w, b], every, cfg.lbfgs_history)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = objective_loss(xc @ w + b, y, objective)
        loss.backward()
        return loss

    steps, stopped, bests = 0, "max steps", [best]
    while steps < cfg.cos_steps:
        opt.step(closure)
        steps = int(opt.state[w].get("n_iter", steps + every))
        previous_train = train
        train, val = losses()
        curve.append((steps, train, val))
        if improved(val, best):
            best, best_train = val, train
            best_state = (w.detach().clone(), b.detach().clone())
        bests.append(best)
        if abs(previous_train - train) <= STALL * abs(previous_train):
            stopped = "converged"
            break
        window = cfg.cos_patience
        if window and len(bests) > window and bests[-window - 1] - best < cfg.cos_tol * best:
            stopped = "patience"
            break
    evaluations = int(opt.state[w].get("func_evals", 0))
    w_best, b_best = best_state
    probe = Probe("linear", objective, w_best, b_best - mean @ w_best)
    return _record(probe, steps, start_val, best, best_train, stopped, curve, evaluations)


def _lbfgs(params: list[torch.Tensor], every: int, history: int) -> torch.optim.LBFGS:
    """L-BFGS taking `every` iterations per `step`, with a strong-Wolfe line search and no
    tolerance of its own (`_refine` decides when to stop)."""
    return torch.optim.LBFGS(
        params,
        lr=1.0,
        max_iter=every,
        max_eval=2 * every + 2,
        history_size=history,
        tolerance_grad=0.0,
        tolerance_change=0.0,
        line_search_fn="strong_wolfe",
    )


def _record(
    probe: Probe,
    steps: int,
    start: float,
    best: float,
    train: float,
    stopped: str,
    curve: list[tuple[int, float, float]],
    evaluations: int,
) -> FitInfo:
    return FitInfo(
        probe,
        steps,
        start,
        best,
        {"evaluations": float(evaluations)},
        train,
        stopped,
        tuple(curve),
        optimizer="closed form" if stopped == "closed form" else "L-BFGS",
    )
