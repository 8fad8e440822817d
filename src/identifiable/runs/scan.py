"""`identifiable.scan`: per-head identifiability of every layer of a model over many texts,
on the device the model lives on (docs/scan.md).

Everything a user can get wrong is refused in one line before the first forward pass:
the texts, the layers and heads, the sink key, `keep=`, the device, and the memory the
scan will take (`memory_budget=`). The work is the `experiments.scan` stage, run in this
process, resumed from an output folder (`out=`, `resume=True`), or shared out across the
ranks of `torchrun` as `reproduce` shares its shards; all three give the same result.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from identifiable.attention.preflight import scan_bytes
from identifiable.attention.scan import ScanPlan, ScanResult, check_keep, plan_groups
from identifiable.errors import IdentifiableError
from identifiable.experiments.distributed import (
    barrier,
    broadcast,
    check_same_run,
    join,
    stop_cleanly,
)
from identifiable.experiments.pipeline import concat_reduce, progress_bars, run_stages
from identifiable.experiments.scan import PREVIEW, STAGE, scan_result, scan_stage
from identifiable.models.arguments import check_model
from identifiable.models.budget import available_memory, check_analysis, device_room
from identifiable.models.selection import indices
from identifiable.store.cache import RunCache, settings_key
from identifiable.store.files import atomic_write_bytes, atomic_write_text
from identifiable.store.outdir import OutputFolder
from identifiable.utils.checks import count, shown
from identifiable.utils.precision import float32_matmuls_exact, has_float64

RESULT_FILE = "scan.safetensors"
TABLE_FILE = "heads.csv"
SUMMARY_FILE = "summary.json"
VARIANTS = ("paper", "row-stochastic")


def scan(
    model: Any,
    texts: Any,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    sink: int = 0,
    keep: Sequence[Sequence[int]] | None = None,
    variant: str = "paper",
    device: str | torch.device | None = None,
    max_tokens: int | None = None,
    memory_budget: int | None = None,
    column: str = "text",
    progress: bool | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    force: bool = False,
) -> ScanResult:
    """Per text, layer and query head: n, dim LN(T), the null fraction ‖A − A_eff‖_F / ‖A‖_F,
    raw and effective attention to the sink key and to the diagonal, and the share of
    rows whose top key A_eff keeps (`attention.scan.STATISTICS`), as a `ScanResult`.

    Args:
        model: an `identifiable.models.Model` (`identifiable.load_model`), on the device
            the scan runs on (CPU, CUDA or MPS).
        texts: a list of texts (or `(a, b)` pairs, or token ids as 1-D integer tensors,
            used as given), a `Corpus` or a `datasets.Dataset` (its `column`).
        layers: the model's layers to scan (default all).
        heads: the query heads to scan (default all).
        sink: the key whose attention mass is reported (default 0, the first token).
        keep: `(layer, head)` pairs whose full raw and effective maps are returned for
            every text (`ScanResult.head`); nothing else leaves the device as a map.
        variant: "paper" (project off LN(T)) or "row-stochastic" (off LN([T, 1])).
        device: where the scan must run: refused unless the model is there (default:
            the model's device).
        max_tokens: scan the first `max_tokens` tokens of each text (default: the whole
            text, up to the model's maximum).
        memory_budget: bytes the scan may use in host memory (default: what is free
            now); a scan over it, or over a CUDA device's free memory, is refused
            before the first forward pass. Peak: the forward pass of the longest text,
            one group of heads' maps and their projection, and the kept maps
            (`preflight.scan_bytes`).
        progress: bars of the texts scanned (None: when a person is watching).
        out: a folder to write the result into (`scan.safetensors`, `heads.csv`,
            `summary.json`) and to resume from; needed under `torchrun`, where the ranks
            share its shard cache.
        resume: continue an interrupted scan into `out`.
        force: replace a finished scan in `out`.

    Under `torchrun`, call it on every rank with the same arguments: the texts are
    shared out across the ranks as `reproduce` shares its shards, rank 0 writes `out`,
    and every rank returns the same result as one process would.
    """
    check_model(model)
    if not isinstance(variant, str) or variant not in VARIANTS:
        raise IdentifiableError(f"unknown variant {variant!r}: use one of {', '.join(VARIANTS)}")
    if memory_budget is not None:
        memory_budget = count(memory_budget, "memory_budget", "--memory-budget")
    where = check_device(model, device)
    items = scan_items(texts, column)
    chosen = indices(layers, model.info.n_layers, "layers") or list(range(model.info.n_layers))
    picked = indices(heads, model.info.n_heads, "heads")
    head_list = sorted(picked) if picked is not None else list(range(model.info.n_heads))
    kept = check_keep(keep, sorted(chosen), head_list)
    encs = [encode(model, item, max_tokens) for item in items]
    check_sink(sink, encs)
    plan = make_plan(
        model, encs, sorted(chosen), head_list, sink, kept, variant, where, memory_budget
    )
    previews = [_preview(item) for item in items]
    stage = scan_stage(model, encs, plan, previews)
    shown = _shown(progress)
    if out is None:
        return _run_here(model, stage, plan, where, picked is None, shown)
    settings = _settings(model, items, plan, max_tokens)
    return _run_into(
        Path(out), model, stage, plan, settings, where, picked is None, resume, force, shown
    )


def _run_here(
    model: Any, stage: Any, plan: ScanPlan, where: torch.device, all_heads: bool, shown: bool
) -> ScanResult:
    """The scan in this process, without a folder (refused under torchrun)."""
    if join(str(where)).distributed:
        raise IdentifiableError(
            "under torchrun, scan needs out= (a folder every rank can reach): the ranks "
            "share their texts' results there",
            cli="under torchrun, identifiable scan needs --out on a folder every rank reaches",
        )
    with progress_bars(shown) as bars:
        task = bars.add_task(stage.label, total=sum(stage.weights))
        parts = [
            stage.compute(shard, k, lambda m: bars.advance(task, m))
            for k, shard in enumerate(stage.shards)
        ]
    return scan_result(concat_reduce(parts), plan, model, all_heads=all_heads)


def check_device(model: Any, device: str | torch.device | None) -> torch.device:
    """The device the scan runs on: the model's; `device`, when given, must be one the
    model's weights are on."""
    on = sorted({str(p.device) for p in model.hf_model.parameters()})
    if device is None:
        return torch.device(model.device)
    try:
        want = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise IdentifiableError(
            f"unknown device {device!r}: use cpu, cuda, cuda:N or mps"
        ) from None
    matches = [
        d
        for d in on
        if torch.device(d).type == want.type
        and (want.index is None or torch.device(d).index in (want.index, None))
    ]
    if not matches:
        raise IdentifiableError(
            f"the model is on {', '.join(on)}, not on {want}: the scan runs where the model's "
            f"weights are; move the model (load_model(..., device='{want}')) or pass "
            f"device='{on[0]}'",
            cli=f"the model is on {', '.join(on)}, not on {want}; pass --device {on[0]}",
        )
    return torch.device(matches[0])


def scan_items(texts: Any, column: str) -> list[Any]:
    """The texts as a list (a `datasets.Dataset`'s `column`, a `Corpus`'s items), checked."""
    from identifiable.corpus.sources import dataset_items, is_dataset
    from identifiable.utils.unicode import check_unicode

    if isinstance(texts, str | bytes | Path):
        raise IdentifiableError(
            "texts= takes a list of texts, a Corpus or a datasets.Dataset; for one text pass "
            "[text], for a corpus file load_corpus(path)"
        )
    if not is_dataset(texts) and not isinstance(texts, Iterable):
        raise IdentifiableError(
            f"texts= takes a list of texts, a Corpus or a datasets.Dataset, got {shown(texts)}"
        )
    items = dataset_items(texts, column) if is_dataset(texts) else list(texts)
    if not items:
        raise IdentifiableError("texts= is empty: give at least one text")
    for number, item in enumerate(items, start=1):
        if _token_ids(item):
            continue
        parts = item if isinstance(item, tuple | list) and len(item) == 2 else (item,)
        for text in parts:
            if not isinstance(text, str):
                raise IdentifiableError(
                    f"text {number} is a {type(text).__name__}; texts are str or (str, str) pairs"
                )
            check_unicode(text, f"text {number}")
    return [tuple(x) if isinstance(x, list) else x for x in items]


def _token_ids(item: Any) -> bool:
    """Token ids made by the caller (a 1-D integer tensor), scanned as given."""
    return isinstance(item, torch.Tensor) and item.dim() == 1 and not item.is_floating_point()


def encode(model: Any, item: Any, max_tokens: int | None) -> Any:
    """The model's encoding of one text, cut to its first `max_tokens` tokens."""
    from identifiable.models.encoding import Encoding

    enc = model.encode(item)
    if max_tokens is None or len(enc) <= max_tokens:
        return enc
    tt = enc.token_type_ids
    return Encoding(
        enc.input_ids[:max_tokens],
        list(enc.tokens[:max_tokens]),
        enc.n_dropped + len(enc) - max_tokens,
        None if tt is None else tt[:max_tokens],
    )


def check_sink(sink: Any, encs: Sequence[Any]) -> None:
    shortest = min(len(e) for e in encs)
    if isinstance(sink, bool) or not isinstance(sink, int) or not 0 <= sink < shortest:
        text = f"is out of range: the shortest text has {shortest} tokens, so the sink key is "
        raise IdentifiableError(
            f"sink={sink!r} {text}0..{shortest - 1} (the first token: sink=0)",
            cli=f"--sink {sink} {text}0..{shortest - 1} (the first token: --sink 0)",
        )


def make_plan(
    model: Any,
    encs: Sequence[Any],
    layers: list[int],
    heads: list[int],
    sink: int,
    keep: frozenset[tuple[int, int]],
    variant: str,
    device: torch.device,
    memory_budget: int | None,
) -> ScanPlan:
    """The plan, with heads per group chosen and the memory checked (one line if it cannot
    fit): on a CUDA device the forward pass and one group against its free memory and the
    kept maps against host memory; elsewhere all of it against host memory."""
    dtype = (
        torch.float32 if not has_float64(device) or float32_matmuls_exact(device) else torch.float64
    )
    n = max(len(e) for e in encs)
    kept_maps = sum(len(e) ** 2 for e in encs) * len(keep)
    need = scan_bytes(model, n, layers, heads, dtype, group=1, kept_maps=kept_maps)
    room = device_room(device)
    free = room if room is not None else memory_budget or available_memory()
    spare = (free if free is not None else 1 << 62) - need.total(room is None)
    per_head = need.per_head
    heads_per_kv = model.info.n_heads // model.info.n_kv_heads
    group = plan_groups(
        per_head, min(spare + per_head, max(per_head, need.forward // 4)), heads_per_kv
    )
    need = scan_bytes(model, n, layers, heads, dtype, group=group, kept_maps=kept_maps)
    python = "keep fewer maps (keep=), scan fewer heads (heads=) or shorter texts (max_tokens=)"
    cli = "keep fewer maps (--keep), scan fewer heads (--heads) or shorter texts (--max-tokens)"
    what = f"scan ({len(encs)} texts, up to {n} tokens)"
    if room is not None:
        check_analysis(need.device, None, what, device=device, python=python, cli=cli)
        check_analysis(need.host, memory_budget, what, python=python, cli=cli)
    else:
        check_analysis(need.device + need.host, memory_budget, what, python=python, cli=cli)
    return ScanPlan(tuple(layers), tuple(heads), sink, keep, variant, dtype, group)


def _preview(item: Any) -> str:
    if _token_ids(item):
        return f"[{item.numel()} token ids]"
    text = item if isinstance(item, str) else " | ".join(item)
    return text[:PREVIEW]


def _shown(progress: bool | None) -> bool:
    from identifiable.utils.progress import watching

    return watching() if progress is None else bool(progress)


def _settings(model: Any, items: list[Any], plan: ScanPlan, max_tokens: int | None) -> dict:
    plain = [x.tolist() if _token_ids(x) else x for x in items]
    digest = hashlib.sha256(json.dumps(plain, ensure_ascii=False).encode()).hexdigest()[:16]
    return {
        "model": model.info.name,
        "model_fingerprint": model.fingerprint,
        "texts": {"items": len(items), "fingerprint": digest},
        "layers": list(plan.layers),
        "heads": list(plan.heads),
        "sink": plan.sink,
        "keep": sorted(list(k) for k in plan.keep),
        "variant": plan.variant,
        "dtype": str(plan.dtype),
        "max_tokens": max_tokens,
        "format": 1,
    }


def _run_into(
    out: Path,
    model: Any,
    stage: Any,
    plan: ScanPlan,
    settings: dict,
    device: torch.device,
    all_heads: bool,
    resume: bool,
    force: bool,
    shown: bool,
) -> ScanResult:
    """The scan through `out`'s shard cache (resumable, shared by torchrun's ranks); rank 0
    writes the files, every rank returns the result."""
    world = join(str(device))
    with stop_cleanly(world):
        folder = OutputFolder(out, resume=resume, force=force, kind="scan")
        if world.is_main:
            folder.check()
        check_same_run(world, settings_key(settings))
        owner = (
            folder.run(lambda d: RunCache(d, settings).check_resumable())
            if world.is_main
            else contextlib.nullcontext(folder.partial)
        )
        result = None
        with owner as work, progress_bars(shown and world.is_main) as bars:
            barrier(world, "out-ready")
            cache = RunCache(work, settings)
            if world.is_main:
                cache.start()
            barrier(world, "cache-ready")
            done = run_stages(cache, [stage], bars, world)
            if done is not None:
                result = scan_result(done[STAGE][0], plan, model, all_heads=all_heads)
                write_outputs(work, result)
        broadcast(world, "scan-done", "ok" if world.is_main else None)
    return result if result is not None else ScanResult.load(out / RESULT_FILE)


def write_outputs(folder: Path, result: ScanResult) -> None:
    """`scan.safetensors` (the result), `heads.csv` (its table) and `summary.json`."""
    from identifiable.results.files import file_bytes

    atomic_write_bytes(folder / RESULT_FILE, file_bytes(result))
    atomic_write_text(folder / TABLE_FILE, result.to_pandas().to_csv(index=False))
    frac = result.null_fraction
    summary = {
        "model": result.model_name,
        "texts": result.n_texts,
        "layers": list(result.layers) if result.layers is not None else "all",
        "heads": list(result.heads) if result.heads is not None else "all",
        "variant": result.variant,
        "sink": result.sink,
        "mean_null_fraction": float(frac.mean()),
        "mean_sink_raw": float(result.sink_raw.mean()),
        "mean_sink_effective": float(result.sink_effective.mean()),
        "kept": [list(k) for k in result.kept],
    }
    atomic_write_text(folder / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
