"""Raw vs effective attention on a corpus (paper Fig. 1), as tidy tables.

`attention_experiment(model, texts)` streams the texts through the model
(`trace_many`) and, one layer at a time, records:
(a) Pearson r between raw and effective attention per sequence, pooled over
    all heads and layers and per layer, against sequence length. For decoders
    the causally masked entries (exactly 0 in both) are left out of r;
(null) rank(T), dim LN(T) and dim LN([T, 1]) per layer and head against length;
(b)/(c) per layer and head, the mean over query tokens of the summed raw and
    effective attention on [CLS], [SEP] and '.'/',' keys (or the model's own
    special tokens, named in `category`/`token`).
Layers in the tables are numbered 0..L−1 (the paper's layer l is our l−1); heads 0..H−1.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from identifiable.attention import (
    VARIANTS,
    HeadFactors,
    Variant,
    compute_head_factors,
    iter_effective_attention,
)
from identifiable.attention.sinks import key_mass
from identifiable.attention.stats import (
    attention_to,
    causal_mask,
    pearson_from_sums,
    pearson_sums,
    token_categories,
)
from identifiable.errors import IdentifiableError
from identifiable.experiments.pipeline import Advance, Item
from identifiable.models.protocol import TracedModel
from identifiable.models.trace import Trace

TextOrPair = str | tuple[str, str]


@dataclass
class AttentionExperimentResult:
    """Tidy (long-format) tables of the Fig. 1 experiment.

    Attributes:
        correlation: seq, n_tokens, layer (1..L, or <NA> for all layers pooled),
            pearson_r, n_entries.
        null_dims: seq, n_tokens, layer, head, rank, dim, dim_stochastic (the
            whole sequence; for decoders, its last row), out_proj_full_row_rank.
        token_attention_per_sequence: seq, n_tokens, layer, head, category,
            token, present (the category occurs in the sequence), raw, effective.
        settings: model, variant, counts and notes.
    """

    correlation: pd.DataFrame
    null_dims: pd.DataFrame
    token_attention_per_sequence: pd.DataFrame
    settings: dict[str, Any] = field(default_factory=dict)

    def token_attention(self) -> pd.DataFrame:
        """Per layer, head and category: mean raw / effective attention over the
        sequences that contain the category (n_sequences of them)."""
        df = self.token_attention_per_sequence
        df = df[df["present"]]
        return (
            df.groupby(["layer", "head", "category", "token"], as_index=False)
            .agg(
                raw=("raw", "mean"), effective=("effective", "mean"), n_sequences=("seq", "nunique")
            )
            .sort_values(["category", "layer", "head"], ignore_index=True)
        )

    def token_attention_layer_means(self) -> pd.DataFrame:
        """Per layer and category: the mean over heads (the line through paper Fig. 1b/c)."""
        return (
            self.token_attention()
            .groupby(["layer", "category", "token"], as_index=False)[["raw", "effective"]]
            .mean()
        )

    def write(self, out_dir: str | Path) -> list[Path]:
        """Write every table as CSV plus settings.json, each atomically."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        tables = {
            "correlation": self.correlation,
            "null_dims": self.null_dims,
            "token_attention": self.token_attention(),
            "token_attention_per_sequence": self.token_attention_per_sequence,
        }
        paths = [
            _atomic(out / f"{k}.csv", v.to_csv(index=False).encode()) for k, v in tables.items()
        ]
        paths.append(_atomic(out / "settings.json", json.dumps(self.settings, indent=2).encode()))
        return paths


