"""Side by side: the reproduction's tables of several models on the same texts.

`align_texts` chooses texts every model reads whole (no truncation) and, when the
tokenizers differ, only texts that every model places alike in the length-selected
stages (attribution, mixing), so that each stage sees the same texts in every model;
their token counts per model are a table of their own. `side_by_side` turns each
model's reproduction tables into per-layer curves on relative depth (layer / L, so
models of different depths line up) and their differences from the first model, which
is matched at the nearest relative depth.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from identifiable.errors import IdentifiableError
from identifiable.experiments.pipeline import Item
from identifiable.models.protocol import TracedModel

# (table, value column, filter, metric name) of the per-layer curves compared
CURVES: tuple[tuple[str, str, dict[str, str], str], ...] = (
    ("fig1a_pearson_by_layer", "pearson_r", {}, "Fig. 1a: Pearson r(raw, effective) per layer"),
    (
        "fig2a_identifiability",
        "rate",
        {"probe": "linear", "objective": "cos"},
        "Fig. 2a: identifiability rate, linear cosine probe",
    ),
    (
        "fig2a_identifiability",
        "rate",
        {"probe": "mlp", "objective": "cos"},
        "Fig. 2a: identifiability rate, MLP cosine probe",
    ),
    ("fig3a_own_summary", "median", {}, "Fig. 3a: median own contribution c_ii (%)"),
    ("fig3b_own_not_top", "percent", {}, "Fig. 3b: tokens whose own input is not the top (%)"),
)


def check_comparable(model: TracedModel, label: str) -> None:
    """One line for a model whose texts cannot be aligned with the others'."""
    if getattr(model, "modality", "text") != "text" or not hasattr(model, "spec"):
        raise IdentifiableError(
            f"cannot align texts for {label}: compare reads the same texts with every model, "
            "and this one is not a text self-attention model"
        )
    if model.tokenizer is None:
        raise IdentifiableError(
            f"cannot align texts for {label}: it has no tokenizer (token ids only); save "
            "tokenizer files beside its weights"
        )


def align_texts(
    models: dict[str, Any], items: Sequence[Item], budget: Any
) -> tuple[list[Item], pd.DataFrame]:
    """(texts every model reads alike, token counts: item, model, tokens)."""
    import warnings

    counts: dict[str, list[int]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # truncation is counted here, and such texts dropped
        for label, m in models.items():
            encs = [m.encode(it, truncate=True) for it in items]
            counts[label] = [len(e) + e.n_dropped for e in encs]
    keep = np.ones(len(items), dtype=bool)
    for label, m in models.items():
        keep &= np.array(counts[label]) <= m.info.max_positions
    same_tokenizer = len({_vocab_key(m) for m in models.values()}) == 1
    if not same_tokenizer:
        ranges = [
            (getattr(budget, "attribution_min_tokens", 0), budget.attribution_max_tokens),
            (0, budget.mixing_max_tokens),
        ]
        for lo, hi in ranges:
            inside = np.array([[lo <= c <= hi for c in counts[k]] for k in models])
            keep &= inside.all(0) | ~inside.any(0)
    chosen = [it for it, k in zip(items, keep, strict=True) if k]
    if not chosen:
        raise IdentifiableError(
            "the texts cannot be aligned: no text of the corpus is read whole, and alike, by "
            f"every model ({', '.join(models)}); give a corpus of shorter texts (--corpus)"
        )
    rows = [
        (i, label, counts[label][j])
        for i, j in enumerate(np.flatnonzero(keep).tolist())
        for label in models
    ]
    return chosen, pd.DataFrame(rows, columns=["item", "model", "tokens"])


def _vocab_key(model: TracedModel) -> tuple[Any, ...]:
    tok = model.tokenizer
    return (type(tok).__name__, len(tok), getattr(tok, "name_or_path", ""))


def curves(tables: dict[str, pd.DataFrame], n_layers: int, label: str) -> pd.DataFrame:
    """model, metric, layer, relative_depth, value: the per-layer curves of one model.

    Layers are numbered from 0 (block l); relative_depth (l + 1) / L is the share of the
    model's blocks a hidden state has passed, 1 at the last layer of every model."""
    rows = []
    for table, column, where, metric in CURVES:
        df = tables.get(table)
        if df is None or df.empty or column not in df:
            continue
        for key, value in where.items():
            df = df[df[key] == value]
        by_layer = df.groupby("layer")[column].mean()
        rows += [
            (label, metric, int(layer), (layer + 1) / n_layers, float(v))
            for layer, v in by_layer.items()
        ]
    return pd.DataFrame(rows, columns=["model", "metric", "layer", "relative_depth", "value"])


def differences(curve: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Each model's curve minus the reference model's at the nearest relative depth."""
    ref = curve[curve["model"] == reference]
    out = []
    for (model, metric), grp in curve[curve["model"] != reference].groupby(["model", "metric"]):
        base = ref[ref["metric"] == metric]
        if base.empty:
            continue
        depths = base["relative_depth"].to_numpy()
        for _, r in grp.iterrows():
            j = int(np.abs(depths - r["relative_depth"]).argmin())
            b = base.iloc[j]
            out.append(
                (
                    model,
                    metric,
                    int(r["layer"]),
                    r["relative_depth"],
                    int(b["layer"]),
                    float(b["value"]),
                    float(r["value"]),
                    float(r["value"] - b["value"]),
                )
            )
    return pd.DataFrame(
        out,
        columns=[
            "model",
            "metric",
            "layer",
            "relative_depth",
            "reference_layer",
            "reference",
            "value",
            "difference",
        ],
    )


def verdicts(summaries: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """claim, then each model's status, and whether they differ. A pipeline check (smoke)
    has no findings, so no claim differs when any of the runs is one."""
    keys: list[str] = []
    for s in summaries.values():
        keys += [k for k in s.get("claims", {}) if k not in keys]
    check = any(s.get("pipeline_check") for s in summaries.values())
    rows = []
    for key in keys:
        statuses = {
            m: s.get("claims", {}).get(key, {}).get("status", "—") for m, s in summaries.items()
        }
        differs = not check and len(set(statuses.values())) > 1
        rows.append({"claim": key, **statuses, "differs": differs})
    return pd.DataFrame(rows)


def side_by_side(
    results: dict[str, tuple[dict[str, pd.DataFrame], dict[str, Any], int]],
) -> dict[str, pd.DataFrame]:
    """Tables of the comparison from {label: (reproduction tables, summary, n_layers)}."""
    curve = pd.concat(
        [curves(t, n, label) for label, (t, _, n) in results.items()], ignore_index=True
    )
    reference = next(iter(results))
    return {
        "verdicts": verdicts({k: s for k, (_, s, _) in results.items()}),
        "curves": curve,
        "differences": differences(curve, reference),
    }
