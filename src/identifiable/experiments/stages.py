"""The reproduction's experiment plan: budgets and the stages, in paper order.

Each stage is cached per shard (see `identifiable.store.cache`) and run by the
machinery in `experiments.pipeline`; `identifiable.reproduction.reproduce` runs them and
renders the report.
  attention    Fig. 1: Pearson r(raw, effective) by length; attention to [CLS]/[SEP]/punctuation
  tokens       Fig. 2: token identifiability per layer and across layers (one shard: probes are
               fitted on all extracted tokens at once)
  attribution  Figs. 3-4: Hidden Token Attribution per sequence
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from identifiable.errors import IdentifiableError
from identifiable.experiments.attention import attention_tables
from identifiable.experiments.attribution import (
    BOOTSTRAP_RESAMPLES,
    attribution_reduce,
    attribution_shard_tables,
    items_in_length_range,
)
from identifiable.experiments.pipeline import (
    Item,
    Stage,
    shard_items,
)
from identifiable.experiments.tokens import token_tables

OUTPUTS = ("index.html", "summary.json", "figures", "tables")


@dataclass(frozen=True)
class Budget:
    """How much of each experiment to run.

    attention_sequences: sequences for Fig. 1. max_tokens: length cap of every
    sequence (the paper uses 128). token_max_tokens: tokens extracted for the Fig. 2
    probes (raised to what the split needs for the model's width, see
    `experiments.tokens.smoke_safe_tokens`). attribution_*: sequences, their length range
    (attribution_min_tokens ≤ n ≤ attribution_max_tokens), and random probes per token for
    Figs. 3-4 (None = exact Jacobian norms). shard_size: sequences per cached shard.
    probe_max_steps: cap on the Adam steps of each Fig. 2 probe (None = the tokens package
    default, which early stopping normally ends first). probe_mlp_width, probe_lr_grid:
    the MLP's hidden width and the Adam learning rates tried (None = the package defaults,
    512 and (3e-4, 1e-3, 3e-3)). bootstrap_resamples: resamples of
    the 95 % intervals over sequences of Figs. 3-4.
    """

    name: str
    attention_sequences: int
    token_max_tokens: int
    attribution_sequences: int
    attribution_max_tokens: int
    attribution_probes: int | None
    shard_size: int = 16
    attribution_shard_size: int = 4
    max_tokens: int = 128
    probe_max_steps: int | None = None
    probe_mlp_width: int | None = None
    probe_lr_grid: tuple[float, ...] | None = None
    attribution_min_tokens: int = 0
    bootstrap_resamples: int = BOOTSTRAP_RESAMPLES


BUDGETS: dict[str, Budget] = {
    # Default: the embedded model on the Wikipedia sample in ≤ 5 minutes on 2 CPU cores.
    "quick": Budget(
        "quick",
        attention_sequences=64,
        # below ~8k tokens the layer-6 probes overfit (linear-cos fell under naive-cos at 1.5k)
        token_max_tokens=8192,
        # probes trained to convergence are the costliest part: a narrower MLP and a
        # two-point learning-rate grid keep the stage within the 5-minute budget (the
        # report's Methods section states it)
        probe_mlp_width=256,
        probe_lr_grid=(1e-3, 3e-3),
        # paper-length pairs (100-128 tokens) cost ~n² each: four of them with two random
        # probes per token (stated error in the report) instead of eight ≤ 40-token ones
        attribution_sequences=4,
        attribution_min_tokens=100,
        attribution_max_tokens=128,
        attribution_probes=2,
        attribution_shard_size=1,
    ),
    # For a GPU or a long run: paper-sized samples, exact attribution.
    "full": Budget(
        "full",
        attention_sequences=1000,
        token_max_tokens=20000,
        attribution_sequences=200,
        attribution_min_tokens=100,
        attribution_max_tokens=128,
        attribution_probes=None,
        shard_size=50,
        attribution_shard_size=10,
    ),
    # Seconds: proves the pipeline runs end to end (tests, installation checks); numbers are noise.
    "smoke": Budget(
        "smoke",
        attention_sequences=6,
        token_max_tokens=400,
        attribution_sequences=2,
        attribution_max_tokens=24,
        attribution_probes=4,
        shard_size=3,
        attribution_shard_size=1,
        max_tokens=40,
        probe_max_steps=2,
    ),
}


# ---- stages ----------------------------------------------------------------------


def stages(model: Any, items: list[Item], budget: Any, seed: int, cache_dir: Path) -> list[Stage]:
    """The three stages in paper order."""
    att_items = items[: budget.attention_sequences]
    att = shard_items(att_items, budget.shard_size)
    attribution_items = items_in_length_range(
        model,
        items,
        getattr(budget, "attribution_min_tokens", 0),
        budget.attribution_max_tokens,
        budget.attribution_sequences,
    )
    hta = shard_items(attribution_items, budget.attribution_shard_size)
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
            # extraction plus probe fitting is the longest single shard: a distributed run
            # starts it first so the other ranks' shards fill the time it takes
            cost=[float("inf")],
        ),
        Stage(
            "attribution",
            "Figs. 3-4  token attribution",
            hta,
            [len(s) for s in hta],
            lambda shard, i, adv: attribution_shard_tables(
                model,
                shard,
                i * budget.attribution_shard_size,
                budget.attribution_probes,
                seed,
                adv,
            ),
            lambda parts: attribution_reduce(
                parts,
                probes=budget.attribution_probes,
                seed=seed,
                resamples=getattr(budget, "bootstrap_resamples", BOOTSTRAP_RESAMPLES),
            ),
        ),
    ]


# ---- budgets -----------------------------------------------------------------------


def resolve_budget(budget: str | Budget) -> Budget:
    if isinstance(budget, Budget):
        return budget
    if budget not in BUDGETS:
        raise IdentifiableError(f"unknown budget '{budget}': choose one of {', '.join(BUDGETS)}")
    return BUDGETS[budget]


def with_budget(name: str, **changes: Any) -> Budget:
    """A named budget with some fields changed (for experiments and tests)."""
    return replace(resolve_budget(name), **changes)