def attention_experiment(
    model: TracedModel,
    texts: Iterable[TextOrPair],
    *,
    variant: Variant = "paper",
    batch_size: int = 8,
    progress: bool = False,
) -> AttentionExperimentResult:
    """Run the Fig. 1 measurements on `texts` (str or (a, b) pairs) with `model`.

    Args:
        model: an `identifiable.models.Model`.
        texts: any iterable, e.g. `identifiable.corpus.load_corpus(...)`.
        variant: "paper" (default, as in the paper) or "row-stochastic".
    """
    if variant not in VARIANTS:
        raise IdentifiableError(f"unknown variant {variant!r}: use one of {', '.join(VARIANTS)}")
    corr: list[dict] = []
    dims: list[dict] = []
    cats: list[dict] = []
    factors: HeadFactors | None = None
    seq = -1
    for seq, trace in enumerate(model.trace_many(texts, batch_size=batch_size, progress=progress)):
        factors = factors or compute_head_factors(trace)  # same model: factor W_O once
        _one_sequence(seq, trace, variant, factors, corr, dims, cats)
    if seq < 0:
        raise IdentifiableError("no texts to analyse: the corpus is empty")
    info = model.info
    settings = {
        "model": info.name,
        "architecture": info.architecture,
        "n_layers": info.n_layers,
        "n_heads": info.n_heads,
        "head_dim": info.head_dim,
        "variant": variant,
        "n_sequences": seq + 1,
        "layers": "0..L-1 (the paper's layer l is our l-1); heads 0..H-1",
        "pearson_entries": "all heads, query rows and keys"
        + ("; causally masked entries excluded" if info.is_causal else ""),
        "token_attention": "mean over query tokens of the summed weight on the category's keys; "
        "token_attention() averages over sequences that contain the category",
    }
    corr_df = pd.DataFrame(corr)
    corr_df["layer"] = corr_df["layer"].astype("Int64")
    return AttentionExperimentResult(corr_df, pd.DataFrame(dims), pd.DataFrame(cats), settings)


def _one_sequence(
    seq: int,
    trace: Trace,
    variant: Variant,
    factors: HeadFactors,
    corr: list[dict],
    dims: list[dict],
    cats: list[dict],
) -> None:
    """Append one sequence's rows to the three tables, one layer at a time."""
    n = trace.n_tokens
    mask = causal_mask(n) if trace.is_causal else None
    categories = token_categories(trace.tokens, trace.special_tokens)
    pooled = torch.zeros(6, dtype=torch.float64)
    # float64, not the trace's float32: the report quotes the head-output change
    # ‖(A − A_eff) T‖ at float64's 1e-9, and its tables stay those of earlier runs.
    for le in iter_effective_attention(trace, variant, factors=factors, dtype=torch.float64):
        layer = le.layer
        sums = pearson_sums(le.raw, le.effective, mask)
        pooled += sums
        corr.append(
            {
                "seq": seq,
                "n_tokens": n,
                "layer": layer,
                "pearson_r": pearson_from_sums(sums),
                "n_entries": int(sums[0]),
            }
        )
        for head in range(trace.n_heads):
            dims.append(
                {
                    "seq": seq,
                    "n_tokens": n,
                    "layer": layer,
                    "head": head,
                    "rank": int(le.rank[head, -1]),
                    "dim": int(le.dim[head, -1]),
                    "dim_stochastic": int(le.dim_stochastic[head, -1]),
                    "out_proj_full_row_rank": bool(factors.full_row_rank[le.layer, head]),
                }
            )
        for name, (token, keys) in categories.items():
            present = bool(keys.any())
            raw = attention_to(le.raw, keys) if present else None
            eff = attention_to(le.effective, keys) if present else None
            for head in range(trace.n_heads):
                cats.append(
                    {
                        "seq": seq,
                        "n_tokens": n,
                        "layer": layer,
                        "head": head,
                        "category": name,
                        "token": token,
                        "present": present,
                        "raw": float(raw[head]) if raw is not None else math.nan,
                        "effective": float(eff[head]) if eff is not None else math.nan,
                    }
                )
    corr.append(
        {
            "seq": seq,
            "n_tokens": n,
            "layer": None,
            "pearson_r": pearson_from_sums(pooled),
            "n_entries": int(pooled[0]),
        }
    )


def _atomic(path: Path, data: bytes) -> Path:
    from identifiable.store.files import atomic_write_bytes

    return atomic_write_bytes(path, data)


# ---- the reproduction stage (shard → partial tables) ----------------------------

PUNCT = {".", ","}


def target_positions(tokens: Sequence[str], special: dict[str, str]) -> dict[str, list[int]]:
    """Key positions of [CLS] (or BOS), [SEP] (or EOS) and '.'/',' in one sequence."""
    cls = special.get("cls") or special.get("bos")
    sep = special.get("sep") or special.get("eos")
    bare = [t.lstrip("Ġ▁") for t in tokens]
    return {
        "CLS": [i for i, t in enumerate(tokens) if cls is not None and t == cls],
        "SEP": [i for i, t in enumerate(tokens) if sep is not None and t == sep and t != cls],
        "PUNCT": [i for i, t in enumerate(bare) if t in PUNCT],
    }


