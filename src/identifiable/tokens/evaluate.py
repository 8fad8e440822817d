"""Token identifiability of extracted pairs: fit probes per layer, look tokens up, tabulate.

`evaluate_pairs` is pure (tensors in, tables out). For every layer l it fits the
requested probes on the training sequences, maps the test tokens' e^l through
them and looks the result up among the candidates; it also runs the shuffled-target
control and the cross-layer matrix (probe fitted on layer l, tested on every layer l').

Candidates (`candidates=`):
- "sequence" (default, the paper's): the e^0 of the tokens of the same sequence;
- "corpus": the e^0 of every test token;
- "vocabulary": the rows of a vocabulary embedding matrix you pass
  (`vocab_embeddings`, `[V, d']`). e^0 of a vocabulary id is not defined without a
  position, so in this mode probes map e^l_i to the word embedding of token i
  (position-free) and are looked up among all V rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import pandas as pd
import torch

from identifiable.errors import IdentifiableError
from identifiable.tokens.extract import TokenPairs
from identifiable.tokens.fitting import RidgeSolver, fit_probes, select_adam
from identifiable.tokens.lookup import CandidateLookup, build_lookup, lookup_summary
from identifiable.tokens.probes import (
    OBJECTIVES,
    PROBE_KINDS,
    FitInfo,
    Objective,
    Probe,
    ProbeConfig,
    ProbeKind,
)
from identifiable.tokens.split import SequenceSplit, min_tokens_for, split_by_sequence
from identifiable.utils.checks import count
from identifiable.utils.pools import available_cores
from identifiable.utils.seeds import layer_seed as derived_layer_seed
from identifiable.utils.threads import one_thread

Candidates = Literal["sequence", "corpus", "vocabulary"]
Regime = Literal["ridge start", "identity start"]
REGIMES: tuple[Regime, ...] = ("ridge start", "identity start")
_REGIME_OF = {"ridge": "ridge start", "identity": "identity start"}
CANDIDATES: tuple[Candidates, ...] = ("sequence", "corpus", "vocabulary")
Kind = tuple[ProbeKind, Objective]


def check_layers(layers: Sequence[int] | None, n_layers: int) -> list[int]:
    """Validate hidden-state indices 0..L (0 = e^0); None → 1..L."""
    if layers is None:
        return list(range(1, n_layers + 1))
    out = [int(x) for x in layers]
    bad = [x for x in out if not 0 <= x <= n_layers]
    if bad or not out:
        raise IdentifiableError(
            f"layer {bad[0] if bad else '(none)'} is out of range: valid layers are 0..{n_layers} "
            "(0 is the embedding output e^0, l the output of layer l)"
        )
    return sorted(set(out))


def _kinds(probe_kinds: Sequence[str], objectives: Sequence[str]) -> list[Kind]:
    for p in probe_kinds:
        if p not in PROBE_KINDS:
            raise IdentifiableError(f"unknown probe '{p}': choose from {', '.join(PROBE_KINDS)}")
    for o in objectives:
        if o not in OBJECTIVES:
            raise IdentifiableError(f"unknown objective '{o}': choose from {', '.join(OBJECTIVES)}")
    return [(p, o) for p in probe_kinds for o in objectives]  # type: ignore[misc]


def _kinds_list(pairs: Sequence[Sequence[str]]) -> list[Kind]:
    out: list[Kind] = []
    for k, o in pairs:
        out += _kinds([k], [o])
    return out


@dataclass(frozen=True)
class Evaluation:
    """Tidy tables of one evaluation (see `evaluate_pairs`)."""

    per_layer: pd.DataFrame
    cross_layer: pd.DataFrame
    control: pd.DataFrame
    split: SequenceSplit
    fits: pd.DataFrame = field(default_factory=pd.DataFrame)
    grid: pd.DataFrame = field(default_factory=pd.DataFrame)


@dataclass(frozen=True)
class EvaluationPlan:
    """What one evaluation runs, checked once (`plan_evaluation`); see `evaluate_pairs`."""

    kinds: tuple[Kind, ...]
    candidates: Candidates
    layers: tuple[int, ...]
    cross_layer: tuple[Kind, ...]
    regimes: tuple[Regime, ...]
    controls: tuple[Kind, ...]
    seed: int
    test_fraction: float
    val_fraction: float
    config: ProbeConfig
    select_layer: int
    test_layers: tuple[int, ...]
    record_selection: bool
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    workers: int = 1

    def adam_kinds(self) -> list[Kind]:
        """The kinds fitted with Adam (their learning rate and weight decay are chosen on
        validation): the MLPs."""
        return [k for k in self.kinds if k[0] == "mlp"]


def plan_evaluation(
    pairs: TokenPairs,
    *,
    probe_kinds: Sequence[str] = PROBE_KINDS,
    objectives: Sequence[str] = OBJECTIVES,
    candidates: Candidates = "sequence",
    layers: Sequence[int] | None = None,
    cross_layer: Sequence[Kind] = (("linear", "cos"),),
    cross_layer_regimes: Sequence[str] = REGIMES,
    controls: Sequence[Kind] = (("linear", "l2"), ("linear", "cos")),
    seed: int = 0,
    test_fraction: float = 0.2,
    val_fraction: float = 0.1,
    probe_config: ProbeConfig | None = None,
    vocab_embeddings: torch.Tensor | None = None,
    select_layer: int | None = None,
    test_layers: Sequence[int] | None = None,
    record_selection: bool = True,
    device: str | torch.device = "cpu",
    workers: int | None = None,
) -> EvaluationPlan:
    """Check the options of `evaluate_pairs` (one-line `IdentifiableError`s) and fix them."""
    if candidates not in CANDIDATES:
        raise IdentifiableError(
            f"unknown candidates '{candidates}': choose from {', '.join(CANDIDATES)}"
        )
    if candidates == "vocabulary" and vocab_embeddings is None:
        raise IdentifiableError("candidates='vocabulary' needs the vocabulary embedding matrix")
    bad_regimes = [r for r in cross_layer_regimes if r not in REGIMES]
    if bad_regimes:
        raise IdentifiableError(
            f"unknown cross-layer regime '{bad_regimes[0]}': choose from {', '.join(REGIMES)}"
        )
    kinds = _kinds(probe_kinds, objectives)
    if (
        vocab_embeddings is not None
        and candidates == "vocabulary"
        and vocab_embeddings.shape[1] != pairs.hidden_size
    ):
        kinds = [k for k in kinds if k[0] != "naive"]  # identity cannot map d to d'
    layer_list = check_layers(layers, pairs.n_layers)
    tested = layer_list if test_layers is None else check_layers(test_layers, pairs.n_layers)
    return EvaluationPlan(
        kinds=tuple(kinds),
        candidates=candidates,
        layers=tuple(layer_list),
        cross_layer=tuple(_kinds_list(cross_layer)),
        regimes=tuple(cross_layer_regimes),  # type: ignore[arg-type]
        controls=tuple(_kinds_list(controls)),
        seed=seed,
        test_fraction=test_fraction,
        val_fraction=val_fraction,
        config=probe_config or ProbeConfig(),
        select_layer=layer_list[-1] if select_layer is None else int(select_layer),
        test_layers=tuple(tested),
        record_selection=record_selection,
        device=torch.device(device),
        workers=fit_workers(workers, torch.device(device), len(layer_list)),
    )


def fit_workers(workers: int | None, device: torch.device, n_layers: int) -> int:
    """Layers fitted at once: `workers`, or by default one per intra-op thread torch may use
    (each layer's fits run on one thread, `utils.threads.one_thread`) on a CPU, one on a GPU
    (whose kernels are already parallel), never more than there are layers or cores.
    Checked by the rule of every other `workers` (`utils.checks.count`)."""
    if workers is None:
        workers = 1 if device.type != "cpu" else torch.get_num_threads()
    return max(1, min(count(workers, "workers"), n_layers, available_cores()))


@dataclass
class _Tables:
    """Rows gathered over the layers of one evaluation."""

    rows: list[dict] = field(default_factory=list)
    control: list[dict] = field(default_factory=list)
    curves: list[dict] = field(default_factory=list)
    grid: list[dict] = field(default_factory=list)
    kept: dict[tuple[str, Kind, int], tuple[Probe, FitInfo]] = field(default_factory=dict)

    def merge(self, other: _Tables) -> None:
        """Append `other`'s rows (the next layer's, in layer order)."""
        for name in ("rows", "control", "curves", "grid"):
            getattr(self, name).extend(getattr(other, name))
        self.kept |= other.kept

    def record_grid(self, layer: int, kind: Kind, fit: FitInfo) -> None:
        for hp, loss in fit.grid:
            self.grid.append(
                {
                    "layer": layer,
                    "probe": kind[0],
                    "objective": kind[1],
                    "ridge": hp.get("ridge", float("nan")),
                    "lr": hp.get("lr", float("nan")),
                    "weight_decay": hp.get("weight_decay", float("nan")),
                    "val_loss": loss,
                    "chosen": all(fit.extras.get(k) == v for k, v in hp.items()),
                }
            )

    def record_curve(self, layer: int, kind: Kind, fit: FitInfo) -> None:
        start = _start_name(kind, fit)
        self.curves += [
            {
                "layer": layer,
                "probe": kind[0],
                "objective": kind[1],
                "start": start,
                "step": step,
                "train_loss": train,
                "val_loss": val,
            }
            for step, train, val in fit.curve
        ]


@dataclass(frozen=True)
class _Setup:
    """What every layer shares: the split, targets, candidates, controls' targets, Adam settings."""

    split: SequenceSplit
    y_tr: torch.Tensor  # [N_train, d']
    y_val: torch.Tensor  # [N_val, d']
    lookup: CandidateLookup
    val_lookup: CandidateLookup  # the same candidates among the validation tokens
    x_test: torch.Tensor  # [N_test, L+1, d]
    shuffled_tr: torch.Tensor  # [N_train, d']
    shuffled_val: torch.Tensor  # [N_val, d']
    adam: dict[Kind, ProbeConfig]


