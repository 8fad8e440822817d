"""The one-way stage pipeline: corpus items → shards → partial tidy tables → reduce.

A `Stage` maps one shard of corpus items to small partial tables (never n×n
matrices, so caches stay small) and a `reduce` merges the partial tables of all
shards, in shard order, into the final ones. Shards are fixed by the settings
(never by where a run stopped or by how many processes run it), so a run can be
cached per shard, resumed, and split across `torch.distributed` ranks with the
same results. The maths lives in `identifiable.attention`, `identifiable.tokens`,
`identifiable.attribution` and `identifiable.mixing`; each experiment module in
this package owns its stage function.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from identifiable.errors import IdentifiableError
from identifiable.experiments.distributed import SINGLE, World, barrier, claims, work_order
from identifiable.store.cache import RunCache
from identifiable.utils.progress import progress_bars  # noqa: F401  (the run's bars; imported from here)
from identifiable.utils.unicode import check_unicode

Item = str | tuple[str, str]
Advance = Callable[[int], None]
Tables = dict[str, pd.DataFrame]


def concat_reduce(parts: Sequence[Tables]) -> Tables:
    """The default reduce: each table's shard parts concatenated in shard order."""
    names: list[str] = []
    for tables in parts:
        names += [n for n in tables if n not in names]
    return {
        name: pd.concat([t[name] for t in parts if name in t], ignore_index=True) for name in names
    }


@dataclass
class Stage:
    """A cached unit of work.

    `compute(shard, index, advance)` maps shard `index` to partial tables; `reduce`
    merges the partial tables of every shard (in shard order) into the final tables.
    `weights` (one per shard) drive the progress bar; `cost` (one per shard, default the
    weights) orders the shared work queue of a distributed run, most expensive first.
    `workers`: shards of this stage computed at once, each in a thread of its own (the
    probe fits of Fig. 2, which run on one intra-op thread each); every shard is cached as
    soon as it is done, so an interrupted run loses none that finished.
    """

    name: str
    label: str
    shards: list[list[Item]]
    weights: list[int]
    compute: Callable[[Sequence[Item], int, Advance], Tables]
    reduce: Callable[[Sequence[Tables]], Tables] = field(default=concat_reduce)
    cost: list[float] | None = None
    workers: int = 1

    @property
    def costs(self) -> list[float]:
        """Relative cost of each shard, for scheduling across ranks (default: the weights)."""
        return [float(c) for c in (self.cost or self.weights)]


def resolve_model(model: Any, device: str = "cpu") -> Any:
    if isinstance(model, str | Path):
        from identifiable.models import load_model

        return load_model(str(model), device=device)
    return model


def corpus_items(
    corpus: Any, model: Any, budget: Any, seed: int
) -> tuple[list[Item], dict[str, Any]]:
    """The run's items, checked, and a description for its settings.

    A corpus name or path goes through `corpus.resolve_corpus` (pairs formatted later as
    [CLS] a [SEP] b [SEP], at most `budget.max_tokens` tokens, in the corpus's order);
    given texts or pairs must be a non-empty list of valid Unicode text."""
    from identifiable.corpus import Corpus, resolve_corpus

    _check_reads_text(model)
    if isinstance(corpus, str | Path):
        c = resolve_corpus(corpus, model.tokenizer, max_tokens=budget.max_tokens, seed=seed)
        assert isinstance(c, Corpus)  # a name always loads one
        return list(c), {
            "name": c.name,
            "unit": c.unit,
            "items": len(c),
            "fingerprint": c.fingerprint,
        }
    items = [tuple(x) if isinstance(x, list | tuple) else x for x in corpus]
    if not items or not all(
        isinstance(x, str) or (isinstance(x, tuple) and len(x) == 2) for x in items
    ):
        raise IdentifiableError(
            "corpus must be a corpus name or a non-empty list of texts or (text, text) pairs"
        )
    for number, item in enumerate(items, start=1):
        for text in (item,) if isinstance(item, str) else item:
            check_unicode(text, f"corpus item {number}")
    digest = hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()[:16]
    return items, {"name": "custom", "unit": "given", "items": len(items), "fingerprint": digest}  # type: ignore[return-value]


def _check_reads_text(model: Any) -> None:
    """The experiments read text: an image model or one without a tokenizer is refused
    before the corpus is read (with what to do, not a tokenizer= argument)."""
    name = getattr(getattr(model, "info", None), "name", "") or "this model"
    if getattr(model, "modality", "text") == "image":
        spec = getattr(getattr(model, "spec", None), "name", "image")
        raise IdentifiableError(
            f"'{name}' is an image model ({spec}); the reproduction runs the paper's text "
            "experiments: give a text model, or look at an image with identifiable view --image"
        )
    if getattr(model, "tokenizer", None) is None:
        raise IdentifiableError(
            f"'{name}' has no tokenizer, and the reproduction reads a text corpus: copy the "
            "tokenizer files of the model it came from (tokenizer.json or vocab.txt, "
            "tokenizer_config.json) into its folder"
        )


