"""Hidden Token Attribution over a corpus: tidy tables for paper Figs. 3 and 4.

Tables (pandas DataFrames, layers numbered 0..L-1 as on every surface; the paper's layer l is our l-1):
- `tokens`: one row per (sequence, layer, token): own contribution c^l_{i,i}, top
  contributor, whether the own input is the top contributor, share from special tokens.
- `own_summary` (Fig. 3a, 3b): per layer, the distribution of c^l_{i,i} (median,
  quartiles, 5/95 % quantiles, mean) and P̃_l, the share of tokens whose own input is
  not their top contributor.
- `distance` (Fig. 4a): per layer and neighbour-distance group 1, 2, 3, 4-5, 6-10, 11+.
  `per_position_percent` (the figure's quantity): for each token, the summed contribution
  of the inputs in the group divided by the number of such positions; averaged over the
  tokens that have any position in the group; then rescaled so the six groups sum to
  100 % per layer. This removes the fact that far groups hold more positions. The
  unnormalised `total_share_percent` (mean over all tokens of the group's summed
  contribution, so groups plus the own token sum to 100 %) is given beside it.
- `relative_position` (Fig. 4b): per layer and offset r = j − i in −60..60 (r ≠ 0; the
  own token is Fig. 3a), the total contribution Σ c^l_{i,i+r} over all tokens of all
  sequences, and `normalised` = total / its maximum over r for that layer.
- `special`: per layer and special token string ([CLS], [SEP], …, and "any"), the mean
  over non-special tokens i of Σ_{j holding that token} c^l_{i,j}.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from identifiable.attribution.api import HTAResult, TextOrPair, hidden_token_attribution
from identifiable.attribution.memory import DEFAULT_MEMORY_BUDGET
from identifiable.attribution.stats import (
    DISTANCE_GROUPS,
    distance_group_sums,
    own_contribution,
    own_is_top,
    relative_position_totals,
    special_share,
    top_contributor,
)
from identifiable.errors import IdentifiableError
from identifiable.experiments.attribution_summaries import (
    BOOTSTRAP_RESAMPLES,
    bootstrap_summaries,
    estimator_summary,
)
from identifiable.experiments.pipeline import Advance, Item
from identifiable.models.protocol import TracedModel
from identifiable.utils.progress import track
from identifiable.utils.seeds import offset_seed

DISTANCE_NORMALISATION = (
    "per token: summed contribution of the group's positions / number of those positions; "
    "mean over tokens having any position in the group; rescaled to sum to 100% over the "
    "six groups per layer"
)


@dataclass
class AttributionTables:
    tokens: pd.DataFrame
    own_summary: pd.DataFrame
    distance: pd.DataFrame
    relative_position: pd.DataFrame
    special: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    def frames(self) -> dict[str, pd.DataFrame]:
        return {
            "tokens": self.tokens,
            "own_summary": self.own_summary,
            "distance": self.distance,
            "relative_position": self.relative_position,
            "special": self.special,
        }

    def save(self, directory: str | Path) -> list[Path]:
        """Write one CSV per table (`attribution_<name>.csv`), each via temp file + rename."""
        out = Path(directory)
        if not out.is_dir():
            raise IdentifiableError(f"cannot write tables: directory '{out}' does not exist")
        paths = []
        for name, frame in self.frames().items():
            path = out / f"attribution_{name}.csv"
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=out)
            os.close(fd)
            try:
                frame.to_csv(tmp, index=False)
                os.replace(tmp, path)
            except OSError as exc:
                Path(tmp).unlink(missing_ok=True)
                raise IdentifiableError(f"cannot write '{path}': {exc.strerror or exc}") from None
            paths.append(path)
        return paths


class _Accumulator:
    """Running sums over sequences, so a corpus never has to sit in memory as tensors."""

    def __init__(self, max_offset: int) -> None:
        self.max_offset = max_offset
        self.rows: list[pd.DataFrame] = []
        self.n_layers: int | None = None
        self.group_per_pos: torch.Tensor | None = None  # [L, G] Σ over tokens of sum/count
        self.group_tokens = torch.zeros(len(DISTANCE_GROUPS))  # [G] tokens with the group
        self.group_total: torch.Tensor | None = None  # [L, G] Σ over tokens of sums
        self.rel_total: torch.Tensor | None = None  # [L, 2R+1]
        self.rel_pairs = torch.zeros(2 * max_offset + 1, dtype=torch.long)
        self.special: dict[str, torch.Tensor] = {}  # token -> [L] Σ over queries
        self.n_queries = 0  # non-special query tokens
        self.n_tokens = 0
        self.n_sequences = 0

    def add(self, r: HTAResult) -> None:
        c = r.contributions.double()
        big_l, n = c.shape[0], c.shape[1]
        if self.n_layers is None:
            self.n_layers = big_l
            self.group_per_pos = torch.zeros(big_l, len(DISTANCE_GROUPS), dtype=torch.float64)
            self.group_total = torch.zeros_like(self.group_per_pos)
            self.rel_total = torch.zeros(big_l, 2 * self.max_offset + 1, dtype=torch.float64)
        elif big_l != self.n_layers:
            raise IdentifiableError(f"results mix models with {self.n_layers} and {big_l} layers")
        own, top, is_top = own_contribution(c), top_contributor(c), own_is_top(c)
        special = r.special.bool()
        spec_share = special_share(c, special)
        layer = torch.arange(big_l).repeat_interleave(n)
        pos = torch.arange(n).repeat(big_l)
        frame = {
            "sequence": self.n_sequences,
            "layer": layer.numpy(),
            "position": pos.numpy(),
            "token": [r.tokens[i] for i in pos.tolist()],
            "is_special": special[pos].numpy(),
            "own": own.reshape(-1).numpy(),
            "top_contributor": top.reshape(-1).numpy(),
            "top_offset": (top - torch.arange(n)).reshape(-1).numpy(),
            "own_is_top": is_top.reshape(-1).numpy(),
            "special_share": spec_share.reshape(-1).numpy(),
        }
        if r.stderr is not None:
            frame["own_stderr"] = own_contribution(r.stderr.double()).reshape(-1).numpy()
        self.rows.append(pd.DataFrame(frame))

        sums, counts = distance_group_sums(c)  # [L, n, G], [n, G]
        has = counts > 0
        self.group_per_pos += torch.where(has, sums / counts.clamp_min(1), 0.0).sum(1)  # type: ignore[operator]
        self.group_tokens += has.sum(0)
        self.group_total += sums.sum(1)  # type: ignore[operator]
        totals, pairs = relative_position_totals(c, self.max_offset)
        self.rel_total += totals  # type: ignore[operator]
        self.rel_pairs += pairs

        queries = ~special
        for tok in [*sorted({r.tokens[j] for j in range(n) if special[j]}), "any"]:
            mask = special if tok == "any" else special & torch.tensor([t == tok for t in r.tokens])
            share = special_share(c, mask)[:, queries].sum(-1)  # [L]
            self.special[tok] = (
                self.special.get(tok, torch.zeros(big_l, dtype=torch.float64)) + share
            )
        self.n_queries += int(queries.sum())
        self.n_tokens += n
        self.n_sequences += 1

    def tables(self, meta: dict[str, Any]) -> AttributionTables:
        if self.n_sequences == 0 or self.n_layers is None:
            raise IdentifiableError("no sequences to analyse: the corpus is empty")
        tokens = pd.concat(self.rows, ignore_index=True)
        return AttributionTables(
            tokens=tokens,
            own_summary=_own_summary(tokens),
            distance=self._distance(),
            relative_position=self._relative_position(),
            special=self._special(),
            meta={**meta, "n_sequences": self.n_sequences, "n_tokens": self.n_tokens},
        )

    def _distance(self) -> pd.DataFrame:
        assert self.group_per_pos is not None and self.group_total is not None
        per_pos = self.group_per_pos / self.group_tokens.double().clamp_min(1)
        per_pos_pct = 100 * per_pos / per_pos.sum(-1, keepdim=True).clamp_min(1e-300)
        total_pct = 100 * self.group_total / self.n_tokens
        rows = [
            {
                "layer": layer,
                "group": label,
                "per_position_percent": float(per_pos_pct[layer, g]),
                "total_share_percent": float(total_pct[layer, g]),
                "n_tokens": int(self.group_tokens[g]),
                "normalisation": DISTANCE_NORMALISATION,
            }
            for layer in range(per_pos.shape[0])
            for g, (label, _, _) in enumerate(DISTANCE_GROUPS)
        ]
        return pd.DataFrame(rows)

    def _relative_position(self) -> pd.DataFrame:
        assert self.rel_total is not None
        offsets = list(range(-self.max_offset, self.max_offset + 1))
        keep = [k for k, r in enumerate(offsets) if r != 0]
        totals = self.rel_total[:, keep]
        peak = totals.max(-1, keepdim=True).values.clamp_min(1e-300)
        rows = [
            {
                "layer": layer,
                "offset": offsets[k],
                "total": float(totals[layer, col]),
                "normalised": float(totals[layer, col] / peak[layer, 0]),
                "n_pairs": int(self.rel_pairs[k]),
            }
            for layer in range(totals.shape[0])
            for col, k in enumerate(keep)
        ]
        return pd.DataFrame(rows)

    def _special(self) -> pd.DataFrame:
        rows = [
            {
                "layer": layer,
                "special_token": tok,
                "share_percent": 100 * float(v[layer]) / max(self.n_queries, 1),
                "n_queries": self.n_queries,
                "queries": "non-special tokens",
            }
            for tok, v in self.special.items()
            for layer in range(v.shape[0])
        ]
        return pd.DataFrame(
            rows, columns=["layer", "special_token", "share_percent", "n_queries", "queries"]
        )


def _own_summary(tokens: pd.DataFrame) -> pd.DataFrame:
    """Fig. 3a (distribution of c^l_{i,i}) and Fig. 3b (P̃_l) per layer."""
    g = tokens.groupby("layer")
    out = pd.DataFrame(
        {
            "n_tokens": g.size(),
            "median": g["own"].median(),
            "q1": g["own"].quantile(0.25),
            "q3": g["own"].quantile(0.75),
            "p05": g["own"].quantile(0.05),
            "p95": g["own"].quantile(0.95),
            "mean": g["own"].mean(),
            "p_tilde": 1.0 - g["own_is_top"].mean(),
        }
    ).reset_index()
    out["median_percent"] = 100 * out["median"]
    out["p_tilde_percent"] = 100 * out["p_tilde"]
    return out


def attribution_tables(results: Iterable[HTAResult], *, max_offset: int = 60) -> AttributionTables:
    """Tables for Figs. 3-4 from per-sequence results (any iterable, consumed once)."""
    acc = _Accumulator(max_offset)
    probes: set[int | None] = set()
    for r in results:
        acc.add(r)
        probes.add(r.probes)
    return acc.tables({"probes": sorted(probes, key=lambda p: -1 if p is None else p)})


def run_attribution_experiment(
    model: TracedModel,
    texts: Iterable[TextOrPair],
    *,
    probes: int | None = None,
    seed: int = 0,
    limit: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    max_offset: int = 60,
    progress: bool = False,
) -> AttributionTables:
    """Hidden Token Attribution of every text (sequence s uses probe seed `seed + s`,
    `utils.seeds.offset_seed`)."""
    texts_list = (
        list(texts) if limit is None else [t for _, t in zip(range(limit), texts, strict=False)]
    )

    def results() -> Iterable[HTAResult]:
        for s, text in enumerate(texts_list):
            yield hidden_token_attribution(
                model,
                text,
                probes,
                seed=offset_seed(seed, s),
                memory_budget=memory_budget,
                progress=False,
            )

    stream: Iterable[HTAResult] = results()
    stream = track(stream, "attribution", enabled=progress, total=len(texts_list))
    tables = attribution_tables(stream, max_offset=max_offset)
    tables.meta.update({"model": model.info.name, "seed": seed})
    return tables


# ---- the reproduction stage (shard → partial tables) ----------------------------

ATTRIBUTION_COLUMNS = {
    "own": ["seq", "layer", "position", "own", "own_is_top", "special", "own_stderr"],
    "groups": ["seq", "layer", "group", "per_position_sum", "tokens"],
    "offsets": ["seq", "layer", "offset", "total"],
    "specials": ["seq", "layer", "share_sum", "queries"],
}


def attribution_rows(
    seq: int, c: torch.Tensor, special: torch.Tensor, stderr: torch.Tensor | None = None
) -> dict[str, list[tuple]]:
    """Rows of the attribution tables for one sequence, with `identifiable.attribution.stats`.

    c: `[L, n, n]` contributions; special: `[n]` bool; stderr: `[L, n, n]` the estimator's
    standard error of c (None in exact mode: own_stderr is NaN). Tables (see ATTRIBUTION_COLUMNS), all
    of which add up over sequences exactly as `experiments.attribution` aggregates them:
    own: c^l_{i,i} and whether the own input is the top contributor (ties count as top);
    groups: Σ over tokens of (the group's summed contribution / its number of positions), and
    how many tokens have the group at all; offsets: Σ_i c[l, i, i+offset], offsets −60…60;
    specials: Σ over non-special tokens of the share from special inputs, and their number.
    """
    c, special = c.double(), special.bool()
    n_layers, n = c.shape[0], c.shape[1]
    own, is_top = own_contribution(c), own_is_top(c)
    own_err = (
        own_contribution(stderr.double())
        if stderr is not None
        else torch.full_like(own, float("nan"))
    )
    sums, counts = distance_group_sums(c)  # [L, n, G], [n, G]
    per_pos = torch.where(counts > 0, sums / counts.clamp_min(1), 0.0).sum(1)  # [L, G]
    with_group = (counts > 0).sum(0)  # [G]
    totals, _ = relative_position_totals(c, 60)  # [L, 121]
    shares = special_share(c, special)[:, ~special]  # [L, non-special queries]
    span = min(60, n - 1)
    rows: dict[str, list[tuple]] = {name: [] for name in ATTRIBUTION_COLUMNS}
    for layer in range(n_layers):
        rows["own"] += [
            (
                seq,
                layer,
                i,
                float(own[layer, i]),
                bool(is_top[layer, i]),
                bool(special[i]),
                float(own_err[layer, i]),
            )
            for i in range(n)
        ]
        rows["groups"] += [
            (seq, layer, label, float(per_pos[layer, g]), int(with_group[g]))
            for g, (label, _, _) in enumerate(DISTANCE_GROUPS)
        ]
        rows["offsets"] += [
            (seq, layer, off, float(totals[layer, off + 60])) for off in range(-span, span + 1)
        ]
        rows["specials"].append((seq, layer, float(shares[layer].sum()), int(shares.shape[1])))
    return rows


def attribution_shard_tables(
    model: TracedModel,
    shard: Sequence[Item],
    first: int,
    probes: int | None,
    seed: int,
    advance: Advance,
) -> dict[str, pd.DataFrame]:
    """Hidden Token Attribution of each sequence (probe seed `seed + s` for sequence s),
    reduced by `attribution_rows`."""
    rows: dict[str, list[tuple]] = {name: [] for name in ATTRIBUTION_COLUMNS}
    for k, item in enumerate(shard):
        seq_seed = offset_seed(seed, first + k)
        res = hidden_token_attribution(model, item, probes, seed=seq_seed, progress=False)
        rows_k = attribution_rows(first + k, res.contributions, res.special, res.stderr)
        for name, new in rows_k.items():
            rows[name] += new
        advance(1)
    return {
        name: pd.DataFrame(rows[name], columns=cols) for name, cols in ATTRIBUTION_COLUMNS.items()
    }


def items_in_length_range(
    model: TracedModel, items: Sequence[Item], min_tokens: int, max_tokens: int, count: int
) -> list[Item]:
    """The first `count` items whose token count n satisfies min_tokens ≤ n ≤ max_tokens.

    The paper attributes Wikipedia pairs of up to 128 tokens; own contributions and P̃
    depend strongly on n (at the last layer of MiniLM P̃ is about twice as high on ≤ 40-token
    sequences as on 110-token pairs), so the reproduction draws its pairs from a stated
    length range. If too few items qualify, the longest items of at most `max_tokens`
    tokens fill up (so small test corpora still run), in corpus order.
    """
    lengths: list[int] = []
    chosen: list[int] = []
    for i, item in enumerate(items):
        lengths.append(len(model.encode(item, truncate=True)))
        if min_tokens <= lengths[-1] <= max_tokens:
            chosen.append(i)
            if len(chosen) == count:
                return [items[k] for k in chosen]
    rest = [k for k in range(len(items)) if lengths[k] <= max_tokens and k not in set(chosen)]
    rest = sorted(rest, key=lambda k: -lengths[k])[: count - len(chosen)]
    return [items[k] for k in sorted(chosen + rest)]


# ---- bootstrap intervals over sequences (the stage's reduce) -----------------------


def attribution_reduce(
    parts: Sequence[dict[str, pd.DataFrame]],
    *,
    probes: int | None,
    seed: int = 0,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> dict[str, pd.DataFrame]:
    """The attribution stage's reduce: shard tables concatenated, plus the bootstrap summaries
    (`bootstrap_summaries`) and the estimator summary (`estimator_summary`)."""
    from identifiable.experiments.pipeline import concat_reduce

    tables = concat_reduce(parts)
    tables |= bootstrap_summaries(tables, seed=seed, resamples=resamples)
    tables["estimator"] = estimator_summary(tables["own"], probes, resamples)
    return tables