def _setup(
    pairs: TokenPairs, plan: EvaluationPlan, vocab: torch.Tensor | None, tables: _Tables
) -> _Setup:
    split = split_by_sequence(
        pairs.seq_ids,
        test_fraction=plan.test_fraction,
        val_fraction=plan.val_fraction,
        seed=plan.seed,
        min_tokens=min_tokens_for(pairs.hidden_size),
    )

    def targets(rows: torch.Tensor) -> torch.Tensor:
        if plan.candidates == "vocabulary":
            assert vocab is not None
            return vocab[pairs.input_ids[rows]]
        return pairs.layer(0, rows)

    y_tr, y_val, y_te = targets(split.train), targets(split.val), targets(split.test)
    lookup, val_lookup = (
        build_lookup(plan.candidates, y, pairs.seq_ids[rows], pairs.input_ids[rows], vocab)
        for y, rows in ((y_te, split.test), (y_val, split.val))
    )
    gen = torch.Generator().manual_seed(plan.seed)
    shuffled_tr = y_tr[torch.randperm(y_tr.shape[0], generator=gen)]
    shuffled_val = y_val[torch.randperm(y_val.shape[0], generator=gen)]
    cfg = plan.config
    adam: dict[Kind, ProbeConfig] = {}
    # Adam hyperparameters: chosen on validation, once on the deepest layer (or per layer).
    if plan.adam_kinds() and not cfg.select_per_layer and len(cfg.adam_grid()) > 1:
        deepest = plan.select_layer
        x_sel, x_sel_val = pairs.layer(deepest, split.train), pairs.layer(deepest, split.val)
        for kind in plan.adam_kinds():
            sel = select_adam(x_sel, y_tr, x_sel_val, y_val, kind, config=cfg, seed=plan.seed + 17)
            if plan.record_selection:
                tables.record_grid(deepest, kind, sel)
            adam[kind] = replace(cfg, lr=sel.extras["lr"], weight_decay=sel.extras["weight_decay"])
    x_test = pairs.states[split.test].float()
    return _Setup(split, y_tr, y_val, lookup, val_lookup, x_test, shuffled_tr, shuffled_val, adam)


