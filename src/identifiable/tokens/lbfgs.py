"""Full-batch L-BFGS refinement of a linear probe, with validation early stopping.

The cosine objective of a linear probe, mean_i 1 − cos(x_i W + b, y_i), is smooth and
has 148k parameters on MiniLM (d = 384): a quasi-Newton method on the full training set
converges where minibatch Adam from the closed-form start never left it (on MiniLM every
Adam setting ended at the start's validation loss). `torch.optim.LBFGS` with the
strong-Wolfe line search runs `lbfgs_every` iterations between validation checks; the
best state seen (the start included) is kept. "Best" is by the validation `score` when the
caller gives one (Fig. 2 passes the validation identification rate, the quantity the figure
reports: on MiniLM's last layer the validation cosine loss rises after 7 iterations while
the validation and test rates keep rising, 0.77 → 0.90 and 0.75 → 0.87), else by the
validation loss. Why a fit ends (`FitInfo.stopped`):
- "patience": over the last `cos_patience` checks the best validation score did not rise
  (or, without a score, the best validation loss improved by less than a relative
  `cos_tol`); with `cos_patience=None` there is no early stopping: the fit runs until
  L-BFGS stops moving, and still keeps the best validation state;
- "converged": the optimiser stopped moving (the training loss changed by less than a
  relative 1e-7 between two checks);
- "max steps": the iteration cap `cos_steps` (the record says whether it was still improving);
- "ceiling": the start already scores 1 (every validation token identified), so no state
  can be kept over it and no iteration runs.

The inputs are centred with the training mean (x − μ) W + b′, which leaves the model
unchanged and spares the line search the bias's scale.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from identifiable.tokens.probes import FitInfo, Objective, Probe, ProbeConfig, objective_loss
from identifiable.utils.threads import single_threaded

RELATIVE_IMPROVEMENT = 1e-4  # a real improvement of the validation loss, not rounding
STALL = 1e-7  # relative change of the training loss below which the optimiser has stopped
SCORE_CEILING = 1.0  # a validation rate of 100 %: no state can score higher

Score = Callable[[torch.Tensor], float]  # validation predictions [N_val, d_out] → higher is better


def improved(current: float, best: float) -> bool:
    """Whether `current` is a real (relative 1e-4) improvement on `best`."""
    return current < best - (RELATIVE_IMPROVEMENT * abs(best) + 1e-8)


@single_threaded
def refine_linear(
    x: torch.Tensor,
    y: torch.Tensor,
    x_val: torch.Tensor,
    y_val: torch.Tensor,
    objective: Objective,
    start: Probe,
    cfg: ProbeConfig,
    score: Score | None = None,
) -> FitInfo:
    """Refine the linear probe `start` on the exact objective by full-batch L-BFGS, on one
    intra-op thread (`identifiable.utils.threads.one_thread`).

    Args:
        x: `[N, d]` training inputs; y: `[N, d_out]` targets (raw: cosine ignores norms);
        x_val, y_val: validation tokens for early stopping.
        objective: "cos" (the Fig. 2 use) or "l2" (a check against the closed form).
        start: a linear probe on raw inputs (`in_mean`/`in_scale` None).
        cfg: `cos_steps` (cap), `lbfgs_every`, `lbfgs_history`, `cos_patience`, `cos_tol`.
        score: validation score of predictions `[N_val, d_out]` (higher is better) that
            chooses the kept state and drives patience; None: the validation loss does.
    Returns:
        The best probe seen on validation and its convergence record; `steps` counts
        L-BFGS iterations, `extras["evaluations"]` the loss-and-gradient evaluations and,
        with `score`, `extras["val_score_start"]`/`extras["val_score"]`.
    """
    mean = x.mean(0)
    xc, xc_val = x - mean, x_val - mean
    w, b = _centred_parameters(start, mean)

    def check() -> tuple[float, float, float]:
        """(training loss, validation loss, validation score: −loss without `score`)."""
        with torch.no_grad():
            pred_val = xc_val @ w + b
            val = float(objective_loss(pred_val, y_val, objective))
            train = float(objective_loss(xc @ w + b, y, objective))
        return train, val, score(pred_val) if score is not None else -val

    train, start_val, start_score = check()
    best = _Best(start_val, start_score, train, (w.detach().clone(), b.detach().clone()))
    curve = [(0, train, start_val)]
    if cfg.cos_steps < 1:
        return _record(start, 0, start_val, best, "closed form", curve, 0, score, start_score)
    if score is not None and start_score >= SCORE_CEILING:  # nothing can validate better
        return _record(start, 0, start_val, best, "ceiling", curve, 0, score, start_score)
    every = max(1, min(cfg.lbfgs_every, cfg.cos_steps))
    opt = _lbfgs([w, b], every, cfg.lbfgs_history)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = objective_loss(xc @ w + b, y, objective)
        loss.backward()
        return loss

    steps, stopped, history = 0, "max steps", [best.score]
    while steps < cfg.cos_steps:
        opt.step(closure)
        steps = int(opt.state[w].get("n_iter", steps + every))
        previous_train = train
        train, val, val_score = check()
        curve.append((steps, train, val))
        if _better(val_score, best.score, score is not None):
            best = _Best(val, val_score, train, (w.detach().clone(), b.detach().clone()))
        history.append(best.score)
        if abs(previous_train - train) <= STALL * abs(previous_train):
            stopped = "converged"
            break
        window = cfg.cos_patience
        if (
            window
            and len(history) > window
            and _stalled(history[-window - 1], best.score, cfg, score is not None)
        ):
            stopped = "patience"
            break
    evaluations = int(opt.state[w].get("func_evals", 0))
    w_best, b_best = best.state
    probe = Probe("linear", objective, w_best, b_best - mean @ w_best)
    return _record(probe, steps, start_val, best, stopped, curve, evaluations, score, start_score)


def _centred_parameters(start: Probe, mean: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(W, b′) of `start` for centred inputs (x − μ) W + b′, as trainable leaf tensors.

    Contiguous copies: L-BFGS flattens gradients with view(-1), which fails on the
    transposed layout a Cholesky solve returns."""
    assert start.weight is not None and start.bias is not None
    w = start.weight.detach().clone(memory_format=torch.contiguous_format)
    b = (start.bias + mean @ start.weight).detach().clone(memory_format=torch.contiguous_format)
    return w.requires_grad_(True), b.requires_grad_(True)


