"""Which account of mixing tracks the gradients? Per-layer rank agreement with HTA and erasure.

Stage (`mixing_tables`), per sequence s, layer l, method m and reference r ∈ {hta, erasure}:
take the method's input → layer-l map (`MixingResult.global_map`: the rollout where the
method defines one, else its layer map) and the reference's map; for every row i (the
receiving token) compute Spearman's ρ between the two rows over the tokens j the row can
see (all j; j ≤ i in causal models); average over the rows where ρ is defined (a row with
fewer than 3 visible tokens or a constant row has none). Table `correlations`: seq, length,
layer (0-based), method, reference, spearman, rows.

Reduce (`reduce_mixing`): per layer, method and reference, the mean over sequences and a
percentile-bootstrap 95 % interval over sequences (seeded; the same resamples for every
group with the same sequences, so the intervals are paired and deterministic).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from identifiable.errors import IdentifiableError
from identifiable.models.protocol import TracedModel
from identifiable.utils.seeds import offset_seed

Item = str | tuple[str, str]
Advance = Callable[[int], None]
REFERENCES = ("hta", "erasure")
DEFAULT_METHODS = (
    "attention",
    "rollout",
    "effective-rollout",
    "norm",
    "globenc",
    "alti",
    "value-zeroing",
    "grad-input",
)
CORRELATION_COLUMNS = ["seq", "length", "layer", "method", "reference", "spearman", "rows"]
SUMMARY_COLUMNS = [
    "layer",
    "method",
    "reference",
    "mean",
    "ci_low",
    "ci_high",
    "n_sequences",
]


def row_spearman(a: np.ndarray, b: np.ndarray, causal: bool) -> np.ndarray:
    """`[L, n]` Spearman's ρ of a[l, i, :] and b[l, i, :] over the visible keys (NaN where
    undefined). Ranks are average ranks (ties share them), ρ = Pearson of the ranks.

    Args: a, b `[L, n, n]`; causal: row i sees keys 0..i only.
    """
    n_layers, n, _ = a.shape
    out = np.full((n_layers, n), np.nan)
    for i in range(n):
        k = i + 1 if causal else n
        if k < 3:
            continue
        ra = rankdata(a[:, i, :k], axis=-1)
        rb = rankdata(b[:, i, :k], axis=-1)
        ra -= ra.mean(-1, keepdims=True)
        rb -= rb.mean(-1, keepdims=True)
        denom = np.sqrt((ra**2).sum(-1) * (rb**2).sum(-1))
        with np.errstate(invalid="ignore", divide="ignore"):
            out[:, i] = np.where(denom > 0, (ra * rb).sum(-1) / denom, np.nan)
    return out


def mixing_tables(
    model: TracedModel,
    shard: Sequence[Item],
    first: int,
    advance: Advance,
    *,
    methods: Sequence[str] = DEFAULT_METHODS,
    seed: int = 0,
    probes: int | None = None,
) -> dict[str, pd.DataFrame]:
    """Per-sequence, per-layer rank agreement of each method with HTA and erasure.

    Args:
        model: an `identifiable.models.Model`.
        shard: texts or pairs; sequence ids are first, first + 1, ….
        first: id of the shard's first sequence.
        advance: called with 1 after each sequence (progress).
        methods: registry names to evaluate; a reference listed here is compared with
            the other reference only.
        seed: HTA's probe seed is seed + sequence id (used only with `probes`).
        probes: None for exact HTA, or k probes per token (estimated).
    Returns:
        {"correlations": DataFrame with CORRELATION_COLUMNS}.
    """
    from identifiable.mixing import context_mixing, get_method

    for name in methods:
        get_method(name)  # unknown names fail before any work
    rows: list[tuple] = []
    for k, item in enumerate(shard):
        seq = first + k
        refs = {
            "hta": context_mixing(
                model, item, "hta", probes=probes, seed=offset_seed(seed, seq), progress=False
            ),
            "erasure": context_mixing(model, item, "erasure", progress=False),
        }
        causal = refs["hta"].is_causal
        n = refs["hta"].n_tokens
        for name in methods:
            res = refs[name] if name in refs else context_mixing(model, item, name, progress=False)
            a = res.global_map.numpy()
            for ref_name, ref in refs.items():
                if ref_name == name:
                    continue
                rho = row_spearman(a, ref.global_map.numpy(), causal)
                for layer in range(rho.shape[0]):
                    defined = rho[layer][~np.isnan(rho[layer])]
                    mean = float(defined.mean()) if defined.size else float("nan")
                    rows.append((seq, n, layer, name, ref_name, mean, int(defined.size)))
        advance(1)
    return {"correlations": pd.DataFrame(rows, columns=CORRELATION_COLUMNS)}


def reduce_mixing(table: pd.DataFrame, *, seed: int = 0, n_boot: int = 2000) -> pd.DataFrame:
    """Mean over sequences and bootstrap 95 % interval per (layer, method, reference).

    Sequences whose spearman is NaN are left out of their group. Resamples come from
    `numpy.random.default_rng((seed, S))` for a group of S sequences, so every group with
    the same sequences is resampled identically and the result is deterministic.
    """
    missing = sorted(set(CORRELATION_COLUMNS) - set(table.columns))
    if missing:
        raise IdentifiableError(f"mixing table lacks columns {', '.join(missing)}")
    if n_boot < 1:
        raise IdentifiableError(f"n_boot must be ≥ 1, got {n_boot}")
    out = []
    for (layer, method, reference), group in table.groupby(
        ["layer", "method", "reference"], sort=True
    ):
        values = group.sort_values("seq")["spearman"].to_numpy(dtype=float)
        values = values[~np.isnan(values)]
        s = values.size
        if s == 0:
            out.append((layer, method, reference, np.nan, np.nan, np.nan, 0))
            continue
        idx = np.random.default_rng((seed, s)).integers(0, s, size=(n_boot, s))
        boots = values[idx].mean(1)
        lo, hi = np.percentile(boots, [2.5, 97.5])
        out.append((layer, method, reference, float(values.mean()), float(lo), float(hi), s))
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS)