def _start_name(kind: Kind, fit: FitInfo) -> str:
    """Where a fit began: "identity" or "ridge" (linear), "linear" or "random" (MLP)."""
    if kind[0] == "linear":
        return "identity" if fit.extras.get("identity_start") else "ridge"
    if kind[0] == "mlp":
        return "random" if fit.width is not None and "kept_start" not in fit.extras else "linear"
    return ""


def _measure(
    setup: _Setup, layer: int, kind: Kind, fit: FitInfo, x_te: torch.Tensor
) -> dict[str, Any]:
    with torch.no_grad():
        summary = lookup_summary(setup.lookup.run(fit.probe(x_te), kind[1]))
    return {
        "layer": layer,
        "probe": kind[0],
        "objective": kind[1],
        **summary,
        "optimizer": fit.optimizer,
        "mlp_width": fit.width,
        "start": _start_name(kind, fit),
        "steps": fit.steps,
        "stopped": fit.stopped,
        "converged": fit.converged(),
        "fit_failure": False,
        "kept_start": bool(fit.extras.get("kept_start", 0.0)),
        "ridge": fit.extras.get("ridge", float("nan")),
        "lr": fit.extras.get("lr", float("nan")),
        "weight_decay": fit.extras.get("weight_decay", float("nan")),
        "lr_decays": fit.extras.get("lr_decays", float("nan")),
        "train_loss": fit.train_loss,
        "val_loss_start": fit.val_loss_start,
        "val_loss": fit.val_loss,
        "val_rate_start": fit.extras.get("val_score_start", float("nan")),
        "val_rate": fit.extras.get("val_score", float("nan")),
        "late_gain": fit.late_gain(),
    }


