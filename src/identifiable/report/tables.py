"""The contract between the stages and the report: the tables each stage hands over.

A run's results map a stage name to its tables (name → DataFrame), as the pipeline
caches and reduces them. The report reads them only through the dataclasses below:
`AttentionStageTables.of(results)` checks that the stage ran and that every table the report
needs is there, and raises one `IdentifiableError` naming the stage and the table
otherwise. So a table renamed on one side is an error, never a silently empty figure, and
a field renamed on the report's side is a type error (mypy).

Floor 0 (tests/house/test_layering.py): `experiments/` (which writes the tables) and
`report/` (which reads them) both import it. A stage may hand over more tables than
listed (they are cached and ignored); the listed ones are required.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from identifiable.errors import IdentifiableError

if TYPE_CHECKING:  # pandas is not imported at run time here: the CLI starts without it
    import pandas as pd

Results = Mapping[str, Mapping[str, Any]]
"""stage name → table name → `pandas.DataFrame`."""

T = TypeVar("T", bound="StageTables")


@dataclass(frozen=True)
class StageTables:
    """Base of the per-stage contracts: each field is one table (a `pandas.DataFrame`)."""

    STAGE: ClassVar[str]

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The tables the report reads from this stage, in field order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of(cls: type[T], results: Results) -> T:
        """This stage's tables out of `results`; raises naming the stage and the table
        when the stage or one of its tables is missing."""
        if cls.STAGE not in results:
            ran = ", ".join(sorted(results)) or "none"
            raise IdentifiableError(
                f"the results hold no stage '{cls.STAGE}' (stages: {ran}); the report needs "
                f"its tables {', '.join(cls.names())}"
            )
        tables = results[cls.STAGE]
        missing = [name for name in cls.names() if name not in tables]
        if missing:
            given = ", ".join(sorted(tables)) or "none"
            raise IdentifiableError(
                f"stage '{cls.STAGE}' gave no table '{missing[0]}' (it gave: {given}); the "
                "report needs every table in identifiable.report.tables."
                f"{cls.__name__}. A shard cache written by another version lacks it: run "
                "again without --resume"
            )
        return cls(**{name: tables[name] for name in cls.names()})

    @classmethod
    def optional(cls: type[T], results: Results) -> T | None:
        """As `of`, for a stage beyond the paper that a run may leave out: None when the
        stage did not run; a stage that ran must still hand over every table."""
        return cls.of(results) if cls.STAGE in results else None


@dataclass(frozen=True)
class AttentionStageTables(StageTables):
    """Fig. 1 (`experiments.attention.attention_tables`, concatenated over shards)."""

    STAGE: ClassVar[str] = "attention"
    by_length: pd.DataFrame  # r(raw, effective attention) per sequence
    by_layer: pd.DataFrame  # the same per sequence and layer
    to_tokens: pd.DataFrame  # attention to token categories, per sequence and head
    output_change: pd.DataFrame  # change of the head output when A is replaced by A_eff


@dataclass(frozen=True)
class DecoderStageTables(StageTables):
    """The attention stage's decoder tables (`experiments.attention.CausalRows`): handed
    over for causal models only, and then required (`of`) by the decoder section."""

    STAGE: ClassVar[str] = "attention"
    sinks: pd.DataFrame  # raw and effective attention on the first key, per sequence and head
    by_prefix: pd.DataFrame  # null dim and null fraction per query row (prefix length)


@dataclass(frozen=True)
class TokenStageTables(StageTables):
    """Fig. 2 (`experiments.tokens.token_tables`, one shard per layer)."""

    STAGE: ClassVar[str] = "tokens"
    per_layer: pd.DataFrame  # identifiability per layer, probe and objective
    control: pd.DataFrame  # the same with shuffled targets
    fits: pd.DataFrame  # the probes' fits (convergence)
    grid: pd.DataFrame  # the hyper-parameter grid searched on validation
    counts: pd.DataFrame  # token and sequence counts of the split (one row)
    protocol: pd.DataFrame  # the probe settings (one row)
    cross_layer: pd.DataFrame  # probes trained on one layer, tested on another


@dataclass(frozen=True)
class AttributionStageTables(StageTables):
    """Figs. 3-4 (`experiments.attribution.attribution_reduce`)."""

    STAGE: ClassVar[str] = "attribution"
    own: pd.DataFrame  # the share of each token's own input, per layer
    groups: pd.DataFrame  # contributions of neighbour groups
    offsets: pd.DataFrame  # contributions by relative position
    specials: pd.DataFrame  # share from special tokens
    trends: pd.DataFrame  # the trends over depth with intervals
    own_summary: pd.DataFrame  # bootstrap summary of `own` per layer
    groups_summary: pd.DataFrame  # bootstrap summary of `groups`
    offsets_summary: pd.DataFrame  # bootstrap summary of `offsets`
    estimator: pd.DataFrame  # exact or probes, sample sizes (one row)


@dataclass(frozen=True)
class MixingStageTables(StageTables):
    """Beyond the paper: context mixing (`experiments.mixing`, reduced by `stages`)."""

    STAGE: ClassVar[str] = "mixing"
    correlations: pd.DataFrame  # per sequence: correlations of each mixing method with HTA
    summary: pd.DataFrame  # their means with bootstrap intervals
    unavailable: pd.DataFrame  # methods that cannot run on the model: method, reason


@dataclass(frozen=True)
class CertifyStageTables(StageTables):
    """Beyond the paper: certified attention (`experiments.certify.certify_reduce`)."""

    STAGE: ClassVar[str] = "certify"
    rows: pd.DataFrame  # one row per certified query row
    by_layer: pd.DataFrame  # per layer summary
    by_length: pd.DataFrame  # per sequence summary


@dataclass(frozen=True)
class PosteriorStageTables(StageTables):
    """Beyond the paper: the attention posterior (`experiments.posterior.posterior_reduce`)."""

    STAGE: ClassVar[str] = "posterior"
    rows: pd.DataFrame  # one row per sampled query row: widths, P(top stays), ESS, R̂, flags
    by_layer: pd.DataFrame  # per layer: counts, means over the sound rows
    by_length: pd.DataFrame  # per sequence: the same


@dataclass(frozen=True)
class ScanStageTables(StageTables):
    """Beyond the paper: a whole-model scan (`experiments.scan`, concatenated over shards in
    text order; `identifiable.scan` builds its `ScanResult` from them). Not in `CONTRACTS`
    until a report section reads it (a decoder section's sink table: `heads` grouped by
    layer, sink_raw against sink_effective)."""

    STAGE: ClassVar[str] = "scan"
    heads: pd.DataFrame  # text, layer, head, then attention.scan.STATISTICS (one row per head)
    texts: pd.DataFrame  # text, n, truncated, preview (one row per text)
    kept: pd.DataFrame  # the kept maps, one row per query row (empty without keep=)


CONTRACTS: tuple[type[StageTables], ...] = (
    AttentionStageTables,
    TokenStageTables,
    AttributionStageTables,
    MixingStageTables,
    CertifyStageTables,
    PosteriorStageTables,
)
"""Every stage the report reads, in report order."""
