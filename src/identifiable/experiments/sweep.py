"""What fine-tuning with the penalty bought and cost, on held-out texts only.

For the original model and each fine-tuned one (`evaluate_model`), on texts of
documents never trained on:
- null: per sequence longer than d_v, layer and head, the mean over query rows of the
  null fraction ‖a − a_eff‖² / ‖a‖² (paper variant, from `effective_attention` on the
  model's traces: the analyses' own implementation, not the training penalty);
- embeddings: mean-pooled sentence embeddings, compared with the original's by cosine,
  and each sentence's nearest neighbour among the held-out sentences, compared with the
  original's nearest neighbour (`fidelity`);
- tokens: Fig. 2 identifiability rates at the last layer (the reproduction's tokens stage);
- hta: Hidden Token Attribution at the last layer: own share c_ii and P̃ (tokens whose
  own input is not their top contributor), from the reproduction's attribution stage.
`pareto_table` puts one row per model side by side and marks the goal of docs/training.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from identifiable.attention import effective_attention
from identifiable.experiments.attribution import attribution_shard_tables, items_in_length_range
from identifiable.experiments.stages import with_budget
from identifiable.experiments.tokens import token_tables
from identifiable.models.backends import inference
from identifiable.models.protocol import TracedModel

NULL_GOAL = 0.5  # the median null fraction falls to at most half of the original's
COSINE_GOAL = 0.98  # while held-out embedding cosine to the original stays at least this


@dataclass(frozen=True)
class HeldOut:
    """Held-out texts: pairs (null fraction, Fig. 2, HTA) and sentences (embeddings)."""

    pairs: list[tuple[str, str]]
    sentences: list[str]
    hta_pairs: int = 2
    hta_probes: int = 2
    token_max_tokens: int = 3000
    probe_steps: int = 300


def held_out_texts(
    model: TracedModel,
    documents: Sequence[Any],
    *,
    pairs: int,
    sentences: int,
    seed: int,
    **options: Any,
) -> HeldOut:
    """Pairs longer than d_v (up to 128 tokens) and sentences of ≥ 6 words of `documents`."""
    from identifiable.corpus import make_pairs

    d_v = model.info.head_dim
    made = make_pairs(documents, model.tokenizer, max_tokens=128, min_tokens=d_v + 1, seed=seed)
    rng = np.random.default_rng(seed)
    chosen = [made[i] for i in sorted(rng.permutation(len(made))[:pairs].tolist())]
    texts = [s for d in documents for s in d.sentences if len(s.split()) >= 6]
    picked = [texts[i] for i in sorted(rng.permutation(len(texts))[:sentences].tolist())]
    return HeldOut(chosen, picked, **options)


def null_rows(model: TracedModel, pairs: Sequence[Any]) -> pd.DataFrame:
    """seq, n, layer (0-based), head, null_fraction: mean over the rows of one head."""
    rows = []
    d_v = model.info.head_dim
    for seq, item in enumerate(pairs):
        tr = model.trace(item)
        if tr.n_tokens <= d_v:
            continue
        ea = effective_attention(tr, dtype=torch.float64)  # the report's precision
        a = ea.raw.double()
        frac = ((a - ea.effective).square().sum(-1) / a.square().sum(-1)).mean(-1)  # [L, H]
        for layer, head in np.ndindex(*frac.shape):
            rows.append((seq, tr.n_tokens, layer, head, float(frac[layer, head])))
    return pd.DataFrame(rows, columns=["seq", "n", "layer", "head", "null_fraction"])


def sentence_embeddings(
    model: TracedModel, sentences: Sequence[str], batch_size: int = 32
) -> torch.Tensor:
    """`[S, d]` float64 unit mean-pooled last hidden states."""
    from identifiable.training.loop import encode_batch, mean_pool

    out = []
    with torch.no_grad(), inference(model.hf_model):
        for start in range(0, len(sentences), batch_size):
            enc = encode_batch(model, list(sentences[start : start + batch_size]))
            hidden = model.hf_model(**enc).last_hidden_state
            out.append(mean_pool(hidden, enc["attention_mask"]).double().cpu())
    e = torch.cat(out)
    return e / e.norm(dim=-1, keepdim=True)


def fidelity(emb: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    """Cosine to the reference embeddings (mean, 5th percentile, min) and the share of
    sentences whose nearest neighbour (cosine, itself excluded) is the reference's."""
    cos = (emb * reference).sum(-1)

    def nearest(e: torch.Tensor) -> torch.Tensor:
        sim = e @ e.T
        sim.fill_diagonal_(-np.inf)
        return sim.argmax(-1)

    agree = (nearest(emb) == nearest(reference)).double().mean()
    return {
        "cosine_mean": float(cos.mean()),
        "cosine_p05": float(torch.quantile(cos, 0.05)),
        "cosine_min": float(cos.min()),
        "nn_agreement": float(agree),
    }