def _flag_failures(rows: list[dict]) -> None:
    """An MLP that identifies fewer test tokens than the naive (identity) probe of the same
    layer and objective has not been fitted: it is marked `fit_failure` (not a finding)."""
    naive = {r["objective"]: r["rate"] for r in rows if r["probe"] == "naive"}
    for r in rows:
        if r["probe"] == "mlp" and r["objective"] in naive:
            r["fit_failure"] = bool(r["rate"] < naive[r["objective"]])


def evaluate_layer(pairs: TokenPairs, plan: EvaluationPlan, setup: _Setup, layer: int) -> _Tables:
    """Fit every probe of one layer on one intra-op thread (layers may run concurrently, see
    `fit_workers`), measure it on test, run the control: the layer's rows."""
    with one_thread():
        return _evaluate_layer(pairs, plan, setup, layer)


def _evaluate_layer(pairs: TokenPairs, plan: EvaluationPlan, setup: _Setup, layer: int) -> _Tables:
    tables = _Tables()
    split, cfg, dev = setup.split, plan.config, plan.device
    x_tr, x_val = (pairs.layer(layer, rows).to(dev) for rows in (split.train, split.val))
    x_te = setup.x_test[:, layer]
    layer_seed = derived_layer_seed(plan.seed, layer)  # in 0..2**63-1 for any --seed
    # Factorised once per layer, shared by the probes and the control.
    needs_solver = bool(plan.controls) or any(k != "naive" for k, _ in plan.kinds)
    solver = RidgeSolver(x_tr) if needs_solver else None
    y_tr, y_val = setup.y_tr.to(dev), setup.y_val.to(dev)
    plain = [k for k in plan.kinds if k not in setup.adam]

    def val_rate(pred: torch.Tensor, objective: Objective) -> float:  # the figure's quantity
        return float(setup.val_lookup.run(pred, objective).success.double().mean())

    starts: dict[Objective, dict[str, FitInfo]] = {}
    regimes = ("linear", "cos") in plan.cross_layer and plan.regimes
    fits = fit_probes(
        x_tr,
        y_tr,
        x_val,
        y_val,
        plain,
        config=cfg,
        seed=layer_seed,
        solver=solver,
        val_score=val_rate,
        starts=starts if regimes else None,
    )
    for kind, kcfg in setup.adam.items():
        fits |= fit_probes(
            x_tr,
            y_tr,
            x_val,
            y_val,
            [kind],
            config=kcfg,
            seed=layer_seed,
            solver=solver,
            val_score=val_rate,
        )
    rows = [_measure(setup, layer, kind, fits[kind], x_te) for kind in plan.kinds]
    _flag_failures(rows)
    tables.rows += rows
    for kind in plan.kinds:
        if kind[0] == "naive":
            continue
        from_starts = starts.get(kind[1], {}) if kind == ("linear", "cos") else {}
        for fit in from_starts.values() or [fits[kind]]:  # both starts' curves (Fig. 2b)
            tables.record_curve(layer, kind, fit)
        if kind not in setup.adam:
            tables.record_grid(layer, kind, fits[kind])
        if kind not in plan.cross_layer:
            continue
        for start, fit in from_starts.items():
            if _REGIME_OF[start] in plan.regimes:
                tables.kept[(_REGIME_OF[start], kind, layer)] = (fit.probe.to("cpu"), fit)
        if not from_starts:  # a kind without starts to compare: its Fig. 2a fit
            tables.kept[("converged", kind, layer)] = (fits[kind].probe.to("cpu"), fits[kind])
    if plan.controls:
        # The control only has to show chance level: closed-form linear fits to shuffled
        # targets, no refinement, no identity start (the identity would score the real ones).
        ctrl = fit_probes(
            x_tr,
            setup.shuffled_tr.to(dev),
            x_val,
            setup.shuffled_val.to(dev),
            list(plan.controls),
            config=replace(cfg, cos_steps=0, identity_start=False),
            seed=layer_seed + 1,
            solver=solver,
        )
        tables.control += [_measure(setup, layer, k, fit, x_te) for k, fit in ctrl.items()]
    return tables


