"""Pieces shared by CLI commands: loading, checks, atomic JSON output, tables, Ctrl-C.

The flags several commands share are declared once in `cli/options.py`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console, ConsoleDimensions

from identifiable.errors import IdentifiableError
from identifiable.utils.seeds import SEED_MAX

FILE_WIDTH = 4096
"""The width of stdout when it is a file or a pipe: wide enough that no table is cropped."""


class _Output(Console):
    """stdout: a terminal's own width, but a file or pipe (`> out.txt`, `| less`) gets whole
    tables and unwrapped lines: rich would otherwise crop to 80 columns (or to the width
    of the terminal that stderr still shows) and cut headers to "ident…"."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size  # COLUMNS too: it describes a terminal, not a file
        if not self.is_terminal:
            return ConsoleDimensions(max(size.width, FILE_WIDTH), size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size


console = _Output()
err_console = Console(stderr=True)


def whole_values(table: Any) -> Any:
    """Give every column of a rich `Table` the width of its widest cell, so that a narrow
    console wraps the headers instead of cutting numbers ("0.15…" on 80 columns)."""
    for column in table.columns:
        cells = [str(c) for c in column.cells]
        if cells:
            column.min_width = max(len(c) for c in cells)
    return table


def index_list(text: str | None, flag: str) -> list[int] | None:
    """`--layers 1,2` / `--heads 0,3` (numbered from 0, as printed) as a list, or one line."""
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise IdentifiableError(
            f"{flag} takes comma-separated integers, e.g. 0,3; got '{text}'"
        ) from None


def check_seed(seed: int) -> None:
    """One line for a --seed the random generators cannot take."""
    if not 0 <= seed <= SEED_MAX:
        raise IdentifiableError(f"--seed must be between 0 and 2**63-1, got {seed}")


def load(model: str, *, device: str = "cpu", images: bool = False):
    """Load a model with a spinner; errors are already user-facing. A command that reads
    text (`images=False`) refuses an image model or one without a tokenizer here."""
    from identifiable.models import load_model

    check_model_name(model)
    with err_console.status(f"loading {model} …"):
        m = load_model(model, device=device)
    if not images:
        check_reads_text(m, model)
    return m


def check_reads_text(m: Any, model: str) -> None:
    """One line, naming what the CLI can do, for a model that cannot read text."""
    if getattr(m, "modality", "text") == "image":
        raise IdentifiableError(
            f"'{model}' is an image model ({m.spec.name}) and this command reads text: look at "
            "an image with identifiable view --image FILE --model MODEL"
        )
    if getattr(m, "tokenizer", None) is None:
        raise IdentifiableError(
            f"'{model}' has no tokenizer, so it cannot read text: copy the tokenizer files of "
            "the model it came from (tokenizer.json or vocab.txt, tokenizer_config.json) into "
            "its folder"
        )


def check_writable(path: Path | None, option: str = "--json", *, force: bool = False) -> None:
    """Fail before any work when an output file could not be written, or exists and
    `force` is not given: a file we did not write this run is never replaced unasked.
    Writability is probed with a temporary file in the folder (removed at once), since
    `os.access` says yes for root on read-only or virtual folders such as /proc."""
    from identifiable.store.places import probe

    if path is None:
        return
    if Path(path).is_dir():
        raise IdentifiableError(f"{option} {path} is a folder; give a file name")
    parent = Path(path).parent
    if not parent.is_dir():
        raise IdentifiableError(f"cannot write '{path}': directory '{parent}' does not exist")
    if Path(path).exists() and not force:
        raise IdentifiableError(
            f"{option} {path} already exists; choose another file, or pass --force to replace it"
        )
    try:
        probe(parent)
    except OSError as err:
        raise IdentifiableError(
            f"cannot write '{path}': {err.strerror or err}; choose another {option} file"
        ) from None


def write_atomic(path: Path, data: bytes, option: str = "--json", *, force: bool = False) -> None:
    """Write to a temporary file beside `path`, then rename: never a half-written file."""
    from identifiable.store.files import atomic_write_bytes

    check_writable(path, option, force=force)
    atomic_write_bytes(path, data, parents=False, hint=f"choose another {option} file")


def write_json(path: Path, payload: Any, *, force: bool = False) -> None:
    write_atomic(path, json.dumps(payload, indent=2, ensure_ascii=False).encode(), force=force)


class Interrupted(Exception):
    """Ctrl-C inside a command that wants to say more than "interrupted" (exit 130)."""


@contextmanager
def resumable() -> Iterator[None]:
    """Ctrl-C inside a run that writes a folder it can continue: say so (exit 130). A
    SIGTERM (`kill PID`) is taken as Ctrl-C, so that the file being written is removed,
    not left behind half-written, and the run says how to resume."""
    import signal
    import threading

    def terminated(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, terminated) if main else None
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted("interrupted; rerun with --resume") from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def check_ranges(tr: Any, layer: int | None, head: int | None, row: int | None) -> None:
    """Refuse a CLI --layer (0..L-1), --head (0..H-1) or --row (0..n-1) outside the trace,
    by the rule of the API's layers=, heads= and rows= (`identifiable.utils.checks`)."""
    from identifiable.utils.checks import indices

    for name, value, size in (
        ("layer", layer, tr.n_layers),
        ("head", head, tr.n_heads),
        ("row", row, tr.n_tokens),
    ):
        if value is not None:
            try:
                indices([value], size, f"{name}s", f"--{name}")
            except IdentifiableError as exc:
                raise IdentifiableError(exc.for_cli()) from None


def mib(memory_budget: int | None) -> int | None:
    """`--memory-budget` (MiB, checked ≥ 1) in bytes; None stays None (the memory free)."""
    if memory_budget is None:
        return None
    if memory_budget < 1:
        raise IdentifiableError(f"--memory-budget must be at least 1 MiB, got {memory_budget}")
    return memory_budget << 20


def check_model_name(model: str) -> None:
    """Refuse an empty --model before anything loads (it would name the current folder)."""
    if not model.strip():
        raise IdentifiableError(
            "--model is empty: pass 'minilm', a local model directory or a hub id"
        )