@dataclass(frozen=True)
class _Best:
    """The kept state of a refinement: its validation loss and score, training loss, (W, b)."""

    val: float
    score: float
    train: float
    state: tuple[torch.Tensor, torch.Tensor]


def _better(current: float, best: float, scored: bool) -> bool:
    """A caller's score must rise (one more validation token identified counts); a loss
    (score = −loss) must fall by a real relative 1e-4 (`improved`)."""
    return current > best if scored else improved(-current, -best)


def _stalled(before: float, best: float, cfg: ProbeConfig, scored: bool) -> bool:
    """Patience ran out: the best score did not rise over the window (with a caller's score),
    or the best loss fell by less than a relative `cos_tol`."""
    if scored:
        return best <= before
    return (-before) - (-best) < cfg.cos_tol * (-best)


def _lbfgs(params: list[torch.Tensor], every: int, history: int) -> torch.optim.LBFGS:
    """L-BFGS taking `every` iterations per `step`, with a strong-Wolfe line search and no
    tolerance of its own (`refine_linear` decides when to stop)."""
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
    best: _Best,
    stopped: str,
    curve: list[tuple[int, float, float]],
    evaluations: int,
    score: Score | None,
    start_score: float,
) -> FitInfo:
    extras = {"evaluations": float(evaluations)}
    if score is not None:
        extras |= {"val_score_start": start_score, "val_score": best.score}
    return FitInfo(
        probe,
        steps,
        start,
        best.val,
        extras,
        best.train,
        stopped,
        tuple(curve),
        optimizer="closed form" if stopped == "closed form" else "L-BFGS",
    )