def shard_items(items: Sequence[Item], size: int) -> list[list[Item]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


# ---- running stages ------------------------------------------------------------


def run_stages(
    cache: RunCache, stages: Sequence[Stage], progress: Any, world: World = SINGLE
) -> dict[str, tuple[Tables, float]] | None:
    """Run (or load from the cache) every shard of every stage, then reduce each stage.

    One process computes every shard in stage order. Under `torch.distributed` every rank
    claims shards from a shared work queue (see `experiments.distributed`) and writes them
    to the shared cache; after a barrier rank 0 reads all shards back, in shard order, and
    reduces. Returns {stage name: (tables, seconds this rank spent computing it)} on rank 0,
    None on the other ranks.
    """
    from identifiable.store.files import retry_advice

    with (
        retry_advice("rerun the same command with --resume (finished shards are kept)"),
        summarised_truncations(),
    ):
        return _run_stages(cache, stages, progress, world)


def _run_stages(
    cache: RunCache, stages: Sequence[Stage], progress: Any, world: World
) -> dict[str, tuple[Tables, float]] | None:
    tasks = [progress.add_task(s.label, total=sum(s.weights)) for s in stages]
    flat = [(si, k) for si, s in enumerate(stages) for k in range(len(s.shards))]
    order = (
        work_order([stages[si].costs[k] for si, k in flat])
        if world.distributed
        else list(range(len(flat)))
    )
    parts: dict[tuple[int, int], Tables] = {}
    spans: list[list[tuple[float, float]]] = [[] for _ in stages]

    def run(slot: int) -> None:
        si, k = flat[slot]
        stage = stages[si]
        cached = cache.load(stage.name, k)
        if cached is None:
            start = time.perf_counter()
            advance: Advance = functools.partial(progress.advance, tasks[si])
            tables = stage.compute(stage.shards[k], k, advance)
            spans[si].append((start, time.perf_counter()))
            cache.save(stage.name, k, tables, {"items": len(stage.shards[k])})
        else:
            tables = cached[0]
            progress.advance(tasks[si], stage.weights[k])
        parts[(si, k)] = tables

    _run_slots(claims(world, order), [stages[si].workers for si, _ in flat], flat, run)
    seconds = [_busy_seconds(s) for s in spans]
    barrier(world, "shards-done")
    if not world.is_main:
        return None
    results: dict[str, tuple[Tables, float]] = {}
    for si, stage in enumerate(stages):
        shard_tables = []
        for k in range(len(stage.shards)):
            if (si, k) not in parts:  # computed by another rank: read it from the shared cache
                loaded = cache.load(stage.name, k)
                if loaded is None:
                    raise IdentifiableError(
                        f"shard {k} of stage '{stage.name}' is missing from the cache after "
                        "every rank finished; the ranks must share one --out folder "
                        "(a shared filesystem on several nodes); rerun with --resume"
                    )
                parts[(si, k)] = loaded[0]
            shard_tables.append(parts[(si, k)])
        progress.update(tasks[si], completed=sum(stage.weights))
        results[stage.name] = (stage.reduce(shard_tables), seconds[si])
    return results


def _run_slots(
    slots: Iterator[int],
    workers: Sequence[int],
    flat: Sequence[tuple[int, int]],
    run: Callable[[int], None],
) -> None:
    """Run `run(slot)` for every claimed slot, in claim order: a stage's shards up to its
    `workers` at once in threads, never two stages at once. On an error or an interrupt the
    shards already running finish (and are cached) before it propagates; none start."""
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

    most = max(workers, default=1)
    pool = ThreadPoolExecutor(most, thread_name_prefix="shards") if most > 1 else None
    running: list[Future] = []
    stage = -1

    def settle(keep: int) -> None:
        while len(running) > keep:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                running.remove(future)
                future.result()  # re-raises a shard's error here

    try:
        for slot in slots:
            w = workers[slot]
            if flat[slot][0] != stage or w == 1:
                settle(0)
            stage = flat[slot][0]
            if pool is None or w == 1:
                run(slot)
                continue
            settle(w - 1)
            running.append(pool.submit(run, slot))
        settle(0)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _busy_seconds(spans: list[tuple[float, float]]) -> float:
    """Wall seconds covered by the union of (start, end) spans (shards that ran at once
    count once)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


@contextmanager
def summarised_truncations() -> Iterator[None]:
    """One warning line for every text truncated in the block, instead of one per text
    (a model with a short context truncated 20-64 sequences of a run, one line each).
    Other warnings are shown as they come."""
    import warnings

    from identifiable.models import TruncationWarning

    seen: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("always", TruncationWarning)  # count repeats too
        show = warnings.showwarning

        def count(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
            if issubclass(category, TruncationWarning):
                seen.append(str(message))
            else:
                show(message, category, *args, **kwargs)

        warnings.showwarning = count
        yield
    if seen:
        warnings.warn(
            f"{len(seen)} {'text was' if len(seen) == 1 else 'texts were'} longer than the "
            f"model takes and truncated (e.g. {seen[0]})",
            TruncationWarning,
            stacklevel=3,
        )
