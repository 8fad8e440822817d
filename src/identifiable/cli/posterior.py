"""`identifiable posterior`: a posterior over the valid attention rows of one head
(docs/posterior.md), as a row table on the console and a per-key Parquet table."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from identifiable.cli.common import (
    check_ranges,
    check_writable,
    console,
    load,
    whole_values,
    write_atomic,
)
from identifiable.cli.options import ForceOption, ModelOption, NoTruncateOption, PairOption
from identifiable.errors import IdentifiableError

_TextArg = Annotated[str, typer.Argument(help="The text to analyse.")]
_LayerArg = Annotated[int, typer.Option("--layer", "-l", help="Layer, 0..L-1.")]
_HeadArg = Annotated[int, typer.Option("--head", help="Head, 0..H-1.")]
_RowArg = Annotated[int | None, typer.Option("--row", "-r", help="Only this query row, 0..n-1.")]
_PriorArg = Annotated[
    str, typer.Option("--prior", help="'uniform' (every valid row equally likely) or 'dirichlet'.")
]
_AlphaArg = Annotated[
    float, typer.Option("--alpha", help="Dirichlet concentration (> 0): pull towards the raw row.")
]
_SamplesArg = Annotated[int, typer.Option("--samples", help="Effective samples per row (≥ 1).")]
_ChainsArg = Annotated[int, typer.Option("--chains", help="Chains per row (≥ 1).")]
_WalkArg = Annotated[
    str,
    typer.Option(
        "--walk",
        help="'auto' (billiard on the CPU; elsewhere hit-and-run up to dim P 16, billiard above), "
        "'billiard', 'hitrun'.",
    ),
]
_SeedArg = Annotated[int, typer.Option("--seed", help="Seed of every random draw.")]
_TimeBudgetArg = Annotated[
    float | None,
    typer.Option("--time-budget", help="Seconds; refuse (with an estimate) runs that need more."),
]
_OutArg = Annotated[
    Path | None, typer.Option("--out", "-o", help="Write the per-key table here (Parquet).")
]


def posterior(
    text: _TextArg,
    layer: _LayerArg,
    head: _HeadArg,
    pair: PairOption = None,
    model: ModelOption = "minilm",
    row: _RowArg = None,
    prior: _PriorArg = "uniform",
    alpha: _AlphaArg = 1.0,
    samples: _SamplesArg = 1000,
    chains: _ChainsArg = 4,
    seed: _SeedArg = 0,
    walk: _WalkArg = "auto",
    time_budget: _TimeBudgetArg = None,
    out: _OutArg = None,
    force: ForceOption = False,
    no_truncate: NoTruncateOption = False,
) -> None:
    """Attention posterior: across all attention rows with the same head output, the mean
    row, 95 % credible bands, P(top key stays) and per-row ESS and split-R̂ (flagged rows
    are marked). The billiard walk or hit-and-run (--walk) on each row's polytope of valid
    rows."""
    from identifiable.attention.posterior import _check_request, attention_posterior

    _check_request(prior, alpha, samples, chains, 0.95, time_budget, walk)
    if out is not None and out.suffix != ".parquet":
        raise IdentifiableError(f"--out '{out}' must end in .parquet")
    check_writable(out, "--out", force=force)
    m = load(model)
    tr = m.trace((text, pair) if pair is not None else text, truncate=not no_truncate)
    check_ranges(tr, layer, head, row)
    post = attention_posterior(
        tr,
        layer,
        head,
        rows=None if row is None else [row],
        prior=prior,
        alpha=alpha,
        samples=samples,
        chains=chains,
        seed=seed,
        time_budget=time_budget,
        walk=walk,
        progress=True,
    )
    rows = post.rows_table()
    table = Table(
        title=f"{m.info.name}: layer {layer}, head {head}, prior {prior}, {walk}; "
        f"{samples} effective samples per row wanted ({post.seconds:.1f} s)"
    )
    for col in ("row", "token", "dim P", "ESS", "R̂", "top key", "P(top stays)", "flags"):
        table.add_column(col, justify="left" if col in ("token", "flags") else "right")
    for rec in rows.to_dict("records"):
        table.add_row(
            str(rec["row"]),
            str(rec["row_token"]),
            str(rec["dim"]),
            f"{rec['ess']:.0f}",
            f"{rec['rhat']:.4f}",
            str(rec["top_key"]),
            f"{rec['p_top_stays']:.3f}",
            rec["flags"] or "",
        )
    console.print(whole_values(table))
    flagged = int((post.flags & 3 != 0).sum())
    if flagged:
        console.print(f"{flagged} row(s) flagged: R̂ > 1.01 or ESS below --samples")
    if out is not None:
        from identifiable.store.files import table_bytes

        df = post.to_pandas()
        pairs = zip(df["row"], df["key"], strict=True)
        seen = [bool(post.keys[post.rows.index(r), k]) for r, k in pairs]
        df = df[seen].reset_index(drop=True)  # keys outside a row's key set are always 0
        write_atomic(out, table_bytes(df)[1], "--out", force=force)
        console.print(f"wrote {len(df)} rows to {out}")


def register(app: typer.Typer) -> None:
    app.command()(posterior)