def last_layer_tokens(
    model: TracedModel, held: HeldOut, seed: int, cache_dir: Path
) -> pd.DataFrame:
    """Fig. 2 rates at the last layer (probe, objective, rate, ci_low, ci_high)."""
    budget = with_budget(
        "quick",
        token_max_tokens=held.token_max_tokens,
        probe_max_steps=held.probe_steps,
        probe_lr_grid=(3e-3,),
        probe_mlp_width=128,
    )
    n_layers = model.info.n_layers
    tables = token_tables(
        model, held.pairs, budget, seed, cache_dir, lambda _: None, layer=n_layers
    )
    per = tables["per_layer"]
    return per[per["layer"] == n_layers][["probe", "objective", "rate", "ci_low", "ci_high"]]


def last_layer_hta(model: TracedModel, held: HeldOut, seed: int) -> dict[str, float]:
    """Median own share c_ii and P̃ (own input not the top contributor) at the last layer."""
    items = items_in_length_range(model, held.pairs, 60, 128, held.hta_pairs)
    own = attribution_shard_tables(model, items, 0, held.hta_probes, seed, lambda _: None)["own"]
    last = own[own["layer"] == own["layer"].max()]
    return {
        "hta_own_median": float(last["own"].median()),
        "hta_not_top": float(1.0 - last["own_is_top"].mean()),
        "hta_sequences": len(items),
    }


def evaluate_model(
    model: TracedModel,
    reference_embeddings: torch.Tensor | None,
    held: HeldOut,
    seed: int,
    cache_dir: Path,
) -> dict[str, Any]:
    """Every held-out measure of one model (the reference: the original's embeddings)."""
    emb = sentence_embeddings(model, held.sentences)
    ref = emb if reference_embeddings is None else reference_embeddings
    return {
        "null": null_rows(model, held.pairs),
        "embeddings": emb,
        "fidelity": fidelity(emb, ref),
        "tokens": last_layer_tokens(model, held, seed, cache_dir),
        "hta": last_layer_hta(model, held, seed),
    }


def pareto_table(
    results: dict[str, dict[str, Any]], weights: dict[str, float | None]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(pareto: one row per model, null_by_layer: median/mean/quartiles per model and layer)."""
    base = next(iter(results))
    base_median = float(results[base]["null"]["null_fraction"].median())
    rows, by_layer = [], []
    for label, res in results.items():
        null = res["null"]
        median = float(null["null_fraction"].median())
        row: dict[str, Any] = {"model": label, "penalty": weights.get(label)}
        row["null_median"] = median
        row["null_mean"] = float(null["null_fraction"].mean())
        row["null_ratio_to_original"] = median / base_median if base_median > 0 else np.nan
        for layer, grp in null.groupby("layer"):
            row[f"null_median_L{layer}"] = float(grp["null_fraction"].median())
            by_layer.append(
                {
                    "model": label,
                    "penalty": weights.get(label),
                    "layer": int(layer),
                    "median": float(grp["null_fraction"].median()),
                    "mean": float(grp["null_fraction"].mean()),
                    "q25": float(grp["null_fraction"].quantile(0.25)),
                    "q75": float(grp["null_fraction"].quantile(0.75)),
                    "heads_x_sequences": len(grp),
                }
            )
        row.update(res["fidelity"])
        for _, t in res["tokens"].iterrows():
            row[f"fig2_{t['probe']}_{t['objective']}"] = float(t["rate"])
        row.update(res["hta"])
        row["goal_met"] = bool(
            median <= NULL_GOAL * base_median and row["cosine_mean"] >= COSINE_GOAL
        )
        rows.append(row)
    return pd.DataFrame(rows), pd.DataFrame(by_layer)
