"""`reproduce`: run the paper's experiment stages and write the report folder.

This is the top floor: it runs the stages of `identifiable.experiments.stages` and hands
their tables to `identifiable.report`, which renders them.

A run killed at any point and restarted with the same arguments (`resume=True`)
reuses every finished shard and writes byte-identical outputs (on the same machine and
torch thread count, which fix the order of float reductions): shards are fixed by
the settings (never by where a run stopped), every random choice is seeded from
(seed, stage, shard), and output files carry no timestamps. Timings go to
DIR/.cache/timings.json, not into the outputs.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from identifiable.experiments.distributed import (
    barrier,
    broadcast,
    check_same_run,
    join,
    local_device,
    stop_cleanly,
)
from identifiable.experiments.pipeline import (
    corpus_items,
    progress_bars,
    resolve_model,
    run_stages,
)
from identifiable.experiments.stages import Budget, resolve_budget, stages
from identifiable.report.document import write_report
from identifiable.store.cache import CACHE_DIR, RunCache, settings_key
from identifiable.store.files import atomic_write_text
from identifiable.store.outdir import OutputFolder
from identifiable.utils.checks import check_finite_weights, count, expect
from identifiable.utils.seeds import SEED_MAX

if TYPE_CHECKING:
    from identifiable.experiments.cost import Estimate


@dataclass
class Reproduction:
    """What a run produced: the folder, its files, the summary and per-stage seconds."""

    out_dir: Path
    files: list[Path]
    summary: dict[str, Any]
    timings: dict[str, float]


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
    column: str = "text",
    pair_fields: tuple[str, str] | None = None,
    announce: Callable[[str], None] | None = None,
) -> Reproduction:
    """Run the reproduction and write DIR/index.html, figures, tables and summary.json.

    Args:
        model: a name for `load_model` ("minilm", a local folder, a hub id) or a Model.
        corpus: a name for `load_corpus` (texts are formatted as pairs [CLS] a [SEP] b [SEP]
            of up to `budget.max_tokens` tokens), a list of texts / pairs, or a
            `datasets.Dataset` (its `column`, or `pair_fields=(a, b)`: each row as given).
        out: the output folder; must be empty unless `resume` or `force`.
        budget: "quick" (default; on 2 threads about 3 min for the embedded model, 11 min for a
            BERT-base-sized one, `experiments.cost`), "paper" ("full"), "smoke" or a `Budget`.
        resume: continue an interrupted run with the same arguments.
        force: replace a previous run of ours in `out` (only files its manifest lists, and
            only once the new run has finished; see `identifiable.store.outdir`).
        seed: seeds every random choice (pairs, probes, splits, attribution probes).
        device: where a model given by name runs ("cpu", "cuda"); results do not depend on it
            beyond float rounding, so it is not part of the resume settings.
        column: the text column of a `datasets.Dataset` corpus (one text per row).
        pair_fields: two columns of a `datasets.Dataset` corpus, a pair per row.
        announce: called with one line, the run's estimated time ("about 5 min on 2
            threads", `experiments.cost`), once the model is loaded and before any stage.

    A budget whose Fig. 2 hidden states do not fit in the memory available is refused in
    one line naming the budget that does, before anything is written.

    Under `torchrun` (or any initialised `torch.distributed` process group) call this on
    every rank with the same arguments: the ranks share the shards of every stage through
    the cache in the run's work folder (`OutputFolder.partial`, beside `out`), rank 0 writes the report, and every rank returns the same summary
    (only rank 0's `files` are listed). See `identifiable.experiments.distributed`.
    """
    t_start = time.perf_counter()
    out = check_run_arguments(model, out, seed)
    plan = resolve_budget(budget)
    corpus = given_corpus(corpus, column, pair_fields)
    if isinstance(model, str | Path):
        from identifiable.models.devices import resolve_device

        resolve_device(device)  # an unknown or absent device fails before anything else
    world = join(device)
    with stop_cleanly(world):
        # Read-only checks first; nothing is written or deleted before the model, corpus and
        # device are valid. Rank 0 then locks the folder and works in a sibling folder that
        # replaces `out` only when the report is complete.
        folder = OutputFolder(out, resume=resume, force=force)
        if world.is_main:
            folder.check()
        with progress_bars(progress and world.is_main) as bars:
            m, items, settings = _prepare(model, corpus, plan, seed, device, bars)
            left = _announce_cost(m, plan, announce if world.is_main else None)
            check_same_run(world, settings_key(settings))
            owner = (
                folder.run(lambda d: RunCache(d, settings).check_resumable())
                if world.is_main
                else contextlib.nullcontext(folder.partial)
            )
            with owner as work:
                files, summary, timings = _run(
                    work, world, m, items, plan, seed, settings, bars, t_start, left
                )
                if summary is None:  # not rank 0: rank 0 reduces and renders
                    summary = json.loads(broadcast(world, "summary", None))
                    timings["total_s"] = time.perf_counter() - t_start
                    return Reproduction(out, [], summary, timings)
            files = [out / f.relative_to(work) for f in files]  # `work` is now `out`
        broadcast(world, "summary", json.dumps(summary, default=str))
    return Reproduction(out, files, summary, timings)


def check_run_arguments(model: Any, out: Any, seed: Any) -> Path:
    """`reproduce`'s and `compare`'s model, output folder and seed, before any work; the
    folder as a Path."""
    import os

    from identifiable.models.arguments import check_model

    check_model(model, names=True)
    expect(out, (str, os.PathLike), "out", "a folder path")
    count(seed, "seed", "--seed", minimum=0, maximum=SEED_MAX)
    return Path(out)


def given_corpus(corpus: Any, column: str, pair_fields: tuple[str, str] | None) -> Any:
    """A `datasets.Dataset` as its list of texts (or pairs); anything else as it is."""
    import os

    from identifiable.corpus.sources import dataset_items, is_dataset

    if is_dataset(corpus):
        return dataset_items(corpus, column, pair_fields)
    what = "a corpus name or file, a list of texts or (text, text) pairs, or a datasets.Dataset"
    expect(corpus, (str, os.PathLike, list, tuple), "corpus", what)
    return corpus


def _announce_cost(
    model: Any, plan: Budget, announce: Callable[[str], None] | None
) -> Callable[[list[Any], RunCache], None]:
    """Refuse a budget whose hidden states do not fit in memory, naming one that does; then
    say what the run will take (`experiments.cost`). Returns what says, on a resumed run,
    the part of that estimate left (`_announce_left`)."""
    import torch

    from identifiable.experiments.cost import check_memory, memory_bytes, reproduce_estimate
    from identifiable.experiments.stages import BUDGETS
    from identifiable.experiments.tokens import probe_device, smoke_safe_tokens
    from identifiable.models.budget import available_memory
    from identifiable.tokens.evaluate import fit_workers

    workers = fit_workers(None, probe_device(model), model.info.n_layers)

    def need(b: Budget) -> int:
        cap = smoke_safe_tokens(b.token_max_tokens, model.info.hidden_size, b.max_tokens)
        return memory_bytes(model, cap, workers)

    available = available_memory()
    fits = [b for b in BUDGETS.values() if available is None or need(b) <= available]
    smaller = max(fits, key=need, default=None)
    advice = (
        f"use --budget {smaller.name} (about {need(smaller) / 2**30:.1f} GiB)"
        if smaller is not None
        else "use a machine with more memory"
    )
    where = f"--budget {plan.name} on {model.info.name}"
    check_memory(need(plan), available, where, advice)
    estimate = reproduce_estimate(model, plan, torch.get_num_threads())
    if announce is not None:
        announce(estimate.sentence(f"reproduce {where}"))
    return functools.partial(_announce_left, estimate, announce)


def _announce_left(
    estimate: Estimate,
    announce: Callable[[str], None] | None,
    stage_list: list[Any],
    cache: RunCache,
) -> None:
    """On a resumed run, say how many shards the cache holds and what is left to do."""
    from identifiable.experiments.cost import minutes

    if announce is None:
        return
    done: dict[str, float] = {"load": 1.0}
    finished = 0
    for s in stage_list:
        cached = [cache.finished(s.name, k) for k in range(len(s.shards))]
        finished += sum(cached)
        done[s.name] = sum(w for w, c in zip(s.weights, cached, strict=True) if c) / max(
            1, sum(s.weights)
        )
    if finished:
        shards = sum(len(s.shards) for s in stage_list)
        left = estimate.left(done)
        announce(
            f"resuming: {finished} of {shards} shards are done; about {minutes(left.total_s)} left"
        )


def _prepare(
    model: Any, corpus: Any, plan: Budget, seed: int, device: str, bars: Any
) -> tuple[Any, list[Any], dict[str, Any]]:
    """(the model, the run's items, the settings that key the run's cache)."""
    task = bars.add_task("loading model and corpus", total=None)
    m = resolve_model(model, local_device(device))
    check_finite_weights(m.hf_model, f"'{m.info.name}'")  # before any folder is written
    items, corpus_info = corpus_items(corpus, m, plan, seed)
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
    return m, items, settings


def _run(
    work: Path,
    world: Any,
    m: Any,
    items: list[Any],
    plan: Budget,
    seed: int,
    settings: dict[str, Any],
    bars: Any,
    t_start: float,
    announce_left: Callable[[list[Any], RunCache], None],
) -> tuple[list[Path], dict[str, Any] | None, dict[str, float]]:
    """Every stage (shared by the ranks), then on rank 0 the report in `work`: (files,
    summary, timings); ([], None, timings) on the other ranks."""
    barrier(world, "out-ready")
    cache = RunCache(work, settings)
    if world.is_main:
        cache.start()
    barrier(world, "cache-ready")
    # world_size: how many processes shared the stages (in .cache, not the outputs)
    timings: dict[str, float] = {"load_s": time.perf_counter() - t_start, "world_size": world.size}
    stage_list = stages(m, items, plan, seed, work / CACHE_DIR)
    announce_left(stage_list, cache)  # says nothing on ranks other than 0 (announce None)
    t_stages = time.perf_counter()
    done = run_stages(cache, stage_list, bars, world)
    timings["stages_s"] = time.perf_counter() - t_stages  # the part that shards
    if done is None:
        return [], None, timings
    results: dict[str, dict[str, pd.DataFrame]] = {}
    for name, (tables, seconds) in done.items():
        results[name], timings[f"{name}_s"] = tables, seconds
    task = bars.add_task("writing report", total=None)
    files, summary = write_report(work, m, results, settings)
    bars.update(task, total=1, completed=1)
    timings["total_s"] = time.perf_counter() - t_start
    atomic_write_text(work / CACHE_DIR / "timings.json", json.dumps(timings, indent=2))
    return files, summary, timings
