"""The reproduction's stages: what each shard computes, as tidy tables.

Each stage function gets a shard of corpus items and returns small per-sequence
tables (never n×n matrices), so caches stay small and aggregation is exact.
The maths lives in `identifiable.attention`, `identifiable.tokens` and
`identifiable.attribution`; this module only runs them and tabulates.
Table schemas are documented on each function; layers are 1-based here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from identifiable.errors import IdentifiableError

Item = str | tuple[str, str]
Advance = Callable[[int], None]
PUNCT = {".", ","}


@dataclass
class Stage:
    """A cached unit of work: `compute(shard, index, advance)` per shard; `weights` drive the bar."""

    name: str
    label: str
    shards: list[list[Item]]
    weights: list[int]
    compute: Callable[[Sequence[Item], int, Advance], dict[str, pd.DataFrame]]


def resolve_model(model: Any, device: str = "cpu") -> Any:
    if isinstance(model, str | Path):
        from identifiable.models import load_model

        return load_model(str(model), device=device)
    return model


def resolve_corpus(
    corpus: Any, model: Any, budget: Any, seed: int
) -> tuple[list[Item], dict[str, Any]]:
    """Items (pairs formatted later as [CLS] a [SEP] b [SEP]) and a description for the settings."""
    if isinstance(corpus, str | Path):
        from identifiable.corpus import load_corpus

        c = load_corpus(
            corpus, unit="pair", tokenizer=model.tokenizer, max_tokens=budget.max_tokens, seed=seed
        )
        return list(c), {
            "name": c.name,
            "unit": c.unit,
            "items": len(c),
            "fingerprint": c.fingerprint,
        }
    items = [tuple(x) if isinstance(x, list | tuple) else x for x in corpus]
    if not items or not all(
        isinstance(x, str) or (isinstance(x, tuple) and len(x) == 2) for x in items
    ):
        raise IdentifiableError(
            "corpus must be a corpus name or a non-empty list of texts or (text, text) pairs"
        )
    digest = hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()[:16]
    return items, {"name": "custom", "unit": "given", "items": len(items), "fingerprint": digest}  # type: ignore[return-value]


def _shard(items: Sequence[Item], size: int) -> list[list[Item]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def stages(model: Any, items: list[Item], budget: Any, seed: int, cache_dir: Path) -> list[Stage]:
    """The three stages in paper order."""
    att_items = items[: budget.attention_sequences]
    att = _shard(att_items, budget.shard_size)
    attribution_items = short_items(
        model, items, budget.attribution_max_tokens, budget.attribution_sequences
    )
    hta = _shard(attribution_items, budget.attribution_shard_size)
    n_layers = model.info.n_layers
    return [
        Stage(
            "attention",
            "Fig. 1  effective attention",
            att,
            [len(s) for s in att],
            lambda shard, i, adv: attention_tables(model, shard, i * budget.shard_size, adv),
        ),
        Stage(
            "tokens",
            "Fig. 2  token identifiability",
            [list(items)],
            [n_layers],
            lambda shard, i, adv: token_tables(
                model, shard, budget, seed, cache_dir / "token-pairs", adv
            ),
        ),
        Stage(
            "attribution",
            "Figs. 3-4  token attribution",
            hta,
            [len(s) for s in hta],
            lambda shard, i, adv: attribution_tables(
                model,
                shard,
                i * budget.attribution_shard_size,
                budget.attribution_probes,
                seed,
                adv,
            ),
        ),
    ]


def short_items(model: Any, items: Sequence[Item], max_tokens: int, count: int) -> list[Item]:
    """The first `count` items of at most `max_tokens` tokens (attribution costs O(n²·d));
    if fewer exist, the shortest items instead, so that the stage always has work."""
    lengths: list[int] = []
    short: list[int] = []
    for i, item in enumerate(items):
        lengths.append(len(model.encode(item, truncate=True)))
        if lengths[-1] <= max_tokens:
            short.append(i)
            if len(short) == count:
                return [items[k] for k in short]
    shortest = sorted(sorted(range(len(items)), key=lambda k: lengths[k])[:count])
    return [items[k] for k in shortest]


# ---- Fig. 1 -------------------------------------------------------------------------


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
    model: Any, shard: Sequence[Item], first: int, advance: Advance
) -> dict[str, pd.DataFrame]:
    """Per sequence: r(raw, effective) pooled and per layer, null dims, attention to targets.

    Tables: by_length (seq, length, pearson_r, null_dim_mean);
    by_layer (seq, length, layer, pearson_r); to_tokens (seq, layer, head, kind, target, value),
    value = mean over query tokens of the summed weight on the target keys (SPEC §2).
    """
    from identifiable.attention import compute_head_factors, iter_effective_attention
    from identifiable.attention.stats import attention_to, pearson_from_sums, pearson_sums

    by_length, by_layer, to_tokens = [], [], []
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
        for le in iter_effective_attention(tr, "paper", factors=factors):
            sums = pearson_sums(le.raw, le.effective, visible)  # float64, shared with Fig. 1
            pooled += sums
            dims.append(le.dim[:, -1].double())
            by_layer.append((seq, n, le.layer + 1, pearson_from_sums(sums)))
            for kind, mat in (("raw", le.raw), ("effective", le.effective)):
                for target, pos in targets.items():
                    if not pos:
                        continue
                    keys = torch.zeros(n, dtype=torch.bool)
                    keys[pos] = True
                    values = attention_to(mat, keys)  # [H]
                    to_tokens.extend(
                        (seq, le.layer + 1, h, kind, target, float(v)) for h, v in enumerate(values)
                    )
        by_length.append((seq, n, pearson_from_sums(pooled), float(torch.cat(dims).mean())))
        advance(1)
    return {
        "by_length": pd.DataFrame(
            by_length, columns=["seq", "length", "pearson_r", "null_dim_mean"]
        ),
        "by_layer": pd.DataFrame(by_layer, columns=["seq", "length", "layer", "pearson_r"]),
        "to_tokens": pd.DataFrame(
            to_tokens, columns=["seq", "layer", "head", "kind", "target", "value"]
        ),
    }


# ---- Fig. 2 -------------------------------------------------------------------------


def token_tables(
    model: Any, items: Sequence[Item], budget: Any, seed: int, cache_dir: Path, advance: Advance
) -> dict[str, pd.DataFrame]:
    """Tables per_layer, cross_layer, control of `identifiable.experiments.tokens` (layers 1-based)."""
    from identifiable.experiments.tokens import extract
    from identifiable.tokens.evaluate import evaluate_pairs
    from identifiable.tokens.probes import ProbeConfig

    # Extracted hidden states are cached by the tokens package itself, so a run killed
    # while fitting probes does not trace the corpus again.
    pairs, _ = extract(model, list(items), max_tokens=budget.token_max_tokens, cache_dir=cache_dir)
    config = (
        ProbeConfig(max_steps=budget.probe_max_steps) if budget.probe_max_steps else ProbeConfig()
    )
    ev = evaluate_pairs(pairs, seed=seed, probe_config=config, on_layer=lambda _layer: advance(1))
    return {
        "per_layer": ev.per_layer.reset_index(drop=True),
        "cross_layer": ev.cross_layer.reset_index(drop=True),
        "control": ev.control.reset_index(drop=True),
        "counts": pd.DataFrame({"n_tokens": [pairs.n_tokens], "n_sequences": [pairs.n_sequences]}),
    }


# ---- Figs. 3-4 ----------------------------------------------------------------------


ATTRIBUTION_COLUMNS = {
    "own": ["seq", "layer", "position", "own", "own_is_top", "special"],
    "groups": ["seq", "layer", "group", "per_position_sum", "tokens"],
    "offsets": ["seq", "layer", "offset", "total"],
    "specials": ["seq", "layer", "share_sum", "queries"],
}


def reduce_attribution(seq: int, c: torch.Tensor, special: torch.Tensor) -> dict[str, list[tuple]]:
    """Rows of the attribution tables for one sequence, with `identifiable.attribution.stats`.

    c: `[L, n, n]` contributions; special: `[n]` bool. Tables (see ATTRIBUTION_COLUMNS), all
    of which add up over sequences exactly as `experiments.attribution` aggregates them:
    own: c^l_{i,i} and whether the own input is the top contributor (ties count as top);
    groups: Σ over tokens of (the group's summed contribution / its number of positions), and
    how many tokens have the group at all; offsets: Σ_i c[l, i, i+offset], offsets −60…60;
    specials: Σ over non-special tokens of the share from special inputs, and their number.
    """
    from identifiable.attribution.stats import (
        DISTANCE_GROUPS,
        distance_group_sums,
        own_contribution,
        own_is_top,
        relative_position_totals,
        special_share,
    )

    c, special = c.double(), special.bool()
    n_layers, n = c.shape[0], c.shape[1]
    own, is_top = own_contribution(c), own_is_top(c)
    sums, counts = distance_group_sums(c)  # [L, n, G], [n, G]
    per_pos = torch.where(counts > 0, sums / counts.clamp_min(1), 0.0).sum(1)  # [L, G]
    with_group = (counts > 0).sum(0)  # [G]
    totals, _ = relative_position_totals(c, 60)  # [L, 121]
    shares = special_share(c, special)[:, ~special]  # [L, non-special queries]
    span = min(60, n - 1)
    rows: dict[str, list[tuple]] = {name: [] for name in ATTRIBUTION_COLUMNS}
    for layer in range(n_layers):
        rows["own"] += [
            (seq, layer + 1, i, float(own[layer, i]), bool(is_top[layer, i]), bool(special[i]))
            for i in range(n)
        ]
        rows["groups"] += [
            (seq, layer + 1, label, float(per_pos[layer, g]), int(with_group[g]))
            for g, (label, _, _) in enumerate(DISTANCE_GROUPS)
        ]
        rows["offsets"] += [
            (seq, layer + 1, off, float(totals[layer, off + 60])) for off in range(-span, span + 1)
        ]
        rows["specials"].append((seq, layer + 1, float(shares[layer].sum()), int(shares.shape[1])))
    return rows


def attribution_tables(
    model: Any, shard: Sequence[Item], first: int, probes: int | None, seed: int, advance: Advance
) -> dict[str, pd.DataFrame]:
    """Hidden Token Attribution of each sequence (probe seed `seed + s` for sequence s),
    reduced by `reduce_attribution`."""
    from identifiable.attribution import hidden_token_attribution

    rows: dict[str, list[tuple]] = {name: [] for name in ATTRIBUTION_COLUMNS}
    for k, item in enumerate(shard):
        res = hidden_token_attribution(model, item, probes, seed=seed + first + k)
        for name, new in reduce_attribution(first + k, res.contributions, res.special).items():
            rows[name] += new
        advance(1)
    return {
        name: pd.DataFrame(rows[name], columns=cols) for name, cols in ATTRIBUTION_COLUMNS.items()
    }
