"""Pieces shared by CLI commands: model option, atomic JSON output, tables."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from identifiable.errors import IdentifiableError

console = Console()
err_console = Console(stderr=True)

ModelOption = Annotated[
    str,
    typer.Option(
        "--model", "-m", help="'minilm' (embedded default), a local model directory or a hub id."
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


def load(model: str):
    """Load a model with a spinner; errors are already user-facing."""
    from identifiable.models import load_model

    check_model_name(model)
    with err_console.status(f"loading {model} …"):
        return load_model(model)


def check_writable(path: Path | None, option: str = "--json") -> None:
    """Fail before any work when an output file could not be written (nothing is created)."""
    if path is None:
        return
    if Path(path).is_dir():
        raise IdentifiableError(f"{option} {path} is a folder; give a file name")
    parent = Path(path).parent
    if not parent.is_dir():
        raise IdentifiableError(f"cannot write '{path}': directory '{parent}' does not exist")
    if not os.access(parent, os.W_OK):
        raise IdentifiableError(f"cannot write '{path}': directory '{parent}' is not writable")


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename: never a half-written file."""
    from identifiable.store.files import atomic_write_bytes

    check_writable(path)
    atomic_write_bytes(path, data, parents=False, hint="choose another --json file")


def write_json(path: Path, payload: Any) -> None:
    write_atomic(path, json.dumps(payload, indent=2, ensure_ascii=False).encode())


class Interrupted(Exception):
    """Ctrl-C inside a command that wants to say more than "interrupted" (exit 130)."""


def check_ranges(tr: Any, layer: int | None, head: int | None, row: int | None) -> None:
    """Refuse a CLI --layer (1..L), --head (0..H-1) or --row (0..n-1) outside the trace."""
    checks = (
        ("layer", layer, 1, tr.n_layers),
        ("head", head, 0, tr.n_heads - 1),
        ("row", row, 0, tr.n_tokens - 1),
    )
    for name, value, lo, hi in checks:
        if value is not None and not lo <= value <= hi:
            raise IdentifiableError(
                f"--{name} {value} is out of range: valid {name}s are {lo}..{hi}"
            )


def check_model_name(model: str) -> None:
    """Refuse an empty --model before anything loads (it would name the current folder)."""
    if not model.strip():
        raise IdentifiableError(
            "--model is empty: pass 'minilm', a local model directory or a hub id"
        )
