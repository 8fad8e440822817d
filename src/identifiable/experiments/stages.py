"""The reproduction's experiment plan: budgets and the stages, in paper order.

Each stage is cached per shard (see `identifiable.store.cache`) and run by the
machinery in `experiments.pipeline`; `identifiable.runs.reproduce.reproduce` runs them and
renders the report.
  attention    Fig. 1: Pearson r(raw, effective) by length; attention to [CLS]/[SEP]/punctuation
  tokens       Fig. 2: token identifiability per layer and across layers (one shard: probes are
               fitted on all extracted tokens at once)
  attribution  Figs. 3-4: Hidden Token Attribution per sequence
  mixing       beyond the paper: which account of context mixing tracks HTA and erasure
  certify      beyond the paper: interval maps and constrained effective attention
  posterior    beyond the paper: the posterior over valid attention rows against the intervals
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from identifiable.errors import IdentifiableError
from identifiable.experiments.attention import attention_tables
from identifiable.experiments.attribution import (
    BOOTSTRAP_RESAMPLES,
    attribution_reduce,
    attribution_shard_tables,
    items_in_length_range,
)
from identifiable.experiments.certify import certify_reduce, certify_tables
from identifiable.experiments.mixing import DEFAULT_METHODS, mixing_tables, reduce_mixing
from identifiable.experiments.pipeline import (
    Item,
    Stage,
    concat_reduce,
    shard_items,
)
from identifiable.experiments.posterior import posterior_reduce, posterior_tables
from identifiable.experiments.tokens import SharedPairs, probe_device, token_tables
from identifiable.mixing import unavailable
from identifiable.tokens.evaluate import fit_workers


@dataclass(frozen=True)
class Budget:
    """How much of each experiment to run.

    attention_sequences: sequences for Fig. 1. max_tokens: length cap of every
    sequence (the paper uses 128). token_max_tokens: tokens extracted for the Fig. 2
    probes (raised to what the split needs for the model's width, see
    `experiments.tokens.smoke_safe_tokens`). attribution_*: sequences, their length range
    (attribution_min_tokens ≤ n ≤ attribution_max_tokens), and random probes per token for
    Figs. 3-4 (None = exact Jacobian norms). shard_size: sequences per cached shard.
    probe_max_steps: cap on the Adam steps and L-BFGS iterations of each Fig. 2 probe (None =
    the tokens package defaults, which early stopping normally ends first; smoke caps them).
    probe_mlp_width, probe_lr_grid: the MLP's hidden width and the Adam learning rates tried
    (None = the package defaults, "auto" = max(512, d) and (3e-3, 1e-2)). probe_select_steps,
    probe_patience, probe_lr_decays: the MLPs' Adam schedule (steps per learning rate tried,
    checks without improvement before a decay, decays before the stop; None = the defaults). bootstrap_resamples: resamples of
    the 95 % intervals over sequences of Figs. 3-4.
    mixing_*: sequences (of at most mixing_max_tokens tokens) for "which account of mixing
    tracks the gradients?", and HTA's random probes there (None = exact).
    certify_*: sequences for "how far can attention really move?", and query rows sampled
    per head (every head of every layer) for their interval maps.
    posterior_*: sequences for "how uncertain is attention?" (of d_v + 2 to d_v + 1 +
    posterior_null_dim tokens, d_v the head width: a row's null space, and the cost of its
    posterior, grow with n − d_v), query rows sampled per head (shared by the heads of a
    layer) and the effective samples asked of each row's posterior. pipeline_check: the
    budget only proves that the pipeline runs (smoke): the report shows no verdict badges
    or claim counts as findings.
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
    probe_select_steps: int | None = None
    probe_patience: int | None = None
    probe_lr_decays: int | None = None
    attribution_min_tokens: int = 0
    bootstrap_resamples: int = BOOTSTRAP_RESAMPLES
    mixing_sequences: int = 2
    mixing_max_tokens: int = 64
    mixing_probes: int | None = 4
    certify_sequences: int = 2
    certify_rows_per_head: int = 1
    posterior_sequences: int = 2
    posterior_null_dim: int = 16
    posterior_rows_per_head: int = 1
    posterior_samples: int = 200
    pipeline_check: bool = False


