"""Report text for paper Fig. 2, computed from the fit table (never written by hand).

`fit_sentences` says, per probe kind, how it was fitted, what stopped each fit and the MLP
width actually used, all read from `tables/fig2a_identifiability.csv` (columns probe,
objective, layer, optimizer, mlp_width, stopped, converged, fit_failure, late_gain, steps);
older tables without these columns get the sentences their columns back.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

STOP_WORDS = {
    "closed form": "closed form",
    "no fit": "no fit",
    "patience": "validation early stopping",
    "converged": "L-BFGS stopped moving (training optimum)",
    "max steps": "the step cap",
    "ceiling": "a validation rate of 100 % at the start (nothing to improve)",
}
PROBE_NAMES = {"naive": "naive", "linear": "linear", "mlp": "MLP"}


def _count_text(counts: pd.Series, total: int) -> str:
    parts = [f"{STOP_WORDS.get(str(k), str(k))} at {v}" for k, v in counts.items()]
    return f"{', '.join(parts)} of {total} layers"


def _widths(t: pd.DataFrame) -> str:
    if "mlp_width" not in t:
        return ""
    widths = sorted({int(w) for w in t["mlp_width"].dropna()})
    if not widths:
        return ""
    return f", {' or '.join(map(str, widths))} hidden units"


def fit_sentences(fig2: pd.DataFrame) -> list[str]:
    """One sentence per learned (probe, objective): optimiser, stop reasons, width, failures."""
    out = []
    if "stopped" not in fig2:
        return ["The table records no convergence information."]
    for (probe, objective), t in fig2.groupby(["probe", "objective"], sort=False):
        if probe == "naive":
            continue
        optimiser = (
            ", ".join(sorted({str(o) for o in t["optimizer"].dropna() if str(o)}))
            if "optimizer" in t
            else ""
        )
        text = f"{PROBE_NAMES.get(probe, probe)}-{objective}" + (
            f" ({optimiser}{_widths(t) if probe == 'mlp' else ''})" if optimiser else ""
        )
        text += f": stopped by {_count_text(t['stopped'].value_counts(), len(t))}"
        if "converged" in t and (~t["converged"].astype(bool)).any():
            bad = t[~t["converged"].astype(bool)]
            text += (
                f"; unfinished (capped while still improving, up to "
                f"{bad['late_gain'].max():.1%} over the second half) at layer(s) "
                f"{', '.join(str(int(x)) for x in bad['layer'])}"
            )
        if "fit_failure" in t and t["fit_failure"].astype(bool).any():
            bad = t[t["fit_failure"].astype(bool)]
            text += (
                f"; below the naive probe (a fitting failure, not a finding) at layer(s) "
                f"{', '.join(str(int(x)) for x in bad['layer'])}"
            )
        out.append(text)
    return out


def fit_caption(fig2: pd.DataFrame) -> str:
    """The training part of the Fig. 2 captions."""
    marks = ""
    if "converged" in fig2 and (~fig2["converged"].astype(bool)).any():
        marks += " Crosses mark unfinished fits, which the verdicts leave out."
    if "fit_failure" in fig2 and fig2["fit_failure"].astype(bool).any():
        marks += " Open circles mark MLPs below the naive probe (fitting failures), left out too."
    return "Fits: " + "; ".join(fit_sentences(fig2)) + "." + marks


def methods_counts(fig2: pd.DataFrame) -> str:
    """How many fits hit the cap, were unfinished or failed, and the largest late gain."""
    if "stopped" not in fig2 or fig2.empty:
        return ""
    capped = int((fig2["stopped"] == "max steps").sum())
    unfinished = int((~fig2["converged"].astype(bool)).sum()) if "converged" in fig2 else capped
    failures = int(fig2["fit_failure"].astype(bool).sum()) if "fit_failure" in fig2 else 0
    gain = float(fig2["late_gain"].max()) if "late_gain" in fig2 else float("nan")
    return (
        f"In this run {capped} fit(s) reached the step cap, {unfinished} of them still improving by "
        f"more than 1% over their second half (marked in the figure and left out of the verdicts); "
        f"{failures} MLP fit(s) scored below the naive probe of their layer (fitting failures, left "
        f"out); the largest fall of the best validation loss over the second half of any fit is "
        f"{gain:.2%}."
    )


def probe_protocol(p: dict[str, Any]) -> str:
    """The protocol sentence of the Methods section, from the fig2_protocol row `p`."""
    linear_start = str(p.get("mlp_init", "random")) == "linear"
    start = (
        "starting at the linear probe of its objective (pairs of hidden units carry it exactly, "
        "so the start is that probe)"
        if linear_start
        else "from a random start"
    )
    auto = "max(512, 2d)" if linear_start else "max(512, d)"
    per_layer = str(p.get("select_per_layer", "False")) == "True"
    where = (
        "at each layer"
        if per_layer
        else "at the deepest layer, and the winner is used at every layer"
    )
    return (
        "Linear probes start from the better, on the validation identification rate, of the identity "
        "(the naive probe) and the ridge least-squares fit (to unit-normalised targets for cosine; ridge "
        f"chosen from {p.get('ridge_grid', '?')} × the mean eigenvalue of the centred Gram matrix by "
        "validation loss). Linear-L2 from the ridge fit is that closed form (the exact minimiser); "
        "otherwise full-batch L-BFGS on the objective (strong-Wolfe line search, memory "
        f"{p.get('lbfgs_history', '?')}), the validation identification rate (the figure's quantity, on "
        f"the validation sequences) checked every {p.get('lbfgs_every', '?')} iterations; the fit keeps "
        f"the state with the highest one and stops when it has not risen for {p.get('cos_patience', '?')} "
        f"checks, or when L-BFGS stops moving (cap {p.get('cos_steps', '?')} iterations). Linear-cos is "
        "refined from both starts and the better-validated fit kept. MLP: the paper's plain network with "
        f"one hidden ReLU layer (width {p.get('mlp_width', '?')}; 'auto' is {auto}), {start}, minibatch "
        f"Adam (batch {p.get('batch_size', '?')}); learning rate from {p.get('lr_grid', '?')} and "
        f"decoupled weight decay from {p.get('weight_decay_grid', '?')}: every pair trains "
        f"{p.get('select_steps', '?')} steps from the same start on the same minibatches {where}, "
        "and the pair with the lowest validation loss continues; validation loss "
        f"every {p.get('eval_every', '?')} steps, after {p.get('patience', '?')} checks without a relative "
        f"improvement of 1e-4 the learning rate is multiplied by {p.get('lr_decay', '?')} from the best "
        f"state (at most {p.get('lr_decays', '?')} times), then the fit stops; cap "
        f"{p.get('max_steps', '?')} steps. Every fit keeps the best validation state seen, its start "
        "included; an MLP keeps its linear start unless it validates better. The shuffled-target "
        "control uses closed-form ridge fits."
    )


def cross_matrices(cross: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Fig. 2b as tables: one matrix (trained on layer × tested on layer) per fitting regime."""
    t = cross[(cross["probe"] == "linear") & (cross["objective"] == "cos")] if len(cross) else cross
    if t.empty:
        return []
    if "regime" not in t:
        t = t.assign(regime="converged")
    out = []
    for regime, g in t.groupby("regime", sort=False):
        matrix = g.pivot(index="train_layer", columns="test_layer", values="rate").round(3)
        matrix.columns = [f"test {c}" for c in matrix.columns]
        out.append((f"fig2b_cross_layer ({regime}; rows: trained on layer)", matrix.reset_index()))
    return out


