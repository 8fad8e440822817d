"""The scan as a stage of the pipeline: texts in shards → per-head tables (and the kept
maps as rows), reduced in text order into a `ScanResult`.

One process, a resumed run and `torchrun` ranks all run this same stage (shards fixed by
the texts' lengths, never by where a run stopped or how many ranks share it), and the
result is built from the reduced tables alone, so all three give the same `ScanResult`.

Tables (`report.tables.ScanStageTables`):
    heads   text, layer, head, then `attention.scan.STATISTICS` (one row per head)
    texts   text, n, truncated, preview (one row per text)
    kept    text, layer, head, query, token, raw, effective (each row's weights, float32),
            rank, dim, dim_stochastic, full_row_rank (one row per query row of a kept map)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import pandas as pd
import torch

from identifiable.attention.scan import (
    STATISTICS,
    LayerScanner,
    ScanPlan,
    ScanResult,
    TextScan,
    scan_text,
)
from identifiable.experiments.pipeline import Advance, Item, Stage, Tables
from identifiable.models.encoding import Encoding
from identifiable.models.layerscan import LayerWeights

STAGE = "scan"
SHARD_TOKENS = 16_384  # a shard ends before it would pass this many tokens …
SHARD_TEXTS = 64  # … or this many texts
PREVIEW = 80


def shard_texts(lengths: Sequence[int]) -> list[list[int]]:
    """Consecutive text indices, a new shard before `SHARD_TOKENS` tokens or `SHARD_TEXTS`
    texts would be passed (a longer text is a shard of its own)."""
    shards: list[list[int]] = []
    tokens = 0
    for t, n in enumerate(lengths):
        if shards and (tokens + n <= SHARD_TOKENS and len(shards[-1]) < SHARD_TEXTS):
            shards[-1].append(t)
            tokens += n
        else:
            shards.append([t])
            tokens = n
    return shards


def scan_stage(
    model: Any, encs: Sequence[Encoding], plan: ScanPlan, previews: Sequence[str]
) -> Stage:
    """The stage: one shard of texts → its tables (`text_tables`)."""
    scanner = LayerScanner(plan, model.stack.kv_head_of)
    weights = LayerWeights(model.stack, plan.heads)
    shards = shard_texts([len(e) for e in encs])

    def compute(shard: Sequence[Item], index: int, advance: Advance) -> Tables:
        parts = []
        for t in cast(Sequence[int], shard):
            scanned = scan_text(model, encs[t], scanner, weights)
            parts.append(text_tables(t, encs[t], scanned, plan, previews[t]))
            advance(1)
        return {name: pd.concat([p[name] for p in parts], ignore_index=True) for name in parts[0]}

    return Stage(
        name=STAGE,
        label="scan (texts)",
        shards=cast(list[list[Item]], shards),
        weights=[len(s) for s in shards],
        compute=compute,
        cost=[float(sum(len(encs[t]) ** 2 for t in s)) for s in shards],
    )


def text_tables(t: int, enc: Encoding, scanned: TextScan, plan: ScanPlan, preview: str) -> Tables:
    """One text's rows of the three tables."""
    n_l, n_h = len(plan.layers), len(plan.heads)
    grid = {
        "text": np.full(n_l * n_h, t, dtype=np.int64),
        "layer": np.repeat(np.asarray(plan.layers, dtype=np.int64), n_h),
        "head": np.tile(np.asarray(plan.heads, dtype=np.int64), n_l),
    }
    stats = scanned.stats.reshape(n_l * n_h, len(STATISTICS)).numpy()
    heads = pd.DataFrame({**grid, **{s: stats[:, i] for i, s in enumerate(STATISTICS)}})
    heads["n"] = heads["n"].astype(np.int64)
    texts = pd.DataFrame(
        {"text": [t], "n": [len(enc)], "truncated": [int(enc.n_dropped)], "preview": [preview]}
    )
    kept = [
        _kept_rows(t, layer, head, enc, scanned.kept[(layer, head)])
        for layer in plan.layers
        for head in plan.heads
        if (layer, head) in scanned.kept
    ]
    return {"heads": heads, "texts": texts, "kept": pd.concat(kept) if kept else _no_kept()}


