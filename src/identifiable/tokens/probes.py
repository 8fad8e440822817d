"""Probes ĝ_l from the hidden states of layer l into the space of e^0 (paper §4.1).

Kinds: naive (identity), linear (affine), MLP (one hidden ReLU layer). Objectives:
L2 (squared Euclidean distance, evaluated with the Euclidean distance) and cosine
(1 − cos, evaluated with the cosine distance). This module holds the probe, its
settings and the losses; `identifiable.tokens.fitting` fits them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

ProbeKind = Literal["naive", "linear", "mlp"]
Objective = Literal["l2", "cos"]
PROBE_KINDS: tuple[ProbeKind, ...] = ("naive", "linear", "mlp")
OBJECTIVES: tuple[Objective, ...] = ("l2", "cos")


@dataclass(frozen=True)
class ProbeConfig:
    """How probes are fitted (defaults sized so that fitting costs less than extraction on 2 CPU cores).

    Attributes:
        ridge: relative ridge of the closed-form fits, λ = ridge · mean eigenvalue of
            X_cᵀX_c (tiny by default: plain least squares, kept well posed). "auto" takes
            the value of `ridge_grid` with the lowest validation loss per layer and
            objective. It lowers the loss but, on MiniLM with 8k tokens, also the
            identification rate (shrinking towards the mean makes the tokens of a
            sequence harder to tell apart), so it is not the default.
        linear_l2_closed_form: False fits linear-L2 with Adam instead (for checking).
        cos_steps: Gauss–Newton iterations refining linear-cos from its closed-form start.
        mlp_width: hidden width h of the MLP.
        mlp_skip: MLP = affine path at the linear probe + hidden ReLU branch (W₂ = 0 at
            the start); False: a plain one-hidden-layer MLP from a random start.
        mlp_train_skip: also train the affine path with Adam (costlier); by default it
            stays at the linear probe and Adam trains the hidden branch on what is left.
        lr, max_steps, batch_size: Adam settings of the MLP (and of iterative linear-L2).
        eval_every, patience: validation checks for early stopping (every `eval_every`
            Adam steps, or every Gauss–Newton iteration); stop after `patience` checks
            without improvement and keep the best state seen.
        fit_tokens: cap on training tokens for the Adam fits (a random subset; None: all).
        val_tokens: cap on validation tokens used for early stopping.
    """

    ridge: float | Literal["auto"] = 1e-6
    ridge_grid: tuple[float, ...] = (1e-6, 1e-4, 1e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)
    linear_l2_closed_form: bool = True
    cos_steps: int = 3
    mlp_width: int = 128
    mlp_skip: bool = True
    mlp_train_skip: bool = False
    lr: float = 1e-3
    max_steps: int = 50
    batch_size: int = 512
    eval_every: int = 5
    patience: int = 1
    fit_tokens: int | None = None
    val_tokens: int = 1024


@dataclass(frozen=True)
class Probe:
    """A fitted probe; call it on `[..., d]` hidden states to get `[..., d_out]`.

    Stored as ĝ(x) = z W + b (+ relu(z W₁ + b₁) W₂ for the MLP), z = (x − μ)/σ
    (μ, σ None: z = x).
    """

    kind: ProbeKind
    objective: Objective
    weight: torch.Tensor | None = None  # [d, d_out] W (None for naive or a plain MLP)
    bias: torch.Tensor | None = None  # [d_out] b
    in_mean: torch.Tensor | None = None  # [d] μ
    in_scale: torch.Tensor | None = None  # [d] σ
    hidden_in: torch.Tensor | None = None  # [d, h] W₁
    hidden_bias: torch.Tensor | None = None  # [h] b₁
    hidden_out: torch.Tensor | None = None  # [h, d_out] W₂

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "naive":
            return x
        z = (
            x
            if self.in_mean is None or self.in_scale is None
            else (x - self.in_mean) / self.in_scale
        )
        y = z @ self.weight if self.weight is not None else 0.0
        if self.hidden_in is not None:
            y = y + torch.relu(z @ self.hidden_in + self.hidden_bias) @ self.hidden_out
        return y + self.bias if self.bias is not None else y  # type: ignore[return-value]


@dataclass(frozen=True)
class FitInfo:
    """A probe and how its fit went (losses on the validation tokens)."""

    probe: Probe
    steps: int = 0
    val_loss_start: float = float("nan")
    val_loss: float = float("nan")
    extras: dict[str, float] = field(default_factory=dict)


def objective_loss(pred: torch.Tensor, target: torch.Tensor, objective: Objective) -> torch.Tensor:
    """Mean over tokens of ‖p − y‖² (l2) or 1 − cos(p, y) (cos). `pred`, `target`: `[N, d]`."""
    if objective == "l2":
        return (pred - target).pow(2).sum(-1).mean()
    return (1.0 - torch.nn.functional.cosine_similarity(pred, target, dim=-1, eps=1e-8)).mean()


def unit_rows(y: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit length, `[N, d]`."""
    return y / torch.linalg.vector_norm(y, dim=-1, keepdim=True).clamp_min(1e-12)
