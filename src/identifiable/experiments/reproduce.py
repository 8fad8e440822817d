"""`reproduce`: run the paper's four experiment families and write the report folder.

Stages, in paper order (each cached per shard under DIR/.cache, see `report.cache`):
  attention    Fig. 1: Pearson r(raw, effective) by length; attention to [CLS]/[SEP]/punctuation
  tokens       Fig. 2: token identifiability per layer and across layers (one shard: probes are
               fitted on all extracted tokens at once)
  attribution  Figs. 3-4: Hidden Token Attribution per sequence

A run killed at any point and restarted with the same arguments (`resume=True`)
reuses every finished shard and writes byte-identical outputs (on the same machine and
torch thread count, which fix the order of float reductions): shards are fixed by
the settings (never by where a run stopped), every random choice is seeded from
(seed, stage, shard), and output files carry no timestamps. Timings go to
DIR/.cache/timings.json, not into the outputs.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from identifiable.errors import IdentifiableError
from identifiable.report.cache import CACHE_DIR, RunCache
from identifiable.report.files import atomic_write_text
from identifiable.report.stages import Stage

OUTPUTS = ("index.html", "summary.json", "figures", "tables")


@dataclass(frozen=True)
class Budget:
    """How much of each experiment to run.

    attention_sequences: sequences for Fig. 1. max_tokens: length cap of every
    sequence (the paper uses 128). token_max_tokens: tokens extracted for the Fig. 2
    probes. attribution_*: sequences, their length cap, and random probes per token
    for Figs. 3-4 (None = exact Jacobian norms). shard_size: sequences per cached shard.
    probe_max_steps: training steps of each Fig. 2 probe (None = the tokens package default).
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