def attention_tables(
    model: TracedModel, shard: Sequence[Item], first: int, advance: Advance
) -> dict[str, pd.DataFrame]:
    """Per sequence: r(raw, effective) pooled and per layer, null dims, attention to targets.

    Tables: by_length (seq, length, pearson_r, null_dim_mean);
    by_layer (seq, length, layer, pearson_r); to_tokens (seq, layer, head, kind, target, value),
    value = mean over query tokens of the summed weight on the target keys (docs/definitions.md#effective-attention);
    output_change (seq, length, layer, head, bias_free, biased): see `head_output_change`.
    Decoders (causal traces) add sinks and by_prefix: see `CausalRows`.
    """
    by_length: list[tuple[Any, ...]] = []
    by_layer: list[tuple[Any, ...]] = []
    to_tokens: list[tuple[Any, ...]] = []
    output_change: list[tuple[Any, ...]] = []
    rows = CausalRows()
    factors = None
    for k, tr in enumerate(model.trace_many(list(shard), batch_size=8)):
        seq = first + k
        factors = factors or compute_head_factors(tr)
        n = tr.n_tokens
        visible = (
            torch.ones(n, n, dtype=torch.bool).tril()
            if tr.is_causal
            else torch.ones(n, n, dtype=torch.bool)
        )
        targets = target_positions(tr.tokens, tr.special_tokens)
        pooled, dims = torch.zeros(6, dtype=torch.float64), []
        for le in iter_effective_attention(tr, "paper", factors=factors, dtype=torch.float64):
            sums = pearson_sums(le.raw, le.effective, visible)  # float64, shared with Fig. 1
            pooled += sums
            dims.append(le.dim[:, -1].double())
            by_layer.append((seq, n, le.layer, pearson_from_sums(sums)))
            change = head_output_change(
                le.raw,
                le.effective,
                tr.values[le.layer],
                tr.value_bias[le.layer],
                tr.out_proj[le.layer],
            )
            output_change.extend(
                (seq, n, le.layer, h, free, biased)
                for h, (free, biased) in enumerate(change.tolist())
            )
            if tr.is_causal:
                rows.add_layer(seq, tr, le)
            for kind, mat in (("raw", le.raw), ("effective", le.effective)):
                for target, pos in targets.items():
                    if not pos:
                        continue
                    keys = torch.zeros(n, dtype=torch.bool)
                    keys[pos] = True
                    values = attention_to(mat, keys)  # [H]
                    to_tokens.extend(
                        (seq, le.layer, h, kind, target, float(v)) for h, v in enumerate(values)
                    )
        by_length.append((seq, n, pearson_from_sums(pooled), float(torch.cat(dims).mean())))
        if tr.is_causal:
            rows.end_sequence(seq)
        advance(1)
    return rows.tables() | {
        "by_length": pd.DataFrame(
            by_length, columns=["seq", "length", "pearson_r", "null_dim_mean"]
        ),
        "by_layer": pd.DataFrame(by_layer, columns=["seq", "length", "layer", "pearson_r"]),
        "to_tokens": pd.DataFrame(
            to_tokens, columns=["seq", "layer", "head", "kind", "target", "value"]
        ),
        "output_change": pd.DataFrame(
            output_change, columns=["seq", "length", "layer", "head", "bias_free", "biased"]
        ),
    }


SINK_COLUMNS = [
    "seq",
    "length",
    "layer",
    "head",
    "raw",
    "effective",
    "null_rows",
    "raw_null_rows",
    "effective_null_rows",
]


