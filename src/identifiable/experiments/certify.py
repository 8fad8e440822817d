"""Beyond the paper: how far can attention really move? (a pipeline stage)

For sampled query rows of every head, compare three answers to "which attention
rows give this head output": the null-space dimension (paper), the paper's effective
attention (how far it moves from raw), and the certified intervals of valid rows
(≥ 0, summing to 1) with the constrained effective attention. See
docs/certified_attention.md for the definitions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from identifiable.attention import constrained_attention, interval_map
from identifiable.experiments.pipeline import Advance, Item
from identifiable.models.protocol import TracedModel

# the per-row quantities that by_layer and by_length average
MEANS = ["null_dim", "width_max", "width_mean", "movable_mass", "l1_effective", "l1_constrained"]
ROW_COLUMNS = ["seq", "length", "layer", "head", "query", "keys", *MEANS, "lps"]


def sample_rows(n_rows: int, k: int, seed: int, seq: int, layer: int, head: int) -> list[int]:
    """`k` distinct query rows (sorted), the same for the same (seed, seq, layer, head)."""
    rng = np.random.default_rng([seed, seq, layer, head])
    return sorted(rng.choice(n_rows, size=min(k, n_rows), replace=False).tolist())


def certify_tables(
    model: TracedModel,
    shard: Sequence[Item],
    first: int,
    advance: Advance,
    *,
    rows_per_head: int = 2,
    seed: int = 0,
    heads: Sequence[int] | None = None,
) -> dict[str, pd.DataFrame]:
    """Per sequence, layer, head and sampled row: intervals, movable mass and movements.

    Table "rows" (one line per sampled row; layers, heads and queries 0-based):
    seq, length, layer, head, query, keys (the row's key-set size), null_dim
    (dim LN([T, 1])), width_max and width_mean (of the row's intervals over its keys),
    movable_mass (Σ raw − lower: a bound on the mass any valid row can move),
    l1_effective (‖A_eff − A‖₁ of the paper variant), l1_constrained (‖C − A‖₁ of the
    constrained effective attention, closest to uniform), lps (LPs solved).
    """
    records = []
    for k, tr in enumerate(model.trace_many(list(shard), batch_size=8)):
        seq = first + k
        n = tr.n_tokens
        head_list = list(range(tr.n_heads)) if heads is None else list(heads)
        for layer in range(tr.n_layers):
            for head in head_list:
                rows = sample_rows(n, rows_per_head, seed, seq, layer, head)
                imap = interval_map(tr, layers=[layer], heads=[head], rows=rows)
                con = constrained_attention(tr, layer, head, rows=rows)
                width = imap.width[0, 0]
                mass = imap.movable_mass[0, 0]
                for i, q in enumerate(rows):
                    keys = imap.keys[0, i]
                    w = width[i][keys]
                    records.append(
                        (
                            seq,
                            n,
                            layer,
                            head,
                            q,
                            int(keys.sum()),
                            int(imap.null_dim[0, 0, i]),
                            float(w.max()),
                            float(w.mean()),
                            float(mass[i]),
                            float(con.l1_effective[i]),
                            float(con.l1_constrained[i]),
                            int(imap.lp_solved[0, 0, i]),
                        )
                    )
        advance(1)
    return {"rows": pd.DataFrame(records, columns=ROW_COLUMNS)}


def certify_reduce(parts: Sequence[dict[str, pd.DataFrame]]) -> dict[str, pd.DataFrame]:
    """Concatenate the shards' rows and summarise them by layer and by sequence.

    Tables: rows (as `certify_tables`); by_layer (layer: mean null_dim, width_max,
    width_mean, movable_mass, l1_effective, l1_constrained, n_rows); by_length (seq,
    length: the same means over the sequence's sampled rows).
    """
    frames = [p["rows"] for p in parts if "rows" in p and len(p["rows"])]
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=ROW_COLUMNS)
    by_layer = rows.groupby("layer", as_index=False)[MEANS].mean()
    by_layer["n_rows"] = rows.groupby("layer").size().to_numpy() if len(rows) else []
    by_length = rows.groupby(["seq", "length"], as_index=False)[MEANS].mean()
    return {"rows": rows, "by_layer": by_layer, "by_length": by_length}