def _cross_rows(plan: EvaluationPlan, setup: _Setup, tables: _Tables) -> list[dict]:
    """Every kept probe (regime, kind, training layer) tested on every test layer, with its
    fit's record (steps, why it stopped, validation rate at the start and kept)."""
    out = []
    for (regime, (kind, obj), train_layer), (probe, fit) in tables.kept.items():
        record = {
            "fit_steps": fit.steps,
            "fit_stopped": fit.stopped,
            "fit_val_rate_start": fit.extras.get("val_score_start", float("nan")),
            "fit_val_rate": fit.extras.get("val_score", float("nan")),
            "fit_converged": fit.converged(),
        }
        for test_layer in plan.test_layers:
            with torch.no_grad():
                summary = lookup_summary(setup.lookup.run(probe(setup.x_test[:, test_layer]), obj))
            out.append(
                {
                    "regime": regime,
                    "probe": kind,
                    "objective": obj,
                    "train_layer": train_layer,
                    "test_layer": test_layer,
                    **summary,
                    **record,
                }
            )
    return out


CURVE_COLUMNS = ["layer", "probe", "objective", "start", "step", "train_loss", "val_loss"]
GRID_COLUMNS = ["layer", "probe", "objective", "ridge", "lr", "weight_decay", "val_loss", "chosen"]


def _layers_in_order(
    pairs: TokenPairs,
    plan: EvaluationPlan,
    setup: _Setup,
    on_layer: Callable[[int], None] | None,
) -> Iterator[_Tables]:
    """Each layer's tables, in layer order; `plan.workers` layers are fitted at once, each in
    a thread of its own on one intra-op thread (torch's kernels release the GIL), so the
    rows do not depend on how many run at once."""

    def one(layer: int) -> _Tables:
        out = evaluate_layer(pairs, plan, setup, layer)
        if on_layer is not None:
            on_layer(layer)
        return out

    if plan.workers == 1:
        yield from map(one, plan.layers)
        return
    with ThreadPoolExecutor(plan.workers, thread_name_prefix="probes") as pool:
        yield from pool.map(one, plan.layers)


