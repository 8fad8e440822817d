"""Probes ĝ_l from the hidden states of layer l into the space of e^0 (paper §4.1).

Kinds: naive (identity), linear (affine), MLP (one hidden ReLU layer). Objectives:
L2 (squared Euclidean distance, evaluated with the Euclidean distance) and cosine
(1 − cos, evaluated with the cosine distance). This module holds the probe, its
settings and the losses; `identifiable.tokens.fitting` fits them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import torch

from identifiable.errors import IdentifiableError
from identifiable.utils.checks import collection, count, number

ProbeKind = Literal["naive", "linear", "mlp"]
Objective = Literal["l2", "cos"]
PROBE_KINDS: tuple[ProbeKind, ...] = ("naive", "linear", "mlp")
OBJECTIVES: tuple[Objective, ...] = ("l2", "cos")


@dataclass(frozen=True)
class ProbeConfig:
    """How probes are fitted: the protocol the report states (see docs/token_identifiability.md).

    Every learned probe is fitted on the training sequences; every choice (ridge, learning
    rate, weight decay, when to stop) is made on the validation sequences, never on test.

    Attributes:
        ridge: weight decay of the closed-form linear fits, relative to the mean eigenvalue
            of X_cᵀX_c (λ = ridge · mean eigenvalue). "auto" (default) takes the value of
            `ridge_grid` with the lowest validation loss, per layer and objective.
        ridge_grid: the ridges tried by "auto".
        linear_l2_closed_form: False fits linear-L2 by L-BFGS from zero instead (a check).
        identity_start: the identity (the naive probe) is a start of the linear fits beside
            the ridge fit, where e^l and the targets share a space (False: the ridge fit
            only; the shuffled-target control, whose targets the identity cannot fit).
        cos_steps: cap on the L-BFGS iterations that refine a linear probe from its start
            (0: keep the start).
        lbfgs_every: L-BFGS iterations between two validation checks.
        lbfgs_history: L-BFGS memory (pairs of steps and gradient changes).
        cos_patience, cos_tol: the L-BFGS fit stops when its best validation loss improved
            by less than a relative `cos_tol` over the last `cos_patience` checks; None:
            no early stopping (the fit runs until L-BFGS stops moving; the kept state is
            still the best one on validation).
        mlp_width: hidden width h of the MLP (one hidden ReLU layer); "auto" (default):
            max(512, 2d) for inputs of width d with `mlp_init="linear"` (d pairs of units
            carry the linear probe exactly), max(512, d) with "random".
        mlp_init: where the plain MLP's Adam training starts. "linear" (default): at the
            linear probe of the same objective, carried by pairs of hidden units
            (relu(u) − relu(−u) = u), so the MLP starts where the linear probe ends and
            early stopping keeps the start unless Adam beats it on validation; on MiniLM
            every quick-budget MLP fit then ends by patience within its cap, where 9 of 12
            random starts were still improving at 1,000 steps. "random": He-initialised W₁,
            random W₂ (the older protocol).
        mlp_skip: False (default, the paper's probe): a plain one-hidden-layer MLP from a
            random start. True: affine path at the linear probe + hidden ReLU branch
            (W₂ = 0 at the start), an option for comparison.
        mlp_train_skip: with `mlp_skip`, also train the affine path with Adam.
        lr_grid, weight_decay_grid: Adam learning rates and decoupled weight decays tried
            for every MLP fit; each pair trains `select_steps` steps from the same start on
            the same minibatches, and the pair with the lowest validation loss continues.
        lr, weight_decay: fix them instead of searching the grid (None: search).
        select_steps: steps each grid point trains before the choice.
        select_per_layer: choose (lr, weight decay) at every layer (default: from the
            linear start the best learning rate differs by depth on MiniLM, 1e-3 at layer 0
            and 1e-2 at layer 5); False chooses once per probe kind on the deepest probed
            layer and reuses the choice at every layer.
        max_steps: cap on Adam steps of one fit (the selection steps included).
        batch_size: Adam minibatch size.
        eval_every, patience: the validation loss is checked every `eval_every` Adam
            steps; after `patience` checks without a relative improvement of 1e-4 the
            learning rate is multiplied by `lr_decay` (from the best state), at most
            `lr_decays` times; the next time patience runs out the fit stops, keeping the
            best state seen. A fit that hits `max_steps` instead is reported as stopped by
            the cap.
        adam_precision: the dtype of the Adam minibatch products. "auto" (default):
            bfloat16 where the device multiplies it natively (AMX or AVX-512 BF16 CPUs,
            CUDA GPUs), else float32; "float32" or "bfloat16" to fix it. The weights,
            Adam's state, the losses and every validation check are float32 either way.
        fit_tokens: cap on training tokens for the Adam fits (a random subset; None: all).
        val_tokens: cap on validation tokens for the Adam fits' selection and early
            stopping (a random subset); the full-batch linear fits use all of them.
    """

    ridge: float | Literal["auto"] = "auto"
    ridge_grid: tuple[float, ...] = (1e-6, 1e-4, 1e-3, 1e-2, 0.1)
    linear_l2_closed_form: bool = True
    identity_start: bool = True
    cos_steps: int = 500
    lbfgs_every: int = 5
    lbfgs_history: int = 20
    cos_patience: int | None = 4
    cos_tol: float = 1e-3
    mlp_width: int | Literal["auto"] = "auto"
    mlp_init: Literal["linear", "random"] = "linear"
    mlp_skip: bool = False
    mlp_train_skip: bool = False
    lr_grid: tuple[float, ...] = (1e-3, 1e-2)
    weight_decay_grid: tuple[float, ...] = (0.1,)
    lr: float | None = None
    weight_decay: float | None = None
    select_steps: int = 100
    select_per_layer: bool = True
    max_steps: int = 6000
    batch_size: int = 256
    eval_every: int = 25
    patience: int = 5
    lr_decay: float = 0.2
    lr_decays: int = 2
    adam_precision: Literal["auto", "float32", "bfloat16"] = "auto"
    fit_tokens: int | None = None
    val_tokens: int = 2048

    def __post_init__(self) -> None:
        """One line for a setting no fit can use (checked when the config is made)."""
        if self.ridge != "auto":
            number(self.ridge, "ridge")
        for grid in ("ridge_grid", "lr_grid", "weight_decay_grid"):
            for value in collection(getattr(self, grid), grid, "a tuple of numbers ≥ 0"):
                number(value, grid)
        for name in ("lbfgs_every", "lbfgs_history", "max_steps", "batch_size", "eval_every"):
            count(getattr(self, name), name)
        for name in ("cos_steps", "select_steps", "patience", "lr_decays"):
            count(getattr(self, name), name, minimum=0)
        if self.mlp_width != "auto":
            count(self.mlp_width, "mlp_width")
        if self.adam_precision not in ("auto", "float32", "bfloat16"):
            raise IdentifiableError(
                "adam_precision= takes 'auto', 'float32' or 'bfloat16', "
                f"got {self.adam_precision!r}"
            )
        if self.mlp_init not in ("linear", "random"):
            raise IdentifiableError(f"mlp_init= takes 'linear' or 'random', got {self.mlp_init!r}")

    def adam_grid(self) -> list[tuple[float, float]]:
        """(learning rate, weight decay) pairs an Adam fit chooses from."""
        lrs = (self.lr,) if self.lr is not None else self.lr_grid
        wds = (self.weight_decay,) if self.weight_decay is not None else self.weight_decay_grid
        return [(lr, wd) for lr in lrs for wd in wds]

    def width_for(self, d: int) -> int:
        """The MLP's hidden width for inputs of width `d`."""
        if self.mlp_width != "auto":
            return int(self.mlp_width)
        return max(512, 2 * int(d) if self.mlp_init == "linear" else int(d))


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

    def to(self, device: str | torch.device) -> Probe:
        """The same probe with its tensors on `device`."""
        moved = {
            f: getattr(self, f).to(device) for f in _TENSOR_FIELDS if getattr(self, f) is not None
        }
        return replace(self, **moved)

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
            assert self.hidden_bias is not None and self.hidden_out is not None
            y = y + torch.relu(z @ self.hidden_in + self.hidden_bias) @ self.hidden_out
        return y + self.bias if self.bias is not None else y  # type: ignore[return-value]


_TENSOR_FIELDS = (
    "weight",
    "bias",
    "in_mean",
    "in_scale",
    "hidden_in",
    "hidden_bias",
    "hidden_out",
)
STILL_IMPROVING = 0.01  # a capped fit whose late gain exceeds this had not converged


@dataclass(frozen=True)
class FitInfo:
    """A probe and its convergence record (losses are the objective's, on the named tokens).

    Attributes:
        probe: the fitted probe.
        steps: Adam steps or L-BFGS iterations taken (0 for a closed form).
        val_loss_start: validation loss at the start of the fit.
        val_loss: validation loss of the kept (best) state.
        extras: the hyperparameters chosen (ridge, lr, weight_decay, lr_decays) and counts
            (evaluations: L-BFGS loss-and-gradient evaluations).
        train_loss: training loss of the kept state, on all training tokens used.
        stopped: why the fit ended: "closed form", "no fit" (naive), "patience" (no
            validation improvement for the stated number of checks, after the last
            learning-rate decay for Adam), "converged" (L-BFGS stopped moving: the training
            loss changed by less than a relative 1e-7 between checks) or "max steps"
            (the cap; see `converged`).
        curve: (step, train_loss, val_loss) at every check; train_loss of an Adam check is
            the mean minibatch loss since the previous check.
        grid: (hyperparameters, validation loss) of every setting tried in selection.
        optimizer: "closed form", "L-BFGS", "Adam" or "" (naive).
        width: hidden units of an MLP (None for the other kinds).
    """

    probe: Probe
    steps: int = 0
    val_loss_start: float = float("nan")
    val_loss: float = float("nan")
    extras: dict[str, float] = field(default_factory=dict)
    train_loss: float = float("nan")
    stopped: str = ""
    curve: tuple[tuple[int, float, float], ...] = ()
    grid: tuple[tuple[dict[str, float], float], ...] = ()
    optimizer: str = ""
    width: int | None = None

    def late_gain(self) -> float:
        """Relative fall of the best validation loss over the second half of the fit:
        (best by step s/2 − best at the end) / best at the end; 0 for closed forms."""
        if len(self.curve) < 2:
            return 0.0
        half = self.curve[-1][0] / 2
        early = min(v for s, _, v in self.curve if s <= half)
        final = min(v for _, _, v in self.curve)
        return (early - final) / abs(final) if final else 0.0

    def converged(self) -> bool:
        """Whether the fit finished: it ended by its own criterion, or it reached the cap
        with a late gain of at most `STILL_IMPROVING` (1 %), i.e. no longer improving."""
        return self.stopped != "max steps" or self.late_gain() <= STILL_IMPROVING


def objective_loss(pred: torch.Tensor, target: torch.Tensor, objective: Objective) -> torch.Tensor:
    """Mean over tokens of ‖p − y‖² (l2) or 1 − cos(p, y) (cos). `pred`, `target`: `[N, d]`."""
    if objective == "l2":
        return (pred - target).pow(2).sum(-1).mean()
    return (1.0 - torch.nn.functional.cosine_similarity(pred, target, dim=-1, eps=1e-8)).mean()


def unit_rows(y: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit length, `[N, d]`."""
    return y / torch.linalg.vector_norm(y, dim=-1, keepdim=True).clamp_min(1e-12)
