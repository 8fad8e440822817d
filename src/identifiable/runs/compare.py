"""`compare`: the reproduction of two or more models, side by side on the same texts.

Each model runs the whole reproduction (`identifiable.runs.reproduce.reproduce`) on the
same aligned texts (`experiments.compare.align_texts`) into OUT/models/LABEL/ (its full
report), then `experiments.compare` lines their tables up by relative depth and
`report.compare_section` renders OUT/index.html. The folder follows `reproduce --out`'s
rules; `resume=True` continues an interrupted comparison model by model, shard by shard.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from identifiable.errors import IdentifiableError
from identifiable.experiments import compare as cmp
from identifiable.experiments.pipeline import corpus_items
from identifiable.experiments.stages import resolve_budget
from identifiable.report.compare_section import write_compare_report
from identifiable.report.verdicts import PIPELINE_CHECK
from identifiable.runs.finetune import load_attention_model
from identifiable.store.cache import CACHE_DIR, RunCache
from identifiable.store.files import atomic_write_text
from identifiable.store.outdir import OutputFolder, nested_runs
from identifiable.utils.checks import check_finite_weights, collection, expect


@dataclass
class Comparison:
    out_dir: Path
    tables: dict[str, pd.DataFrame]
    timings: dict[str, float]


def _labels(names: Sequence[str]) -> list[str]:
    labels = []
    for i, name in enumerate(names):
        base = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(name).name or name)
        label = base or f"model{i + 1}"
        labels.append(label if label not in labels else f"{label}-{i + 1}")
    return labels


def compare(
    models: Sequence[str],
    corpus: Any = "wikipedia-sample",
    out: str | Path = "comparison",
    *,
    budget: str = "quick",
    resume: bool = False,
    force: bool = False,
    seed: int = 0,
    progress: bool = True,
    column: str = "text",
    pair_fields: tuple[str, str] | None = None,
) -> Comparison:
    """Reproduce every model on the same texts and write OUT/index.html (see the module).

    corpus: a corpus name or path, a list of texts or (text, text) pairs, or a
    `datasets.Dataset` (its `column`, or `pair_fields=(a, b)`), as for `reproduce`.
    """
    from identifiable.runs.reproduce import check_run_arguments, given_corpus, reproduce

    t0 = time.perf_counter()
    models = collection(models, "models", "two or more models: names, folders or hub ids")
    for m in models:  # names: each model is loaded here, then reproduced
        expect(m, (str, os.PathLike), "models", "model names, folders or hub ids")
    check_run_arguments(models[0], out, seed)
    corpus = given_corpus(corpus, column, pair_fields)
    if len(models) < 2:
        raise IdentifiableError("compare takes two or more models")
    plan = resolve_budget(budget)
    folder = OutputFolder(Path(out), resume=resume, force=force)
    folder.check()
    labels = _labels([str(m) for m in models])
    loaded = {label: load_attention_model(str(m)) for label, m in zip(labels, models, strict=True)}
    for label, m in loaded.items():
        cmp.check_comparable(m, label)
        check_finite_weights(m.hf_model, f"'{label}'")  # before any folder is written
    first = next(iter(loaded.values()))
    items, corpus_info = corpus_items(corpus, first, plan, seed)
    texts, counts = cmp.align_texts(loaded, items, plan)
    settings = {
        "models": [str(m) for m in models],
        "fingerprints": [m.fingerprint for m in loaded.values()],
        "corpus": corpus_info,
        "texts": len(texts),
        "budget": budget,
        "seed": seed,
    }
    timings: dict[str, float] = {"load_s": time.perf_counter() - t0}
    with folder.run(lambda d: RunCache(d, settings).check_resumable()) as work:
        RunCache(work, settings).start()
        results = {}
        for label, m in loaded.items():
            t_m = time.perf_counter()
            sub = work / "models" / label
            done = sub.is_dir() and (sub / "summary.json").is_file()
            with nested_runs(work):  # each model's reproduction lives in our work folder
                again = resume or done
                rep = reproduce(
                    m, texts, sub, budget=budget, seed=seed, progress=progress, resume=again
                )
            tables = {
                p.stem: pd.read_parquet(p) for p in sorted((sub / "tables").glob("*.parquet"))
            }
            results[label] = (tables, rep.summary, m.info.n_layers)
            timings[f"{label}_s"] = time.perf_counter() - t_m
        tables = cmp.side_by_side(results)
        tables["token_counts"], tables["token_counts_per_text"] = _token_counts(counts), counts
        meta = _meta(loaded, labels, texts, counts, corpus_info)
        if plan.pipeline_check:
            meta["verdict_note"] = PIPELINE_CHECK + " No claim is compared between the models."
        write_compare_report(work, tables, meta)
        timings["total_s"] = time.perf_counter() - t0
        atomic_write_text(work / CACHE_DIR / "timings.json", json.dumps(timings, indent=2))
    return Comparison(Path(out), tables, timings)


def _token_counts(counts: pd.DataFrame) -> pd.DataFrame:
    """Per model: texts, total, mean, min and max tokens."""
    return (
        counts.groupby("model", sort=False)["tokens"]
        .agg(texts="count", total="sum", mean="mean", min="min", max="max")
        .reset_index()
    )


def _meta(
    loaded: dict[str, Any],
    labels: list[str],
    texts: list,
    counts: pd.DataFrame,
    corpus_info: dict[str, Any],
) -> dict[str, Any]:
    models = {
        label: f"{m.info.architecture}, {m.info.n_layers} layers × {m.info.n_heads} heads, "
        f"d_v = {m.info.head_dim}"
        for label, m in loaded.items()
    }
    totals = counts.groupby("model", sort=False)["tokens"].sum()
    return {
        "models": models,
        "reference": labels[0],
        "summary": f"{len(loaded)} models on the same {len(texts)} texts of {corpus_info['name']}.",
        "verdict_note": "Each model's verdict on each claim of the reproduction (its own report "
        "says why); 'differs' marks the claims on which the models disagree.",
        "texts": "The same texts for every model, each tokenised by its own tokenizer: "
        + "; ".join(f"{k}: {int(v)} tokens" for k, v in totals.items())
        + ". Texts a model would truncate, or (with different tokenizers) that the "
        "length-selected stages would pick for one model but not another, are left out.",
    }
