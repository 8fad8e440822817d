"""`identifiable compare`: two or more models side by side on the same texts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from identifiable.cli.common import check_model_name, check_seed, console, resumable
from identifiable.cli.options import NoProgressOption, ResumeOption, RunSeedOption


def compare(
    models: Annotated[
        list[str], typer.Argument(help="Two or more models: 'minilm', folders, hub ids.")
    ],
    corpus: Annotated[
        str, typer.Option("--corpus", "-c", help="'wikipedia-sample' or a text/JSONL/XML file.")
    ] = "wikipedia-sample",
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Output folder (rules of reproduce --out).")
    ] = Path("comparison"),
    budget: Annotated[str, typer.Option("--budget", "-b", help="quick, paper or smoke.")] = "quick",
    resume: ResumeOption = False,
    force: Annotated[bool, typer.Option("--force", help="Replace a previous run of ours.")] = False,
    seed: RunSeedOption = 0,
    no_progress: NoProgressOption = False,
) -> None:
    """Run the reproduction for each model on the same texts; write OUT/index.html side by side."""
    from identifiable.errors import IdentifiableError
    from identifiable.runs.compare import compare as run

    if len(models) < 2:
        raise IdentifiableError("compare takes two or more models, e.g. compare minilm ./finetuned")
    for m in models:
        check_model_name(m)
    check_seed(seed)
    with resumable():
        result = run(
            models,
            corpus,
            out,
            budget=budget,
            resume=resume,
            force=force,
            seed=seed,
            progress=not no_progress,
        )
    from identifiable.experiments.stages import resolve_budget

    differs = int(result.tables["verdicts"]["differs"].sum())
    lead = (
        "pipeline check, not evidence: smoke runs are not compared claim by claim"
        if resolve_budget(budget).pipeline_check
        else f"{differs} claims differ"
    )
    console.print(f"{lead} · {result.timings['total_s']:.0f} s · report: {out / 'index.html'}")


def register(app: typer.Typer) -> None:
    app.command()(compare)
