"""`identifiable view`: one text, one offline interactive attention page."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from identifiable.cli.common import (
    ModelOption,
    PairOption,
    check_model_name,
    check_writable,
    console,
    err_console,
    load,
)
from identifiable.errors import IdentifiableError


def _rows(value: str | None) -> list[int] | None:
    if not value:
        return None
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise IdentifiableError(
            f"--rows must be comma-separated token indices such as 0,5,9; got '{value}'"
        ) from None


def view(
    text: Annotated[str, typer.Argument(help="The text to look at.")],
    pair: PairOption = None,
    model: ModelOption = "minilm",
    out: Annotated[Path, typer.Option("--out", "-o", help="The HTML file to write.")] = Path(
        "attention.html"
    ),
    layer: Annotated[
        int, typer.Option("--layer", "-l", help="Layer shown first, 1..L as printed.")
    ] = 1,
    head: Annotated[int, typer.Option("--head", help="Head shown first (0-based).")] = 0,
    rows: Annotated[
        str | None,
        typer.Option(
            "--rows",
            help="Query rows to certify first (a witness each), e.g. 0,5,9; the first is "
            "shown on opening.",
        ),
    ] = None,
    max_rows: Annotated[
        int, typer.Option("--max-rows", help="At most this many rows get a witness (an LP each).")
    ] = 16,
    interval_seconds: Annotated[
        float,
        typer.Option(
            "--interval-seconds",
            help="Time budget for the chosen head's interval bands and constrained attention; "
            "rows left when it runs out are skipped, keeping those done spread over the text.",
        ),
    ] = 30.0,
    certify: Annotated[
        bool,
        typer.Option(
            "--certify/--no-certify",
            help="Certify the chosen head: interval bands of every row (within "
            "--interval-seconds), identifiable weights and constrained attention.",
        ),
    ] = True,
    identifiable_below: Annotated[
        float,
        typer.Option(
            "--identifiable-below",
            help="Mark a weight identifiable when its interval is narrower than this.",
        ),
    ] = 0.01,
    variant: Annotated[
        str, typer.Option("--variant", help="Effective attention: paper or row-stochastic.")
    ] = "paper",
    max_mb: Annotated[float, typer.Option("--max-mb", help="Page size limit in MB.")] = 9.0,
    mixing: Annotated[
        str | None,
        typer.Option(
            "--mixing",
            help="Context-mixing methods to offer in place of the attention maps, e.g. "
            "globenc,alti (see identifiable mixing).",
        ),
    ] = None,
) -> None:
    """Write a self-contained page: raw, effective and null attention per head; for the
    chosen head, interval bands of every row, identifiable weights and constrained attention."""
    from identifiable.mixing import get_method
    from identifiable.store.files import atomic_write_text
    from identifiable.viewer import mixing_maps, viewer_html_for_trace

    if not text.strip():
        raise IdentifiableError(
            'the text is empty: give the sentence to view, e.g. identifiable view "The cat sat."'
        )
    if out.exists() and out.is_dir():
        raise IdentifiableError(f"--out {out} is a folder; give a file name such as attention.html")
    check_writable(out, "--out")
    if max_rows < 1:
        raise IdentifiableError(f"--max-rows must be at least 1, got {max_rows}")
    if not math.isfinite(max_mb) or max_mb < 1:
        raise IdentifiableError(f"--max-mb must be a number of at least 1 (MB), got {max_mb}")
    if not math.isfinite(interval_seconds) or interval_seconds < 0:
        raise IdentifiableError(
            f"--interval-seconds must be a number of seconds ≥ 0, got {interval_seconds}"
        )
    if head < 0:
        raise IdentifiableError(f"--head must be 0 or more, got {head}")
    if not (math.isfinite(identifiable_below) and 0 < identifiable_below < 1):
        raise IdentifiableError(
            "--identifiable-below must be an interval width between 0 and 1 (exclusive), "
            f"such as 0.01; got {identifiable_below}"
        )
    methods = [v.strip() for v in (mixing or "").split(",") if v.strip()]
    for name in methods:  # an unknown method fails before the model loads
        get_method(name)
    check_model_name(model)
    m = load(model)
    trace = m.trace((text, pair) if pair is not None else text)
    if not 1 <= layer <= trace.n_layers:
        # The CLI numbers layers 1..L everywhere, as `identifiable trace` prints them.
        raise IdentifiableError(
            f"layer {layer} is out of range: valid layers are 1..{trace.n_layers}"
        )
    with err_console.status(
        "computing effective attention" + (" and interval bands …" if certify else " …")
    ):
        maps = mixing_maps(m, (text, pair) if pair is not None else text, methods)
        html = viewer_html_for_trace(
            trace,
            layer=layer - 1,
            head=head,
            rows=_rows(rows),
            max_rows=max_rows,
            variant=variant,
            max_bytes=int(max_mb * 1e6),
            interval_seconds=interval_seconds,
            mixing=maps,
            certify=certify,
            identifiable_below=identifiable_below,
        )
    atomic_write_text(out, html)
    console.print(f"wrote {out} ({len(html.encode()) / 1e6:.2f} MB, {trace.n_tokens} tokens)")


def register(app: typer.Typer) -> None:
    app.command()(view)