BUDGETS: dict[str, Budget] = {
    # Default: the embedded model on the Wikipedia sample in about 3 minutes on 2 threads.
    "quick": Budget(
        "quick",
        attention_sequences=64,
        # below ~8k tokens the layer-6 probes overfit (linear-cos fell under naive-cos at 1.5k)
        token_max_tokens=8192,
        # Fig. 2 probes use the package protocol (tokens.ProbeConfig: linear-cos by L-BFGS,
        # MLPs 2d wide from the linear probe by Adam with learning-rate decay to early
        # stopping), with a cap above what early stopping needed on MiniLM (≤ 1,175 steps): a
        # capped fit still improving by more than 1 % is marked and left out of the verdicts
        probe_max_steps=1500,
        # 3 checks of patience and one learning-rate decay: 0.63x the Adam steps of 5 and 2,
        # MiniLM's rates within a test token or two (benchmarks/records/base_reproduction.md)
        probe_patience=3,
        probe_lr_decays=1,
        # paper-length pairs (100-128 tokens) cost ~n² each: four of them with two random
        # probes per token (stated error in the report) instead of eight ≤ 40-token ones
        attribution_sequences=4,
        attribution_min_tokens=100,
        attribution_max_tokens=128,
        attribution_probes=2,
        attribution_shard_size=1,
    ),
    # The paper's protocol at the paper's lengths (`full` is accepted as an older name).
    # Known from the paper: Wikipedia pairs [CLS] a [SEP] b [SEP] of up to 128 tokens, HTA on
    # them. Assumed (the paper gives no counts we could establish): 1,000 sequences for Fig. 1,
    # 20,000 probe tokens for Fig. 2, 100 pairs of 100-128 tokens for Figs. 3-4. HTA uses the
    # 4-probe estimator (its standard error is reported): exact HTA is n·d = ~46,000 JVPs per
    # pair, 42 min per pair on one CPU core (18 JVPs/s measured at n = 120), so 100 exact pairs
    # would take 70 core-hours; 4 probes take 25 s per pair.
    "paper": Budget(
        "paper",
        attention_sequences=1000,
        token_max_tokens=20000,
        attribution_sequences=100,
        attribution_min_tokens=100,
        attribution_max_tokens=128,
        attribution_probes=4,
        shard_size=50,
        attribution_shard_size=5,
        mixing_sequences=20,
        mixing_max_tokens=128,
        mixing_probes=4,
        certify_sequences=10,
        certify_rows_per_head=4,
        # a row's posterior costs ~dim P^1.25 (billiard walk): the cost model puts 10 pairs of
        # ≤ 128 tokens, 2 rows per head, at over an hour on 2 threads
        posterior_sequences=8,
        posterior_null_dim=32,
        posterior_samples=400,
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
        mixing_sequences=1,
        mixing_max_tokens=24,
        mixing_probes=2,
        certify_sequences=1,
        posterior_sequences=1,
        posterior_null_dim=8,
        posterior_samples=20,
        pipeline_check=True,
    ),
}


# ---- stages ----------------------------------------------------------------------

MIXING_SHARD = 1  # sequences per cached mixing shard (each costs seconds)


def _mixing_reduce(
    parts: Sequence[dict[str, pd.DataFrame]], seed: int, skipped: dict[str, str]
) -> dict[str, pd.DataFrame]:
    """Per-sequence correlations in shard order, their means with bootstrap intervals, and
    the methods that could not run on the model (`mixing.unavailable`) with the reason."""
    table = concat_reduce(parts)["correlations"]
    unavailable = pd.DataFrame(
        {"method": list(skipped), "reason": list(skipped.values())}, dtype=object
    )
    return {
        "correlations": table,
        "summary": reduce_mixing(table, seed=seed),
        "unavailable": unavailable,
    }