BUDGETS: dict[str, Budget] = {
    # Default: the embedded model on the Wikipedia sample in ≤ 5 minutes on 2 CPU cores.
    "quick": Budget(
        "quick",
        attention_sequences=64,
        # below ~8k tokens the layer-6 probes overfit (linear-cos fell under naive-cos at 1.5k)
        token_max_tokens=8192,
        attribution_sequences=8,
        attribution_max_tokens=40,
        attribution_probes=16,
    ),
    # For a GPU or a long run: paper-sized samples, exact attribution.
    "full": Budget(
        "full",
        attention_sequences=1000,
        token_max_tokens=20000,
        attribution_sequences=200,
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


@dataclass
class Reproduction:
    """What a run produced: the folder, its files, the summary and per-stage seconds."""

    out_dir: Path
    files: list[Path]
    summary: dict[str, Any]
    timings: dict[str, float]


# ---- output folder ----------------------------------------------------------------


def prepare_out_dir(out: Path, *, resume: bool, force: bool) -> None:
    """Refuse a non-empty or unwritable folder unless resuming or forced; clear it when forced."""
    if out.exists() and not out.is_dir():
        raise IdentifiableError(f"--out {out} is a file; choose a folder")
    if out.is_dir() and any(out.iterdir()):
        ours = (out / CACHE_DIR / "settings.json").is_file()
        if force:
            for name in (*OUTPUTS, CACHE_DIR):
                target = out / name
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
        elif not resume:
            raise IdentifiableError(
                f"output folder {out} is not empty: pass --resume to continue the run there, "
                "--force to start over, or choose another --out"
            )
        elif not ours:
            raise IdentifiableError(
                f"cannot resume in {out}: it holds no identifiable run; use --force or another --out"
            )
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise IdentifiableError(
            f"cannot write to output folder {out}: {err.strerror or err}; choose another --out"
        ) from None


# ---- stages -------------------------------------------------------------------------


def run_stage(
    cache: RunCache, stage: Stage, progress: Any
) -> tuple[dict[str, pd.DataFrame], float]:
    """Run (or load) every shard of a stage; concatenate each table in shard order.

    Returns the tables and the seconds spent computing (0 when all shards were cached).
    """
    task = progress.add_task(stage.label, total=sum(stage.weights))
    parts: dict[str, list[pd.DataFrame]] = {}
    seconds = 0.0
    for index, shard in enumerate(stage.shards):
        cached = cache.load(stage.name, index)
        if cached is None:
            start = time.perf_counter()
            tables = stage.compute(shard, index, lambda k: progress.advance(task, k))
            seconds += time.perf_counter() - start
            cache.save(stage.name, index, tables, {"items": len(shard)})
        else:
            tables = cached[0]
        progress.update(task, completed=sum(stage.weights[: index + 1]))
        for name, df in tables.items():
            parts.setdefault(name, []).append(df)
    return {name: pd.concat(dfs, ignore_index=True) for name, dfs in parts.items()}, seconds


class _Quiet:
    """Progress stand-in when bars are off."""

    def add_task(self, *_: Any, **__: Any) -> int:
        return 0

    def advance(self, *_: Any) -> None:
        pass

    def update(self, *_: Any, **__: Any) -> None:
        pass


@contextmanager
def progress_bars(enabled: bool) -> Iterator[Any]:
    if not enabled:
        yield _Quiet()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        "eta",
        TimeRemainingColumn(),
        console=Console(stderr=True),
    ) as bar:
        yield bar


# ---- entry point -------------------------------------------------------------------


def resolve_budget(budget: str | Budget) -> Budget:
    if isinstance(budget, Budget):
        return budget
    if budget not in BUDGETS:
        raise IdentifiableError(f"unknown budget '{budget}': choose one of {', '.join(BUDGETS)}")
    return BUDGETS[budget]


def reproduce(
    model: Any = "minilm",
    corpus: Any = "wikipedia-sample",
    out: str | Path = "reproduction",
    *,
    budget: str | Budget = "quick",
    resume: bool = False,
    force: bool = False,
    seed: int = 0,
    device: str = "cpu",
    progress: bool = True,
) -> Reproduction:
    """Run the reproduction and write DIR/index.html, figures, tables and summary.json.

    Args:
        model: a name for `load_model` ("minilm", a local folder, a hub id) or a Model.
        corpus: a name for `load_corpus` (texts are formatted as pairs [CLS] a [SEP] b [SEP]
            of up to `budget.max_tokens` tokens) or a list of texts / pairs.
        out: the output folder; must be empty unless `resume` or `force`.
        budget: "quick" (default, ≤ 5 min on 2 CPU cores), "full", "smoke" or a `Budget`.
        resume: continue an interrupted run with the same arguments.
        force: delete a previous run's outputs and cache in `out` first.
        seed: seeds every random choice (pairs, probes, splits, attribution probes).
        device: where a model given by name runs ("cpu", "cuda"); results do not depend on it
            beyond float rounding, so it is not part of the resume settings.
    """
    from identifiable.report import stages as rs
    from identifiable.report.document import write_report

    t_start = time.perf_counter()
    plan = resolve_budget(budget)
    out = Path(out)
    prepare_out_dir(out, resume=resume, force=force)
    with progress_bars(progress) as bars:
        task = bars.add_task("loading model and corpus", total=None)
        m = rs.resolve_model(model, device)
        items, corpus_info = rs.resolve_corpus(corpus, m, plan, seed)
        bars.update(task, total=1, completed=1)
        settings = {
            "model": m.info.name,
            "model_fingerprint": m.fingerprint,
            "architecture": m.info.architecture,
            "corpus": corpus_info,
            "budget": asdict(plan),
            "seed": seed,
            "format": 2,
        }
        cache = RunCache(out, settings)
        cache.check_resumable()
        cache.start()
        timings: dict[str, float] = {"load_s": time.perf_counter() - t_start}
        results: dict[str, dict[str, pd.DataFrame]] = {}
        for stage in rs.stages(m, items, plan, seed, out / CACHE_DIR):
            results[stage.name], timings[f"{stage.name}_s"] = run_stage(cache, stage, bars)
        task = bars.add_task("writing report", total=None)
        files, summary = write_report(out, m, results, settings)
        bars.update(task, total=1, completed=1)
    timings["total_s"] = time.perf_counter() - t_start
    atomic_write_text(out / CACHE_DIR / "timings.json", json.dumps(timings, indent=2))
    return Reproduction(out, files, summary, timings)


def with_budget(name: str, **changes: Any) -> Budget:
    """A named budget with some fields changed (for experiments and tests)."""
    return replace(resolve_budget(name), **changes)
