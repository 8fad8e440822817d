"""Attention identifiability: null spaces, effective attention and certificates.

Trace-level entry points (definitions in docs/definitions.md):
- `null_space(trace)`: rank(T), dim LN(T), dim LN([T, 1]) per layer, head, row.
- `effective_attention(trace, variant)`: A_eff and the null attention A − A_eff, in
  the trace's precision (`result_dtype`); `iter_effective_attention` streams one layer
  at a time.
- `sink_mass(trace)`: raw and effective attention on the first token per layer and head.
- `ScanResult`: per-head statistics of `identifiable.scan` (a whole model over many
  texts, on its device; the analysis is `scan`).
- `witness(trace, layer, head, row)`, `attention_intervals(...)`: certificates
  that a row's weights are not determined by the head's output.
The linear algebra on plain tensors lives in `linalg`, `causal` and `certificates`;
`tensors` runs these analyses on bare `[L, H, n, n]` attention, values and W_O tensors.
"""

from identifiable.attention import tensors
from identifiable.attention.constrained import ConstrainedAttention, constrained_attention
from identifiable.attention.effective import (
    VARIANTS,
    EffectiveAttention,
    HeadFactors,
    LayerEffective,
    NullSpace,
    Variant,
    compute_head_factors,
    effective_attention,
    iter_effective_attention,
    null_space,
    result_dtype,
)
from identifiable.attention.intervals import (
    AttentionIntervals,
    IntervalMap,
    Witness,
    attention_intervals,
    interval_map,
    witness,
)
from identifiable.attention.posterior import AttentionPosterior, attention_posterior
from identifiable.attention.scan import ScanResult
from identifiable.attention.sinks import SinkMass, sink_mass

__all__ = [
    "VARIANTS",
    "AttentionIntervals",
    "AttentionPosterior",
    "ConstrainedAttention",
    "EffectiveAttention",
    "HeadFactors",
    "IntervalMap",
    "LayerEffective",
    "NullSpace",
    "ScanResult",
    "SinkMass",
    "Variant",
    "Witness",
    "attention_intervals",
    "attention_posterior",
    "compute_head_factors",
    "constrained_attention",
    "effective_attention",
    "interval_map",
    "iter_effective_attention",
    "null_space",
    "result_dtype",
    "sink_mass",
    "tensors",
    "witness",
]
