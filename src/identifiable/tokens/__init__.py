"""Token identifiability (paper §4, Fig. 2): can e^0_i be recovered from e^l_i?

Pieces, all pure functions on tensors:
- `extract`: stream (e^l_i, e^0_i) of every layer from Traces into bounded `TokenPairs`;
- `cache`: safetensors + manifest on disk, checksummed and keyed by model/corpus/settings;
- `split`: train / validation / test by sequence;
- `probes` + `fitting`: naive / linear / MLP probes with L2 or cosine objectives;
- `lookup`: batched nearest-neighbour look-up with tie accounting, Wilson intervals;
- `evaluate`: all of it per layer, plus the shuffled control and the cross-layer matrix.

The model-and-corpus entry point is `identifiable.experiments.tokens.token_identifiability`.
"""

from identifiable.tokens.cache import CacheCorruptWarning, CacheMismatchError
from identifiable.tokens.evaluate import CANDIDATES, Evaluation, evaluate_pairs
from identifiable.tokens.extract import TokenPairs, collect_token_pairs
from identifiable.tokens.fitting import RidgeSolver, fit_probes
from identifiable.tokens.lookup import wilson_interval
from identifiable.tokens.probes import OBJECTIVES, PROBE_KINDS, Probe, ProbeConfig
from identifiable.tokens.split import SequenceSplit, split_by_sequence

__all__ = [
    "CANDIDATES",
    "OBJECTIVES",
    "PROBE_KINDS",
    "CacheCorruptWarning",
    "CacheMismatchError",
    "Evaluation",
    "Probe",
    "ProbeConfig",
    "RidgeSolver",
    "SequenceSplit",
    "TokenPairs",
    "collect_token_pairs",
    "evaluate_pairs",
    "fit_probes",
    "split_by_sequence",
    "wilson_interval",
]