def narrow_mlp(fig2: pd.DataFrame, d: int) -> str:
    """A deviation sentence when the MLPs of the table were narrower than the model width d."""
    if "mlp_width" not in fig2:
        return ""
    widths = sorted({int(w) for w in fig2["mlp_width"].dropna()})
    if not widths or widths[0] >= d:
        return ""
    return (
        f" The MLPs have {widths[0]} hidden units, fewer than the model's width d = {d}: they cannot "
        "represent the near-identity maps of early layers exactly."
    )


FIT_COLUMNS = (
    "layer",
    "probe",
    "objective",
    "rate",
    "ci_low",
    "ci_high",
    "optimizer",
    "mlp_width",
    "steps",
    "stopped",
    "converged",
    "fit_failure",
    "lr",
    "weight_decay",
    "ridge",
    "train_loss",
    "val_loss",
    "late_gain",
)


def tables(
    fig2: pd.DataFrame, grid: pd.DataFrame, cross: pd.DataFrame
) -> list[tuple[str, pd.DataFrame]]:
    """The tables the Fig. 2 section shows: the fit table, the grid, the Fig. 2b matrices."""
    return [
        (
            "fig2a_identifiability (rates and convergence record)",
            fig2[[c for c in FIT_COLUMNS if c in fig2]],
        ),
        ("fig2a_grid (hyperparameters tried on validation)", grid),
        *cross_matrices(cross),
    ]
