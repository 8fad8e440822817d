"""`identifiable reproduce`: the whole paper, one folder, one self-contained page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from identifiable.cli.common import ModelOption, console


def reproduce(
    model: ModelOption = "minilm",
    corpus: Annotated[
        str,
        typer.Option(
            "--corpus", "-c", help="'wikipedia-sample' (embedded default) or a text/JSONL/XML file."
        ),
    ] = "wikipedia-sample",
    out: Annotated[
        Path,
        typer.Option("--out", "-o", help="Output folder (must be empty unless --resume/--force)."),
    ] = Path("reproduction"),
    budget: Annotated[
        str,
        typer.Option(
            "--budget",
            "-b",
            help="quick (≤ 5 min on 2 CPU cores), full (GPU or long run), smoke (seconds).",
        ),
    ] = "quick",
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue an interrupted run in --out.")
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Delete a previous run in --out and start over.")
    ] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed of every random choice.")] = 0,
    device: Annotated[
        str, typer.Option("--device", help="cpu, or cuda for --budget full on a GPU.")
    ] = "cpu",
    no_progress: Annotated[bool, typer.Option("--no-progress", help="No progress bars.")] = False,
) -> None:
    """Run the paper's four experiment families; write OUT/index.html, figures, tables, summary.json."""
    from identifiable.reproduction import reproduce as run

    result = run(
        model,
        corpus,
        out,
        budget=budget,
        resume=resume,
        force=force,
        seed=seed,
        progress=not no_progress,
    )
    s = result.summary
    console.print(
        f"{s['supported']} of {s['claims_tested']} tested claims supported · "
        f"{result.timings['total_s']:.0f} s · report: {out / 'index.html'}"
    )


def register(app: typer.Typer) -> None:
    app.command()(reproduce)
