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
JsonOption = Annotated[
    Path | None, typer.Option("--json", help="Also write the results to this JSON file.")
]


def load(model: str):
    """Load a model with a spinner; errors are already user-facing."""
    from identifiable.models import load_model

    with err_console.status(f"loading {model} …"):
        return load_model(model)


def check_writable(path: Path | None) -> None:
    """Fail before any work when an output file could not be written."""
    if path is None:
        return
    parent = Path(path).parent
    if not parent.is_dir():
        raise IdentifiableError(f"cannot write '{path}': directory '{parent}' does not exist")
    if not os.access(parent, os.W_OK):
        raise IdentifiableError(f"cannot write '{path}': directory '{parent}' is not writable")


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename: never a half-written file."""
    from identifiable.store.files import atomic_write_bytes

    atomic_write_bytes(path, data)


def write_json(path: Path, payload: Any) -> None:
    write_atomic(path, json.dumps(payload, indent=2, ensure_ascii=False).encode())
