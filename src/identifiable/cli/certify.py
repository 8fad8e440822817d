"""`identifiable certify`: attention intervals of whole heads, as a Parquet table and a summary."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from identifiable.cli.common import (
    check_writable,
    console,
    load,
    mib,
    whole_values,
    write_atomic,
)
from identifiable.cli.options import (
    ForceOption,
    MemoryBudgetOption,
    ModelOption,
    NoTruncateOption,
    PairOption,
    TimeBudgetOption,
)
from identifiable.errors import IdentifiableError

IDENTIFIABLE_WIDTH = 1e-3  # an interval narrower than this counts as an identifiable weight
COLUMNS = ("layer", "head", "query", "key", "raw", "lower", "upper", "constrained")


_TextArg = Annotated[str, typer.Argument(help="The text to analyse.")]

_LayerArg = Annotated[
    int | None, typer.Option("--layer", "-l", help="Layer, 0..L-1 as printed (default all).")
]

_HeadArg = Annotated[int | None, typer.Option("--head", help="Head, 0..H-1 (default all).")]

_RowArg = Annotated[int | None, typer.Option("--row", "-r", help="Only this query row, 0..n-1.")]

_OutArg = Annotated[
    Path | None, typer.Option("--out", "-o", help="Write the interval map here (Parquet).")
]

_WorkersArg = Annotated[
    int, typer.Option("--workers", help="Processes: heads in parallel, or pieces of one head.")
]

_ThreadsArg = Annotated[
    int | None,
    typer.Option(
        "--threads",
        help="Threads of the interval engine in this process (default: torch's thread count).",
    ),
]


def certify(
    text: _TextArg,
    pair: PairOption = None,
    model: ModelOption = "minilm",
    layer: _LayerArg = None,
    head: _HeadArg = None,
    row: _RowArg = None,
    out: _OutArg = None,
    time_budget: TimeBudgetOption = None,
    workers: _WorkersArg = 1,
    threads: _ThreadsArg = None,
    force: ForceOption = False,
    no_truncate: NoTruncateOption = False,
    memory_budget: MemoryBudgetOption = None,
) -> None:
    """Interval map: for every key of every row, the min and max weight of any valid attention
    row (≥ 0, summing to 1) with the same head output, and the constrained effective attention
    (the valid row closest to uniform). Prints a summary per head."""
    from identifiable.attention import constrained_attention, interval_map

    _check_flags(out, workers, threads, time_budget, force)
    budget = mib(memory_budget)
    m = load(model)
    tr = m.trace((text, pair) if pair is not None else text, truncate=not no_truncate)
    # --layer, --head and --row are checked by interval_map, by the rule of layers=, heads=
    # and rows= (identifiable.utils.checks)
    layers = [layer] if layer is not None else None
    heads = [head] if head is not None else None
    rows = [row] if row is not None else None
    imap = interval_map(
        tr,
        layers=layers,
        heads=heads,
        rows=rows,
        workers=workers,
        threads=threads,
        time_budget=time_budget,
        progress=True,
        memory_budget=budget,
    )
    records: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    table = Table(
        title=f"{m.info.name}: {tr.n_tokens} tokens; intervals of valid rows with the same head "
        f"output ({imap.lps_solved} LPs, {imap.seconds:.1f} s)"
    )
    for col in (*TABLE_COLUMNS, f"identifiable (<{IDENTIFIABLE_WIDTH:g})", *TABLE_L1):
        table.add_column(col, justify="right")
    for li, lyr in enumerate(imap.layers):
        for hi, hd in enumerate(imap.heads):
            c = constrained_attention(tr, lyr, hd, rows=list(imap.rows), memory_budget=budget)
            table.add_row(*_head_row(imap, li, hi, c, records))
    console.print(whole_values(table))
    console.print(
        "width: upper − lower per key; movable mass: Σ (raw − lower), a bound on the mass any "
        "valid row can move; L1: mean ‖row − raw‖₁ (paper A_eff is not a distribution; the "
        "constrained row is). Means over rows and keys."
    )
    if out is not None:
        import pandas as pd

        from identifiable.store.files import table_bytes

        df = pd.DataFrame(records)
        write_atomic(out, table_bytes(df)[1], "--out", force=force)
        console.print(f"wrote {len(df)} rows to {out}")


TABLE_COLUMNS = ("layer", "head", "rows", "dim LN([T,1])", "max width", "mean width")
TABLE_L1 = ("movable mass", "L1 paper A_eff", "L1 constrained")


def _head_row(imap: Any, li: int, hi: int, c: Any, records: dict[str, list[Any]]) -> list[str]:
    """One head's cells of the summary table; its keys' bounds appended to `records`."""
    lyr, hd, keys = imap.layers[li], imap.heads[hi], imap.keys[li]
    for ri, q in enumerate(imap.rows):
        ks = keys[ri].nonzero().flatten().tolist()
        records["layer"] += [lyr] * len(ks)
        records["head"] += [hd] * len(ks)
        records["query"] += [q] * len(ks)
        records["key"] += ks
        records["raw"] += imap.raw[li, hi, ri, ks].tolist()
        records["lower"] += imap.lower[li, hi, ri, ks].tolist()
        records["upper"] += imap.upper[li, hi, ri, ks].tolist()
        records["constrained"] += c.weights[ri, ks].tolist()
    w = imap.width[li, hi][keys]
    return [
        str(lyr),
        str(hd),
        str(len(imap.rows)),
        _span(imap.null_dim[li, hi].double()),
        f"{float(w.max()):.4f}",
        f"{float(w.mean()):.4f}",
        f"{float((w < IDENTIFIABLE_WIDTH).double().mean()):.1%}",
        f"{float(imap.movable_mass[li, hi].mean()):.4f}",
        f"{float(c.l1_effective.mean()):.4f}",
        f"{float(c.l1_constrained.mean()):.4f}",
    ]


def _check_flags(
    out: Path | None, workers: int, threads: int | None, time_budget: float | None, force: bool
) -> None:
    """One line for a flag that cannot work, before the model loads."""
    if out is not None and out.suffix != ".parquet":
        raise IdentifiableError(f"--out '{out}' must end in .parquet")
    from identifiable.utils.checks import count, number

    # the rules interval_map applies to workers=, threads= and time_budget=
    count(workers, "workers", "--workers")
    if threads is not None:
        count(threads, "threads", "--threads")
    if time_budget is not None:
        number(time_budget, "time_budget", "--time-budget", low_open=True)
    check_writable(out, "--out", force=force)


def _span(values: Any) -> str:
    lo, hi = int(values.min()), int(values.max())
    return str(lo) if lo == hi else f"{lo}–{hi}"


def register(app: typer.Typer) -> None:
    app.command()(certify)
