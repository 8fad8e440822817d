"""Beyond the paper: how uncertain is attention? (a pipeline stage)

For a few sampled query rows of every head, the posterior over the valid attention rows
(`attention_posterior`, uniform prior: every row with the same head output equally likely)
beside the worst case (the certified interval of each weight) and the two point answers
(the paper's effective attention and the constrained row). See docs/posterior.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from identifiable.attention import attention_posterior
from identifiable.attention.chains import FLAG_BUDGET, FLAG_ESS, FLAG_RHAT, flag_text
from identifiable.attention.posterior import AttentionPosterior
from identifiable.experiments.pipeline import Advance, Item
from identifiable.models.protocol import TracedModel
from identifiable.utils.threads import one_thread

ROW_COLUMNS = [
    "seq",
    "length",
    "layer",
    "head",
    "query",
    "keys",
    "null_dim",
    "certified_max",
    "certified_mean",
    "credible_max",
    "credible_mean",
    "width_ratio",
    "top_key",
    "p_top_stays",
    "settled",
    "ess",
    "rhat",
    "draws",
    "flags",
    "flagged",
    "flag_text",
    "top_effective",
    "top_constrained",
    "l1_effective",
    "l1_constrained",
    "l1_mean",
]
PINNED = 1e-9  # a row whose widest certified interval is below this cannot move at all
UNSOUND = FLAG_RHAT | FLAG_ESS | FLAG_BUDGET  # a row whose summary cannot be trusted
SETTLED = 0.95  # the raw top key is settled when P(it stays on top) reaches this
MEANS = ["null_dim", "certified_max", "credible_max", "l1_effective", "l1_constrained", "l1_mean"]


def sample_rows(n_rows: int, k: int, seed: int, seq: int, layer: int) -> tuple[list[int], int]:
    """`k` distinct query rows (sorted), shared by the heads of a layer (they are sampled
    together), and the seed of their chains: the same for the same (seed, seq, layer)."""
    rng = np.random.default_rng([seed, seq, layer])
    rows = sorted(rng.choice(n_rows, size=min(k, n_rows), replace=False).tolist())
    return rows, int(rng.integers(2**31))


def posterior_tables(
    model: TracedModel,
    shard: Sequence[Item],
    first: int,
    advance: Advance,
    *,
    rows_per_head: int = 1,
    samples: int = 200,
    seed: int = 0,
) -> dict[str, pd.DataFrame]:
    """Per sequence, layer, head and sampled row: the posterior's summary against the
    certified interval.

    Table "rows" (one line per sampled row; layers, heads, queries and keys 0-based): seq,
    length, layer, head, query, keys (the row's key-set size), null_dim (dim P_i), the widest
    and the mean certified interval over the row's keys (certified_max, certified_mean), the
    widest and the mean 95 % credible interval (credible_max, credible_mean), width_ratio
    (credible_max / certified_max; NaN when the row cannot move, certified_max < PINNED),
    top_key (the raw row's), p_top_stays (P(it stays on top)), settled (p_top_stays ≥
    SETTLED), ess and rhat (the row's smallest ESS and largest split-R̂; NaN for a point),
    draws, flags (bits, `chains.FLAG_TEXT`), flagged (R̂ > 1.01, ESS below `samples` or
    stopped: its summary is not to be used), flag_text, the top keys of the paper's A_eff
    and of the constrained row (top_effective, top_constrained), and the L1 distances from
    the raw row of A_eff, the constrained row and the posterior mean (l1_effective,
    l1_constrained, l1_mean).

    The certificates and references run on one torch thread (small kernels, which a second
    OpenMP thread slows: benchmarks/records/posterior.md), the compiled chains on every
    thread the caller had. Every row's chains are seeded from (seed, seq, layer), and their
    draws do not depend on the thread count, so a shard's tables do not depend on where it
    runs.
    """
    lanes = torch.get_num_threads()
    records = []
    for k, tr in enumerate(model.trace_many(list(shard), batch_size=8)):
        seq = first + k
        heads = list(range(tr.n_heads))
        for layer in range(tr.n_layers):
            rows, chain_seed = sample_rows(tr.n_tokens, rows_per_head, seed, seq, layer)
            with one_thread():
                post = attention_posterior(
                    tr,
                    layer,
                    heads,
                    rows,
                    samples=samples,
                    seed=chain_seed,
                    progress=False,
                    threads=lanes,
                )
            records += _records(post, seq, tr.n_tokens)
        advance(1)
    return {"rows": pd.DataFrame(records, columns=ROW_COLUMNS)}


def _records(p: AttentionPosterior, seq: int, length: int) -> list[tuple[object, ...]]:
    """One record per (head, row) of a posterior, in ROW_COLUMNS order."""
    certified, credible = p.certified_width, p.credible_width
    stays, top = p.p_top_stays, p.raw.argmax(-1)
    # A_eff is 0 off the key set too, but can be negative there: its top over the keys only
    eff_top = p.effective.masked_fill(~p.keys, -torch.inf).argmax(-1)
    con_top = p.constrained.argmax(-1)
    out: list[tuple[object, ...]] = []
    for h, head in enumerate(p.heads):
        for r, row in enumerate(p.rows):
            keys, raw, flags = p.keys[r], p.raw[h, r], int(p.flags[h, r])
            l1 = [float((x[h, r] - raw).abs().sum()) for x in (p.effective, p.constrained, p.mean)]
            widest, band = float(certified[h, r][keys].max()), float(credible[h, r][keys].max())
            out.append(
                (
                    seq,
                    length,
                    p.layer,
                    head,
                    row,
                    int(keys.sum()),
                    int(p.dim[h, r]),
                    widest,
                    float(certified[h, r][keys].mean()),
                    band,
                    float(credible[h, r][keys].mean()),
                    band / widest if widest >= PINNED else float("nan"),
                    int(top[h, r]),
                    float(stays[h, r]),
                    bool(stays[h, r] >= SETTLED),
                    float(p.ess[h, r]),
                    float(p.rhat[h, r]),
                    int(p.draws[h, r]),
                    flags,
                    bool(flags & UNSOUND),
                    flag_text(flags),
                    int(eff_top[h, r]),
                    int(con_top[h, r]),
                    *l1,
                )
            )
    return out


def posterior_reduce(parts: Sequence[dict[str, pd.DataFrame]]) -> dict[str, pd.DataFrame]:
    """Concatenate the shards' rows and summarise the sound ones by layer and by sequence.

    Tables: rows (as `posterior_tables`); by_layer (layer: rows, points (null_dim 0),
    flagged, then over the sound rows with a null space: used, the means of MEANS, the
    median width_ratio, the share of rows whose top key is not settled, P(top key stays) <
    SETTLED, and the shares whose top key the paper's A_eff and the constrained row move
    elsewhere); by_length (seq, length: the same).
    """
    frames = [p["rows"] for p in parts if "rows" in p and len(p["rows"])]
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=ROW_COLUMNS)
    return {
        "rows": rows,
        "by_layer": _summary(rows, ["layer"]),
        "by_length": _summary(rows, ["seq", "length"]),
    }


def _summary(rows: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Counts of every row, means and shares over the sound rows with a null space."""
    shares = ["unsettled", "effective_moves_top", "constrained_moves_top"]
    cols = [*keys, "rows", "points", "flagged", "used", *MEANS, "median_ratio", *shares]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    rows = rows.assign(
        point=rows["null_dim"] == 0,
        used=(rows["null_dim"] > 0) & ~rows["flagged"].astype(bool),
        unsettled=~rows["settled"].astype(bool),
        effective_moves_top=rows["top_effective"] != rows["top_key"],
        constrained_moves_top=rows["top_constrained"] != rows["top_key"],
    )
    groups = rows.groupby(keys)
    out = groups.agg(
        rows=("query", "size"),
        points=("point", "sum"),
        flagged=("flagged", "sum"),
        used=("used", "sum"),
    )
    sound = rows[rows["used"]].groupby(keys)
    out = out.join(sound[MEANS].mean())
    out["median_ratio"] = sound["width_ratio"].median()
    out = out.join(sound[shares].mean())
    return out.reset_index()[cols]