def _samples(model: Any, items: list[Item], budget: Any) -> tuple[list[list[Item]], ...]:
    """The shards of the attention, attribution, mixing, certify and posterior stages (the
    tokens stage reads every item)."""
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
    # the two analyses beyond the paper, on their own (shorter) samples: both cost ~n² per
    # sequence and layer, so their budgets are counted in sequences of bounded length
    mixing_items = items_in_length_range(
        model, items, 0, budget.mixing_max_tokens, budget.mixing_sequences
    )
    mix = shard_items(mixing_items, MIXING_SHARD)
    cert = shard_items(items[: budget.certify_sequences], 1)
    # a posterior costs ~dim P^2 per row (hit-and-run up to dim 16), dim P ≈ n − d_v − 1
    d_v = int(model.info.head_dim)
    post_items = items_in_length_range(
        model, items, d_v + 2, d_v + 1 + budget.posterior_null_dim, budget.posterior_sequences
    )
    return att, hta, mix, cert, shard_items(post_items, 1)


def stages(model: Any, items: list[Item], budget: Any, seed: int, cache_dir: Path) -> list[Stage]:
    """The paper's three stages in paper order, then context mixing, certified attention
    and the attention posterior."""
    att, hta, mix, cert, post = _samples(model, items, budget)
    n_layers = model.info.n_layers
    # what each method needs of the model is checked here, before the first stage starts:
    # a method that cannot run on this family is left out and named in its section
    skipped = unavailable(model, DEFAULT_METHODS)
    methods = tuple(m for m in DEFAULT_METHODS if m not in skipped)
    pairs = SharedPairs(model, items, budget, cache_dir / "token-pairs")  # read by every layer
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
            # one shard per layer, each over the same items (their hidden states are
            # extracted once into the token cache): the probes of different layers are
            # fitted independently, so ranks can share them
            [list(items) for _ in range(n_layers)],
            [1] * n_layers,
            lambda shard, i, adv: token_tables(
                model, shard, budget, seed, pairs.cache_dir, adv, layer=i + 1, pairs=pairs
            ),
            # probe fitting is the costliest work: a distributed run starts it first so the
            # other ranks' shorter shards fill the gaps at the end
            cost=[1e9] * n_layers,
            workers=fit_workers(None, probe_device(model), n_layers),  # a layer per thread
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
        Stage(
            "mixing",
            "Beyond: context mixing vs HTA",
            mix,
            [len(x) for x in mix],
            lambda shard, i, adv: mixing_tables(
                model,
                shard,
                i * MIXING_SHARD,
                adv,
                methods=methods,
                seed=seed,
                probes=budget.mixing_probes,
            ),
            lambda parts: _mixing_reduce(parts, seed, skipped),
        ),
        *_sampled_rows_stages(model, cert, post, budget, seed),
    ]


def _sampled_rows_stages(
    model: Any, cert: list[list[Item]], post: list[list[Item]], budget: Any, seed: int
) -> list[Stage]:
    """Beyond the paper, on sampled query rows of every head (one sequence per shard):
    certified attention, then the attention posterior."""
    certify = Stage(
        "certify",
        "Beyond: certified attention",
        cert,
        [len(x) for x in cert],
        lambda shard, i, adv: certify_tables(
            model, shard, i, adv, rows_per_head=budget.certify_rows_per_head, seed=seed
        ),
        certify_reduce,
    )
    return [
        certify,
        Stage(
            "posterior",
            "Beyond: attention posterior",
            post,
            [len(x) for x in post],
            lambda shard, i, adv: posterior_tables(
                model,
                shard,
                i,
                adv,
                rows_per_head=budget.posterior_rows_per_head,
                samples=budget.posterior_samples,
                seed=seed,
            ),
            posterior_reduce,
        ),
    ]


# ---- budgets -----------------------------------------------------------------------


ALIASES = {"full": "paper"}


def resolve_budget(budget: str | Budget) -> Budget:
    if isinstance(budget, Budget):
        return budget
    budget = ALIASES.get(budget, budget)
    if budget not in BUDGETS:
        raise IdentifiableError(f"unknown budget '{budget}': choose one of {', '.join(BUDGETS)}")
    return BUDGETS[budget]


def with_budget(name: str, **changes: Any) -> Budget:
    """A named budget with some fields changed (for experiments and tests)."""
    return replace(resolve_budget(name), **changes)
