"""`identifiable scan`: per-head identifiability of every layer over many texts, on the
device the model is loaded on; writes OUT/scan.safetensors, heads.csv and summary.json."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from identifiable.cli.common import (
    check_model_name,
    console,
    index_list,
    load,
    resumable,
    whole_values,
)
from identifiable.cli.options import (
    DeviceOption,
    ForceOption,
    MaxCorpusOption,
    MaxLineOption,
    MemoryBudgetOption,
    ModelOption,
    NoProgressOption,
    ResumeOption,
)
from identifiable.errors import IdentifiableError


def scan(
    texts: Annotated[
        list[str] | None, typer.Argument(help="Texts to scan (or --corpus for a corpus).")
    ] = None,
    model: ModelOption = "minilm",
    corpus: Annotated[
        str | None,
        typer.Option("--corpus", "-c", help="A corpus: 'wikipedia-sample', a text/JSONL/XML file."),
    ] = None,
    unit: Annotated[
        str, typer.Option("--unit", help="Corpus unit: document, paragraph or sentence.")
    ] = "document",
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Scan the corpus's first N texts.")
    ] = None,
    layers: Annotated[
        str | None, typer.Option("--layers", help="Layers to scan, 0..L-1, e.g. 0,5,31.")
    ] = None,
    heads: Annotated[str | None, typer.Option("--heads", help="Heads to scan, 0..H-1.")] = None,
    sink: Annotated[
        int, typer.Option("--sink", help="The sink key's position (0: the first token).")
    ] = 0,
    keep: Annotated[
        str | None,
        typer.Option("--keep", help="Heads whose full maps are kept, LAYER:HEAD,… e.g. 3:5,3:6."),
    ] = None,
    variant: Annotated[
        str, typer.Option("--variant", help="'paper' (off LN(T)) or 'row-stochastic'.")
    ] = "paper",
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", min=1, help="Scan each text's first N tokens.")
    ] = None,
    device: DeviceOption = "cpu",
    memory_budget: MemoryBudgetOption = None,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Output folder (empty unless --resume/--force).")
    ] = Path("scan"),
    resume: ResumeOption = False,
    force: ForceOption = False,
    no_progress: NoProgressOption = False,
    max_corpus_mib: MaxCorpusOption = 256,
    max_line_kib: MaxLineOption = 1024,
) -> None:
    """Null fraction, dim LN(T), sink and diagonal mass (raw and effective) of every head;
    one forward pass per text, each layer reduced on the model's device as it runs."""
    from identifiable.corpus import read_limits
    from identifiable.experiments.distributed import is_main_process, local_device
    from identifiable.models.devices import resolve_device
    from identifiable.runs.scan import scan as run

    check_model_name(model)
    if (corpus is None) == (not texts):
        raise IdentifiableError("give texts to scan or --corpus, not both (and not neither)")
    if memory_budget is not None and memory_budget < 1:
        raise IdentifiableError(f"--memory-budget must be at least 1 MiB, got {memory_budget}")
    layer_list, head_list = index_list(layers, "--layers"), index_list(heads, "--heads")
    pairs = _keep(keep)
    resolve_device(where := local_device(device))
    limits = read_limits(max_bytes=max_corpus_mib << 20, max_line_bytes=max_line_kib << 10)
    with limits:
        items: Any = texts if corpus is None else _corpus(corpus, unit, limit)
        m = load(model, device=where)
        with resumable():
            result = run(
                m,
                items,
                layers=layer_list,
                heads=head_list,
                sink=sink,
                keep=pairs,
                variant=variant,
                max_tokens=max_tokens,
                out=out,
                resume=resume,
                force=force,
                progress=not no_progress,
                memory_budget=None if memory_budget is None else memory_budget << 20,
            )
    if is_main_process():
        _print_summary(result, out)


def _keep(text: str | None) -> list[tuple[int, int]] | None:
    """`--keep 3:5,3:6` as (layer, head) pairs, or one line."""
    if text is None:
        return None
    pairs = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        layer, sep, head = part.partition(":")
        try:
            if not sep:
                raise ValueError
            pairs.append((int(layer), int(head)))
        except ValueError:
            raise IdentifiableError(
                f"--keep takes LAYER:HEAD pairs, e.g. --keep 3:5,3:6; got '{part}'"
            ) from None
    return pairs


def _corpus(name: str, unit: str, limit: int | None) -> Any:
    from identifiable.corpus import load_corpus

    if unit not in ("document", "paragraph", "sentence"):
        raise IdentifiableError(f"--unit {unit!r} is not one of document, paragraph, sentence")
    return load_corpus(name, unit=unit, limit=limit)


def _print_summary(result: Any, out: Path) -> None:
    """Per layer, the mean over texts and heads of each statistic."""
    table = Table(
        title=f"{result.model_name}: {result.n_texts} texts, variant {result.variant}, "
        f"sink key {result.sink} (means over texts and heads)"
    )
    for col in ("layer", "dim LN(T)", "null fraction", "sink raw", "sink eff.", "top key same"):
        table.add_column(col, justify="right")
    layers = result.layers or range(result.n.shape[1])
    for i, layer in enumerate(layers):
        table.add_row(
            str(layer),
            f"{float(result.dim[:, i].mean()):.1f}",
            f"{float(result.null_fraction[:, i].mean()):.3f}",
            f"{float(result.sink_raw[:, i].mean()):.3f}",
            f"{float(result.sink_effective[:, i].mean()):+.3f}",
            f"{float(result.top_key_same[:, i].mean()):.3f}",
        )
    console.print(whole_values(table))
    console.print(
        f"written: {out / 'scan.safetensors'}, {out / 'heads.csv'}, {out / 'summary.json'}"
    )


def register(app: typer.Typer) -> None:
    app.command()(scan)
