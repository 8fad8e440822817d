"""Token identifiability across layers (paper Fig. 2) on a model and a corpus.

`token_identifiability(model, corpus)` streams the corpus through the model
(`trace_many`), keeps (e^l_i, e^0_i) for every layer up to a token cap (optionally
cached on disk), fits the six probes (naive / linear / MLP × L2 / cosine) per
layer on training sequences and reports how often the nearest candidate to
ĝ_l(e^l_i) is e^0_i on test sequences, with 95 % Wilson intervals, a
shuffled-target control and the cross-layer matrix.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from identifiable.corpus import resolve_corpus
from identifiable.errors import IdentifiableError
from identifiable.experiments.pipeline import Advance, Item
from identifiable.models.arguments import check_model
from identifiable.results import Result
from identifiable.tokens.cache import cache_paths, corpus_fingerprint, load_pairs, save_pairs
from identifiable.tokens.evaluate import Candidates, Kind, evaluate_pairs
from identifiable.tokens.extract import STORAGE_DTYPES, TokenPairs, collect_token_pairs
from identifiable.tokens.probes import OBJECTIVES, PROBE_KINDS, ProbeConfig
from identifiable.utils.checks import choices, count
from identifiable.utils.progress import task_bar

DEFAULT_MAX_TOKENS = 8192
QUICK_MAX_TOKENS = 2048
DEFAULT_CORPUS = "wikipedia-sample"


TABLES = ("per_layer", "cross_layer", "control")

# Tables number layers as every surface does (docs/results.md, "Numbering"): the hidden state
# e^{l+1}, written by block l, is layer l; the embeddings e^0 are layer -1. The probes work
# on hidden-state indices (TokenPairs.layer(i) is e^i); the tables are relabelled here, at
# the one place they leave this module, and `layers=` is translated on the way in.
LAYER_COLUMNS = ("layer", "train_layer", "test_layer")


def block_numbered(table: pd.DataFrame) -> pd.DataFrame:
    """`table` with its hidden-state indices (e^i) relabelled as layers (i - 1)."""
    present = {c: table[c] - 1 for c in LAYER_COLUMNS if c in table}
    return table.assign(**present) if present else table


def hidden_indices(layers: Sequence[int] | None, n_layers: int) -> list[int] | None:
    """Layers as tables number them (-1..L-1) → hidden-state indices (0..L), checked."""
    if layers is None:
        return None
    out = []
    for layer in layers:
        if isinstance(layer, bool) or not isinstance(layer, int) or not -1 <= layer < n_layers:
            valid = f"layers 0..{n_layers - 1} (numbered from 0), or -1 for the embeddings e^0"
            raise IdentifiableError(
                f"layers: {layer!r} is not a layer of this model; give {valid}",
                cli=f"--layers: {layer!r} is not a layer of this model; give {valid}",
            )
        out.append(layer + 1)
    return out


def output_files(out_dir: str | Path) -> list[Path]:
    """The files `TokenIdentifiabilityResult.write(out_dir)` writes, so callers can check first."""
    out = Path(out_dir)
    tables = [out / f"tokens_{name}{ext}" for name in TABLES for ext in (".csv", ".parquet")]
    return [*tables, out / "tokens_settings.json"]


@dataclass
class TokenIdentifiabilityResult(
    Result,
    tables={
        "per_layer": ("layer", "probe", "objective"),
        "cross_layer": ("probe", "objective", "train_layer", "test_layer"),
        "control": ("layer", "probe", "objective"),
    },
):
    """Tidy results; every table is long format (one row per measurement).

    Attributes:
        per_layer: layer, probe, objective, rate, ci_low, ci_high (95 % Wilson),
            rate_strict (ties count as failures), n_tokens, n_tied, chance, steps, val_loss.
        cross_layer: probe, objective, train_layer, test_layer, rate, ci_low, ci_high, …
        control: like per_layer, for probes fitted on shuffled targets (≈ chance).
        settings: what was run (model, corpus, token counts, split sizes, seed, …).
        timings: seconds spent in extraction, probes + evaluation, and in total.
    """

    per_layer: pd.DataFrame
    cross_layer: pd.DataFrame
    control: pd.DataFrame
    settings: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def rates(self) -> pd.DataFrame:
        """Wide view: one row per layer, one column per probe_objective (rate only)."""
        df = self.per_layer.assign(kind=self.per_layer["probe"] + "_" + self.per_layer["objective"])
        return df.pivot(index="layer", columns="kind", values="rate")

    def write(self, out_dir: str | Path) -> list[Path]:
        """Write every table as CSV and Parquet plus settings.json, each atomically."""
        import json

        from identifiable.store.files import atomic_write_text, write_table

        out = Path(out_dir)
        paths: list[Path] = []
        for name in TABLES:
            paths += write_table(getattr(self, name), out / f"tokens_{name}")
        meta = {"settings": self.settings, "timings": self.timings}
        paths.append(
            atomic_write_text(out / "tokens_settings.json", json.dumps(meta, indent=2, default=str))
        )
        return paths


def _resolve_model(model: Any) -> Any:
    if isinstance(model, str | Path):
        from identifiable.models import load_model

        return load_model(str(model))
    return model


def vocabulary_matrix(model: Any) -> torch.Tensor:
    """The model's input word-embedding matrix `[V, d']` (candidates for `candidates="vocabulary"`)."""
    return model.vocabulary_embeddings()


def _tokenizer_fingerprint(model: Any) -> str | None:
    """The tokenizer decides the token ids: part of the cache key (None without a tokenizer)."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        return None
    from identifiable.corpus.lengths import tokenizer_fingerprint

    return tokenizer_fingerprint(tokenizer)


def extract(
    model: Any,
    corpus: Iterable[Any],
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    batch_size: int = 8,
    storage: str = "float32",
    cache_dir: str | Path | None = None,
    progress: bool = False,
) -> tuple[TokenPairs, dict[str, Any]]:
    """(e^l_i, e^0_i) for every layer, from the cache when one matches, else from the model.

    Returns the pairs and a dict saying where they came from (cache file, hit or miss).
    """
    if storage not in STORAGE_DTYPES:
        raise IdentifiableError(
            f"unknown storage '{storage}': choose from {', '.join(STORAGE_DTYPES)}"
        )
    info: dict[str, Any] = {"cache": None, "cache_hit": False}
    paths = settings = None
    if cache_dir is not None:
        corpus_fp = corpus_fingerprint(corpus)
        if corpus_fp is None:
            raise IdentifiableError(
                "cannot cache a one-shot iterator of texts (it has no .fingerprint and hashing it "
                "would consume it); pass a list, or a corpus from identifiable.corpus, or no cache_dir"
            )
        settings = {
            "format": 1,
            "model": model.fingerprint,
            "tokenizer": _tokenizer_fingerprint(model),
            "corpus": corpus_fp,
            "max_tokens": int(max_tokens),
            "storage": storage,
        }
        paths = cache_paths(cache_dir, settings)
        info["cache"] = str(paths[0])
        cached = load_pairs(*paths, settings)
        if cached is not None:
            info["cache_hit"] = True
            return cached, info
    texts = model.trace_many(iter(corpus), batch_size=batch_size)
    dtype = STORAGE_DTYPES[storage]
    with task_bar("extracting hidden states", max_tokens, enabled=progress) as bar:
        pairs = collect_token_pairs(
            texts, max_tokens=max_tokens, dtype=dtype, on_tokens=bar.advance
        )
    if paths is not None and settings is not None:
        save_pairs(pairs, *paths, settings)
    return pairs, info


def _split_sizes(pairs: TokenPairs, ev: Any) -> dict[str, int]:
    """Sequences and tokens of the train, validation and test parts of the split."""
    train_seq, val_seq, test_seq = ev.split.sequences(pairs.seq_ids)
    return {
        "train_sequences": len(train_seq),
        "val_sequences": len(val_seq),
        "test_sequences": len(test_seq),
        "train_tokens": int(ev.split.train.numel()),
        "val_tokens": int(ev.split.val.numel()),
        "test_tokens": int(ev.split.test.numel()),
    }


def _settings(
    model: Any,
    texts: Any,
    pairs: TokenPairs,
    ev: Any,
    source: dict[str, Any],
    max_tokens: int,
    candidates: Candidates,
    seed: int,
    probe_config: ProbeConfig | None,
    storage: str,
) -> dict[str, Any]:
    """The settings of a `TokenIdentifiabilityResult`: model, corpus, sizes, options."""
    return {
        "model": getattr(model.info, "name", ""),
        "architecture": getattr(model.info, "architecture", ""),
        "corpus": getattr(texts, "name", None) or type(texts).__name__,
        "corpus_unit": getattr(texts, "unit", None),
        "max_tokens": max_tokens,
        "n_tokens": pairs.n_tokens,
        "n_sequences": pairs.n_sequences,
        "n_truncated": pairs.n_truncated,
        **_split_sizes(pairs, ev),
        "candidates": candidates,
        "seed": seed,
        "probe_config": vars(probe_config or ProbeConfig()),
        "storage": storage,
        **source,
    }


def token_identifiability(
    model: Any,
    corpus: Any = DEFAULT_CORPUS,
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    probe_kinds: Sequence[str] = PROBE_KINDS,
    objectives: Sequence[str] = OBJECTIVES,
    candidates: Candidates = "sequence",
    layers: Sequence[int] | None = None,
    cross_layer: Sequence[Kind] = (("linear", "cos"),),
    controls: Sequence[Kind] = (("linear", "l2"), ("linear", "cos")),
    seed: int = 0,
    test_fraction: float = 0.2,
    probe_config: ProbeConfig | None = None,
    cache_dir: str | Path | None = None,
    batch_size: int = 8,
    storage: str = "float32",
    progress: bool = True,
) -> TokenIdentifiabilityResult:
    """Token identifiability per layer (paper Fig. 2a) and across layers (Fig. 2b).

    Args:
        model: an `identifiable.models.Model` or a name for `load_model` ("minilm", path, hub id).
        corpus: an iterable of texts or (text, text) pairs, or a corpus name for
            `identifiable.corpus.load_corpus`.
        max_tokens: token cap (whole sequences); `QUICK_MAX_TOKENS` for a fast run.
        probe_kinds: probe kinds; every kind × objective is fitted at every layer.
        objectives: probe objectives ("l2", "cos").
        candidates: "sequence" (default), "corpus" or "vocabulary" (see `identifiable.tokens.evaluate`).
        layers: the layers to probe, numbered from 0 (layer l reads e^{l+1}, the output of
            block l; -1 is the embeddings e^0 itself); default every layer.
        cross_layer: (kind, objective) pairs also tested on every other layer.
        controls: (kind, objective) pairs refitted on shuffled targets.
        seed: seeds the split by sequence, subsampling, initialisation and shuffles.
        probe_config: probe training settings (`ProbeConfig`).
        cache_dir: keep extracted hidden states here (safetensors + manifest), keyed by
            model, corpus and settings; corrupt files are rebuilt, mismatching ones refused.
        batch_size: sequences per forward pass; storage: "float32" or "float16".
        progress: show progress bars.
    """
    check_model(model, names=True)  # one line before any work for a wrong argument
    count(max_tokens, "max_tokens", "--max-tokens")
    count(batch_size, "batch_size", "--batch-size")
    choices(probe_kinds, PROBE_KINDS, "probe_kinds")
    choices(objectives, OBJECTIVES, "objectives")
    model = _resolve_model(model)
    # The paper's segments of ≤ 128 tokens, shuffled under `seed` so that a token cap
    # samples many articles instead of the first few.
    texts = resolve_corpus(corpus, model.tokenizer, max_tokens=128, shuffle=True, seed=seed)
    t0 = time.perf_counter()
    stored: dict[str, Any] = {"batch_size": batch_size, "storage": storage, "cache_dir": cache_dir}
    pairs, source = extract(model, texts, max_tokens=max_tokens, progress=progress, **stored)
    t1 = time.perf_counter()
    vocab = vocabulary_matrix(model) if candidates == "vocabulary" else None
    plan: dict[str, Any] = {"probe_kinds": probe_kinds, "objectives": objectives}
    plan |= {"candidates": candidates, "cross_layer": cross_layer, "controls": controls}
    plan |= {"probe_config": probe_config}
    ev = _evaluate_with_progress(
        pairs,
        progress,
        layers=hidden_indices(layers, pairs.n_layers),
        seed=seed,
        test_fraction=test_fraction,
        vocab_embeddings=vocab,
        **plan,
    )
    t2 = time.perf_counter()
    settings = _settings(
        model, texts, pairs, ev, source, max_tokens, candidates, seed, probe_config, storage
    )
    timings = {"extraction_s": t1 - t0, "probes_and_evaluation_s": t2 - t1, "total_s": t2 - t0}
    per_layer, cross, control = (
        block_numbered(t) for t in (ev.per_layer, ev.cross_layer, ev.control)
    )
    return TokenIdentifiabilityResult(per_layer, cross, control, settings, timings)


def _evaluate_with_progress(pairs: TokenPairs, progress: bool, **kwargs: Any):
    if not progress:
        return evaluate_pairs(pairs, **kwargs)
    n = len(kwargs.get("layers") or range(pairs.n_layers))
    with task_bar("fitting probes", n) as bar:
        return evaluate_pairs(pairs, on_layer=lambda _layer: bar.advance(), **kwargs)


# ---- the reproduction stage (one shard: probes are fitted on all tokens at once) ----


def smoke_safe_tokens(requested: int, hidden_size: int, max_sequence_tokens: int = 128) -> int:
    """The token cap a stage asks for: `requested`, raised so the split by sequence can work.

    The split needs 2·(d + 1) tokens for width d (`min_tokens_for`), and extraction stops
    at whole sequences, so one more sequence of up to `max_sequence_tokens` is added on
    top. A budget written for one model (e.g. smoke's 400 tokens) thus runs on any width
    (MiniLM, d = 384: at least 898 tokens).
    """
    from identifiable.tokens.split import min_tokens_for

    return max(int(requested), min_tokens_for(hidden_size) + int(max_sequence_tokens))


def probe_config_for(budget: Any) -> ProbeConfig:
    """The probe protocol of a budget: the package defaults, with the budget's step cap
    (Adam steps and L-BFGS iterations), MLP width and learning-rate grid where it sets them."""
    changes: dict[str, Any] = {}
    steps = getattr(budget, "probe_max_steps", None)
    default = ProbeConfig()
    if steps:
        changes |= {
            "max_steps": steps,
            "select_steps": min(steps, default.select_steps),
            "cos_steps": min(steps, default.cos_steps),
        }
    if getattr(budget, "probe_mlp_width", None):
        changes["mlp_width"] = budget.probe_mlp_width
    if getattr(budget, "probe_lr_grid", None):
        changes["lr_grid"] = tuple(budget.probe_lr_grid)
    for field_name, key in (
        ("probe_select_steps", "select_steps"),
        ("probe_patience", "patience"),
        ("probe_lr_decays", "lr_decays"),
    ):
        if getattr(budget, field_name, None) is not None:
            changes[key] = getattr(budget, field_name)
    if "select_steps" in changes and steps:
        changes["select_steps"] = min(changes["select_steps"], steps)
    return ProbeConfig(**changes)


class SharedPairs:
    """The stage's hidden states, extracted (or read from the token cache) once and shared by
    the layers' shards, which may run at once in threads (`Stage.workers`)."""

    def __init__(self, model: Any, items: Sequence[Item], budget: Any, cache_dir: Path) -> None:
        self.model, self.items, self.budget, self.cache_dir = model, items, budget, cache_dir
        self._lock = threading.Lock()
        self._pairs: TokenPairs | None = None

    def max_tokens(self) -> int:
        b = self.budget
        return smoke_safe_tokens(
            b.token_max_tokens, self.model.info.hidden_size, getattr(b, "max_tokens", 128)
        )

    def __call__(self) -> TokenPairs:
        with self._lock:  # the first shard extracts (on every thread); the others wait
            if self._pairs is None:
                self._pairs, _ = extract(
                    self.model,
                    list(self.items),
                    max_tokens=self.max_tokens(),
                    cache_dir=self.cache_dir,
                )
            return self._pairs


def probe_device(model: Any) -> torch.device:
    """Where Fig. 2's probes are fitted: the model's device (`--device`)."""
    device = getattr(model, "device", None)
    return torch.device(device) if device is not None else torch.device("cpu")


def token_tables(
    model: Any,
    items: Sequence[Item],
    budget: Any,
    seed: int,
    cache_dir: Path,
    advance: Advance,
    layer: int | None = None,
    pairs: SharedPairs | None = None,
) -> dict[str, pd.DataFrame]:
    """Fig. 2 tables (layers numbered from 0, `block_numbered`): per_layer, cross_layer (two fitting regimes), control,
    fits (every probe's loss curve), grid (every hyperparameter tried on validation),
    counts (tokens, sequences and the split) and protocol (the probe settings, one row).

    With `layer`, only that layer's rows (the reproduction's shards, one per layer, which
    `torch.distributed` ranks share): the Adam settings are chosen at that layer (or, with
    `select_per_layer=False`, still on the deepest layer), the layer's probe is tested on
    every layer, and counts, protocol and the deepest layer's selection grid come with layer
    1 only, so the shards concatenated in layer order equal one run over all layers.
    """
    from identifiable.tokens.evaluate import evaluate_pairs

    # Extracted hidden states are cached by the tokens package itself, so a run killed
    # while fitting probes (or another shard of this stage) does not trace the corpus again.
    shared = pairs or SharedPairs(model, items, budget, cache_dir)
    max_tokens = shared.max_tokens()
    token_pairs = shared()
    config = probe_config_for(budget)
    all_layers = list(range(1, token_pairs.n_layers + 1))
    one = layer is not None
    ev = evaluate_pairs(
        token_pairs,
        device=probe_device(model),
        workers=1 if one else None,
        seed=seed,
        probe_config=config,
        on_layer=lambda _layer: advance(1),
        layers=[layer] if layer is not None else None,
        select_layer=all_layers[-1],
        test_layers=all_layers,
        record_selection=not one or layer == all_layers[0],
    )
    tables = {
        name: block_numbered(table.reset_index(drop=True))
        for name, table in (
            ("per_layer", ev.per_layer),
            ("cross_layer", ev.cross_layer),
            ("control", ev.control),
            ("fits", ev.fits),
            ("grid", ev.grid),
        )
    }
    if one and layer != all_layers[0]:
        return tables
    counts = {
        "n_tokens": token_pairs.n_tokens,
        "n_sequences": token_pairs.n_sequences,
        "token_cap": max_tokens,
        **_split_sizes(token_pairs, ev),
    }
    protocol = {
        k: (", ".join(map(str, v)) if isinstance(v, tuple) else v) for k, v in vars(config).items()
    }
    tables["counts"] = pd.DataFrame([counts])
    tables["protocol"] = pd.DataFrame([{k: str(v) for k, v in protocol.items()}])
    return tables