def _kept_rows(
    t: int, layer: int, head: int, enc: Encoding, maps: tuple[torch.Tensor, ...]
) -> pd.DataFrame:
    raw, eff, rank, dim, dim_s, full = maps
    n = raw.shape[0]
    return pd.DataFrame(
        {
            "text": np.full(n, t, dtype=np.int64),
            "layer": np.full(n, layer, dtype=np.int64),
            "head": np.full(n, head, dtype=np.int64),
            "query": np.arange(n, dtype=np.int64),
            "token": list(enc.tokens),
            "raw": list(raw.numpy()),
            "effective": list(eff.numpy()),
            "rank": rank.numpy().astype(np.int64),
            "dim": dim.numpy().astype(np.int64),
            "dim_stochastic": dim_s.numpy().astype(np.int64),
            "full_row_rank": np.full(n, bool(full)),
        }
    )


def _no_kept() -> pd.DataFrame:
    ints = {c: pd.Series(dtype=np.int64) for c in ("text", "layer", "head", "query")}
    rest = {c: pd.Series(dtype=object) for c in ("token", "raw", "effective")}
    more = {c: pd.Series(dtype=np.int64) for c in ("rank", "dim", "dim_stochastic")}
    return pd.DataFrame({**ints, **rest, **more, "full_row_rank": pd.Series(dtype=bool)})


def scan_result(tables: Tables, plan: ScanPlan, model: Any, *, all_heads: bool) -> ScanResult:
    """The `ScanResult` of the reduced tables (texts in input order)."""
    texts = tables["texts"].sort_values("text")
    heads = tables["heads"].sort_values(["text", "layer", "head"])
    n_t, n_l, n_h = len(texts), len(plan.layers), len(plan.heads)
    arrays: dict[str, Any] = {}
    for s in STATISTICS:
        values = heads[s].to_numpy().reshape(n_t, n_l, n_h)
        arrays[s] = torch.from_numpy(values.astype(np.int64 if s == "n" else np.float64))
    kept = _kept_arrays(tables["kept"], texts["n"].to_numpy())
    everything = len(plan.layers) == model.info.n_layers
    return ScanResult(
        **arrays,
        variant=plan.variant,
        sink=plan.sink,
        model_name=model.info.name,
        is_causal=bool(model.info.is_causal),
        layers=None if everything else plan.layers,
        heads=None if all_heads else plan.heads,
        texts=tuple(str(p) for p in texts["preview"]),
        truncated=tuple(int(x) for x in texts["truncated"]),
        **kept,
    )


def _kept_arrays(kept: pd.DataFrame, lengths: np.ndarray) -> dict[str, Any]:
    """The `kept_*` fields from the kept rows (NaN and −1 beyond each text's n)."""
    if kept.empty:
        return {}
    keys = list(dict.fromkeys(zip(kept["text"], kept["layer"], kept["head"], strict=True)))
    n_max = max(int(lengths[int(t)]) for t, _, _ in keys)
    k = len(keys)
    raw = torch.full((k, n_max, n_max), float("nan"))
    eff = torch.full_like(raw, float("nan"))
    ints = {c: torch.full((k, n_max), -1, dtype=torch.long) for c in ("rank", "dim", "ds")}
    full = torch.zeros(k, dtype=torch.bool)
    tokens = []
    groups = kept.groupby(["text", "layer", "head"], sort=False)
    for i, key in enumerate(keys):
        rows = groups.get_group(key).sort_values("query")
        n = len(rows)
        raw[i, :n, :n] = torch.from_numpy(np.stack(rows["raw"].to_numpy()).astype(np.float32))
        eff[i, :n, :n] = torch.from_numpy(np.stack(rows["effective"].to_numpy()).astype(np.float32))
        for name, col in (("rank", "rank"), ("dim", "dim"), ("ds", "dim_stochastic")):
            ints[name][i, :n] = torch.from_numpy(rows[col].to_numpy().astype(np.int64))
        full[i] = bool(rows["full_row_rank"].iloc[0])
        tokens.append(tuple(str(x) for x in rows["token"]))
    return {
        "kept": tuple((int(t), int(layer), int(h)) for t, layer, h in keys),
        "kept_raw": raw,
        "kept_effective": eff,
        "kept_rank": ints["rank"],
        "kept_dim": ints["dim"],
        "kept_dim_stochastic": ints["ds"],
        "kept_full_row_rank": full,
        "kept_tokens": tuple(tokens),
    }
