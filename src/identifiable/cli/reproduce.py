"""`identifiable reproduce`: the whole paper, one folder, one self-contained page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from identifiable.cli.common import (
    check_model_name,
    check_seed,
    console,
    err_console,
    resumable,
)
from identifiable.cli.options import (
    MaxCorpusOption,
    MaxLineOption,
    ModelOption,
    NoProgressOption,
    RunSeedOption,
)


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
            help="quick (on 2 threads, measured: the embedded model about 2 min, a "
            "BERT-base-sized encoder about 5 min), paper (the paper's protocol; on 2 threads, "
            "measured: a BERT-base-sized encoder about 2 h), smoke (a pipeline check). Each "
            "run prints its own estimate first (docs/token_identifiability.md).",
        ),
    ] = "quick",
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue an interrupted run into --out.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Replace a previous run of ours in --out (only the files it wrote, and only "
            "once the new run has finished).",
        ),
    ] = False,
    seed: RunSeedOption = 0,
    device: Annotated[
        str,
        typer.Option("--device", help="cpu, cuda, cuda:N, mps or auto (cuda for --budget paper)."),
    ] = "cpu",
    max_corpus_mib: MaxCorpusOption = 256,
    max_line_kib: MaxLineOption = 1024,
    no_progress: NoProgressOption = False,
) -> None:
    """Run the paper's four experiment families; write OUT/index.html, figures, tables, summary.json."""
    from identifiable.corpus import read_limits
    from identifiable.runs.reproduce import reproduce as run

    check_model_name(model)
    check_seed(seed)  # numpy's generators and torch's take 0 .. 2**63-1
    limits = read_limits(max_bytes=max_corpus_mib << 20, max_line_bytes=max_line_kib << 10)
    with resumable(), limits:
        result = run(
            model,
            corpus,
            out,
            budget=budget,
            resume=resume,
            force=force,
            seed=seed,
            device=device,
            progress=not no_progress,
            announce=err_console.print,
        )
    from identifiable.experiments.distributed import is_main_process

    if not is_main_process():  # under torchrun every rank returns the summary; one prints it
        return
    s = result.summary
    console.print(
        f"{s['headline']} · {result.timings['total_s']:.0f} s · report: {out / 'index.html'}"
    )


def register(app: typer.Typer) -> None:
    app.command()(reproduce)