def evaluate_pairs(
    pairs: TokenPairs,
    *,
    on_layer: Callable[[int], None] | None = None,
    **options: Any,
) -> Evaluation:
    """Identifiability rate per layer for every probe kind × objective, control, cross-layer matrix.

    Args:
        pairs: extracted hidden states (`[N, L+1, d]`).
        on_layer: called after each layer (progress).
        options: the keyword arguments of `plan_evaluation`:
            probe_kinds, objectives: the probe kinds and objectives; every combination is fitted.
            candidates: "sequence", "corpus" or "vocabulary" (needs `vocab_embeddings`
            `[V, d']`). layers: hidden-state indices to probe (0..L, 0 = e^0); default 1..L.
            cross_layer: (kind, objective) pairs whose probe of layer l is also tested on
            every layer. cross_layer_regimes: the starts of the cross-layer linear-cos probe
            (Fig. 2b's sensitivity), each refined by L-BFGS with the same validation early
            stopping: "ridge start" (least squares to unit-normalised targets) and
            "identity start" (the naive probe); the better-validated one is Fig. 2a's
            probe. Other cross-layer kinds are their Fig. 2a fit ("converged"). controls: (kind,
            objective) pairs refitted on shuffled targets (should sit at chance). seed:
            seeds the split, subsampling, initialisation and the shuffles.
            test_fraction, val_fraction: shares of sequences held out. probe_config:
            training settings of the probes. select_layer: the layer whose validation split
            chooses the Adam learning rate and weight decay (default: the deepest of
            `layers`). test_layers: the layers every cross-layer probe is tested on
            (default: `layers`). record_selection: list the selection's grid in `grid`.
            With these three a run over one layer at a time (the reproduction's shards:
            `layers=[l]`, `select_layer=L`, `test_layers=1..L`, the selection recorded
            once) gives exactly the rows of one run over all layers, in the same order.
            device: where the probes are fitted (the hidden states stay on the CPU and
            move one layer at a time; look-ups run on the CPU). workers: layers fitted at
            once (`fit_workers`; default one per torch thread on a CPU, 1 on a GPU).

    Returns:
        An `Evaluation` with long-format DataFrames:
        per_layer (layer, probe, objective, rate, ci_low, ci_high, rate_strict, n_tokens,
        n_tied, chance, optimizer, mlp_width, start, steps, stopped, converged, fit_failure,
        kept_start, ridge, lr, weight_decay, lr_decays, train_loss, val_loss_start,
        val_loss, val_rate_start, val_rate, late_gain), control (same columns), cross_layer
        (regime, probe, objective, train_layer, test_layer, rate, ci_low, ci_high,
        rate_strict, n_tokens, n_tied, chance, and the training fit's fit_steps,
        fit_stopped, fit_val_rate_start, fit_val_rate, fit_converged), fits (layer, probe, objective,
        start, step, train_loss, val_loss: every fit's loss curve, both starts of
        linear-cos) and grid (layer, probe, objective, ridge, lr, weight_decay, val_loss,
        chosen: every hyperparameter setting tried on validation). `converged` is False for
        a fit stopped by its step cap while its validation loss still fell by more than 1 %
        over the second half; `fit_failure` marks an MLP below the naive probe of its layer.
    """
    plan = plan_evaluation(pairs, **options)
    vocab = options.get("vocab_embeddings")
    vocab = vocab.float() if vocab is not None else None
    tables = _Tables()
    setup = _setup(pairs, plan, vocab, tables)
    for layer_tables in _layers_in_order(pairs, plan, setup, on_layer):
        tables.merge(layer_tables)
    return Evaluation(
        per_layer=pd.DataFrame(tables.rows),
        cross_layer=pd.DataFrame(_cross_rows(plan, setup, tables)),
        control=pd.DataFrame(tables.control),
        split=setup.split,
        fits=pd.DataFrame(tables.curves, columns=CURVE_COLUMNS),
        grid=pd.DataFrame(tables.grid, columns=GRID_COLUMNS),
    )
