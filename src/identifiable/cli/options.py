"""The flags several commands share, declared once: each alias is the flag's type, names
and help text, which typer reads from the annotation (`model: ModelOption = "minilm"`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ModelOption = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="'minilm' (embedded default), 'smollm2' (embedded decoder, needs the decoder "
        "extra), a local model directory, a .gguf file (or a folder holding one) or a hub id.",
    ),
]
PairOption = Annotated[
    str | None,
    typer.Option("--pair", help="Second text of a pair, encoded as [CLS] TEXT [SEP] PAIR [SEP]."),
]
NoTruncateOption = Annotated[
    bool, typer.Option("--no-truncate", help="Fail instead of truncating texts that are too long.")
]
MaxCorpusOption = Annotated[
    int,
    typer.Option(
        "--max-corpus-mib",
        min=1,
        help="Refuse a corpus file that decompresses to more than this many MiB.",
    ),
]
MaxLineOption = Annotated[
    int,
    typer.Option("--max-line-kib", min=1, help="Refuse a corpus line longer than this many KiB."),
]
JsonOption = Annotated[
    Path | None, typer.Option("--json", help="Also write the results to this JSON file.")
]
ForceOption = Annotated[
    bool, typer.Option("--force", help="Replace output files that already exist.")
]
NoProgressOption = Annotated[bool, typer.Option("--no-progress", help="No progress bars.")]
ResumeOption = Annotated[bool, typer.Option("--resume", help="Continue an interrupted run.")]
RunSeedOption = Annotated[int, typer.Option("--seed", help="Seed of every random choice.")]
DeviceOption = Annotated[
    str, typer.Option("--device", help="cpu, cuda, cuda:N, mps or auto (first available).")
]
MemoryBudgetOption = Annotated[
    int | None,
    typer.Option(
        "--memory-budget",
        help="MiB the command may use (default: the memory available); checked before any "
        "work from the formulas in docs/families.md, 'Memory and streaming'.",
    ),
]
TimeBudgetOption = Annotated[
    float | None,
    typer.Option("--time-budget", help="Seconds; refuse (with an estimate) work that needs more."),
]
