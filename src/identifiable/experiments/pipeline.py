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
from identifiable.store.cache import RunCache

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
    `weights` (one per shard) drive the progress bar.
    """

    name: str
    label: str
    shards: list[list[Item]]
    weights: list[int]
    compute: Callable[[Sequence[Item], int, Advance], Tables]
    reduce: Callable[[Sequence[Tables]], Tables] = field(default=concat_reduce)


def resolve_model(model: Any, device: str = "cpu") -> Any:
    if isinstance(model, str | Path):
        from identifiable.models import load_model

        return load_model(str(model), device=device)
    return model


def resolve_corpus(
    corpus: Any, model: Any, budget: Any, seed: int
) -> tuple[list[Item], dict[str, Any]]:
    """Items (pairs formatted later as [CLS] a [SEP] b [SEP]) and a description for the settings."""
    if isinstance(corpus, str | Path):
        from identifiable.corpus import load_corpus

        c = load_corpus(
            corpus, unit="pair", tokenizer=model.tokenizer, max_tokens=budget.max_tokens, seed=seed
        )
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
    digest = hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()[:16]
    return items, {"name": "custom", "unit": "given", "items": len(items), "fingerprint": digest}  # type: ignore[return-value]


def shard_items(items: Sequence[Item], size: int) -> list[list[Item]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def short_items(model: Any, items: Sequence[Item], max_tokens: int, count: int) -> list[Item]:
    """The first `count` items of at most `max_tokens` tokens (attribution costs O(n²·d));
    if fewer exist, the shortest items instead, so that the stage always has work."""
    lengths: list[int] = []
    short: list[int] = []
    for i, item in enumerate(items):
        lengths.append(len(model.encode(item, truncate=True)))
        if lengths[-1] <= max_tokens:
            short.append(i)
            if len(short) == count:
                return [items[k] for k in short]
    shortest = sorted(sorted(range(len(items)), key=lambda k: lengths[k])[:count])
    return [items[k] for k in shortest]


# ---- running stages ------------------------------------------------------------


def run_stage(cache: RunCache, stage: Stage, progress: Any) -> tuple[Tables, float]:
    """Run (or load) every shard of a stage, then reduce the partial tables.

    Returns the tables and the seconds spent computing (0 when all shards were cached).
    """
    task = progress.add_task(stage.label, total=sum(stage.weights))
    parts: list[Tables] = []
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
        parts.append(tables)
    return stage.reduce(parts), seconds


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