class CausalRows:
    """The decoder tables of the attention stage (causal traces only; none for encoders).

    sinks: seq, length, layer, head, raw, effective: the means over the rows that see key 0
        of A[h, i, 0] and A_eff[h, i, 0] (`attention.sinks.key_mass`, as `sink_mass` and the
        scan reduce them); null_rows, raw_null_rows, effective_null_rows: the same over the
        rows whose null space is not trivial (dim LN(T≤i) > 0; NaN when there is none), the
        only rows where the two can differ.
    by_prefix: seq, prefix, null_dim, null_fraction: for each query row i (prefix length
        i + 1), the means over layers and heads of dim LN(T_{≤i}) and of
        ‖a_i − ã_i‖₂ / ‖a_i‖₂, the share of the row in the null space.
    """

    def __init__(self) -> None:
        self.sinks: list[tuple[Any, ...]] = []
        self.prefix: list[tuple[Any, ...]] = []
        self._dim: torch.Tensor | None = None
        self._fraction: torch.Tensor | None = None
        self._count = 0

    def add_layer(self, seq: int, tr: Trace, le: Any) -> None:
        seen = tr.keys_seen(le.layer)[:, 0].to(le.raw.device)
        raw, eff = key_mass(le.raw, le.effective, 0, seen)
        live = ((le.dim > 0) & seen.to(le.dim.device)).double()  # [H, n]
        count = live.sum(-1)
        per_row = [(m[:, :, 0].double() * live).sum(-1) / count for m in (le.raw, le.effective)]
        cols = [x.tolist() for x in (raw, eff, count, *per_row)]
        self.sinks.extend(
            (seq, tr.n_tokens, le.layer, h, *(c[h] for c in cols)) for h in range(len(cols[0]))
        )
        a = le.raw.double()
        norm = torch.linalg.vector_norm(a, dim=-1).clamp_min(torch.finfo(torch.float64).tiny)
        fraction = torch.linalg.vector_norm(a - le.effective.double(), dim=-1) / norm  # [H, n]
        dim, fraction = le.dim.double().sum(0).cpu(), fraction.sum(0).cpu()
        self._dim = dim if self._dim is None else self._dim + dim
        self._fraction = fraction if self._fraction is None else self._fraction + fraction
        self._count += int(le.dim.shape[0])

    def end_sequence(self, seq: int) -> None:
        if self._dim is None or self._fraction is None:
            return
        dim, fraction = self._dim / self._count, self._fraction / self._count
        self.prefix.extend(
            (seq, i + 1, d, f)
            for i, (d, f) in enumerate(zip(dim.tolist(), fraction.tolist(), strict=True))
        )
        self._dim, self._fraction, self._count = None, None, 0

    def tables(self) -> dict[str, pd.DataFrame]:
        if not self.sinks:
            return {}
        return {
            "sinks": pd.DataFrame(self.sinks, columns=SINK_COLUMNS),
            "by_prefix": pd.DataFrame(
                self.prefix, columns=["seq", "prefix", "null_dim", "null_fraction"]
            ),
        }


def head_output_change(
    raw: torch.Tensor,
    effective: torch.Tensor,
    values: torch.Tensor,
    value_bias: torch.Tensor,
    out_proj: torch.Tensor,
) -> torch.Tensor:
    """Relative change of each head's output when A is replaced by A_eff, `[H, 2]` float64.

    The null space is defined for the bias-free T = E W_V H, so A_eff T = A T and the
    bias-free output cannot change; the model, however, computes A (E W_V + 1 b_Vᵀ) H, and
    the rows of the paper's A_eff need not sum to 1, so the value bias enters with other
    weights and the real head output does change.

    Args:
        raw, effective: `[H, n, n]` A and A_eff; values: `[H, n, d_v]` E W_V (no bias);
        value_bias: `[H, d_v]` b_V; out_proj: `[H, d_v, d]` H.
    Returns:
        Column 0: ‖(A_eff − A) E W_V H‖_F / ‖A E W_V H‖_F (bias-free; zero up to rounding).
        Column 1: the same with the biased values E W_V + 1 b_Vᵀ the model computes with.
    """
    a, diff = raw.double(), effective.double() - raw.double()
    v, h = values.double(), out_proj.double()
    biased = v + value_bias.double()[:, None, :]
    out = []
    for x in (v, biased):
        t = x @ h  # [H, n, d]
        num = torch.linalg.matrix_norm(diff @ t)
        den = torch.linalg.matrix_norm(a @ t).clamp_min(1e-300)
        out.append(num / den)
    return torch.stack(out, dim=-1)
