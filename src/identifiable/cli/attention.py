"""`identifiable attention`: null spaces, effective attention and certificates for one text."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from identifiable.cli.common import check_ranges, check_writable, console, load, mib, write_json
from identifiable.cli.options import (
    ForceOption,
    JsonOption,
    MemoryBudgetOption,
    ModelOption,
    NoTruncateOption,
    PairOption,
)
from identifiable.errors import IdentifiableError

NOT_A_DISTRIBUTION = (
    "effective attention is not a distribution: its entries can be negative and, in the "
    "paper variant, rows need not sum to 1"
)


def attention(
    text: Annotated[
        str | None,
        typer.Argument(help="The text to analyse (optional with --sink: the corpus sample)."),
    ] = None,
    pair: PairOption = None,
    model: ModelOption = "minilm",
    layer: Annotated[
        int | None, typer.Option("--layer", "-l", help="Layer, 0..L-1 as printed.")
    ] = None,
    head: Annotated[int | None, typer.Option("--head", help="Head, 0..H-1.")] = None,
    row: Annotated[
        int | None,
        typer.Option("--row", "-r", help="Query token position 0..n-1 (needs --layer/--head)."),
    ] = None,
    variant: Annotated[
        str,
        typer.Option(
            "--variant", help="'paper' (project off LN(T)) or 'row-stochastic' (off LN([T,1]))."
        ),
    ] = "paper",
    sink: Annotated[
        bool,
        typer.Option(
            "--sink",
            help="The attention on the first token per layer, raw vs effective; without TEXT "
            "on the first --tokens tokens of the packaged Wikipedia sample.",
        ),
    ] = False,
    tokens: Annotated[
        int,
        typer.Option("--tokens", help="With --sink and no TEXT: tokens of the Wikipedia sample."),
    ] = 512,
    no_truncate: NoTruncateOption = False,
    json_out: JsonOption = None,
    force: ForceOption = False,
    memory_budget: MemoryBudgetOption = None,
) -> None:
    """Null-space dimensions and raw vs effective attention per layer; with --layer, --head and
    --row, each key's raw and effective weight, its interval and a witness; with --sink, the
    attention on the first token per layer (e.g. --model smollm2 --sink)."""
    from identifiable.attention import VARIANTS

    if variant not in VARIANTS:
        raise IdentifiableError(f"unknown --variant {variant!r}: use one of {', '.join(VARIANTS)}")
    if sink:
        _sink(text, pair, model, variant, tokens, (layer, head, row), no_truncate, json_out, force)
        return
    if text is None:
        raise IdentifiableError(
            "give the TEXT to analyse (or --sink without TEXT: the first tokens of the packaged "
            "Wikipedia sample)"
        )
    if (layer is None) != (head is None):
        raise IdentifiableError("give --layer and --head together (or neither)")
    if row is not None and head is None:
        raise IdentifiableError("--row needs --layer and --head")
    budget = mib(memory_budget)
    check_writable(json_out, force=force)
    m = load(model)
    tr = m.trace((text, pair) if pair is not None else text, truncate=not no_truncate)
    check_ranges(tr, layer, head, row)
    payload = _overview(_shown(m.info), tr, variant, budget)
    if layer is not None and head is not None:
        payload["head"] = _head_view(tr, layer, head, row, variant, budget)
    if json_out is not None:
        write_json(json_out, payload, force=force)


def _shown(info: Any) -> str:
    """The model's name, and where its weights were dequantized from (a GGUF file)."""
    quantized = getattr(info, "dequantized_from", "")
    return f"{info.name} (weights dequantized from {quantized})" if quantized else info.name


def _sink(
    text: str | None,
    pair: str | None,
    model: str,
    variant: str,
    n: int,
    picks: tuple[int | None, ...],
    no_truncate: bool,
    json_out: Any,
    force: bool,
) -> None:
    """`--sink`: the table of `SinkMass.per_layer`, on TEXT or the Wikipedia sample."""
    from identifiable.attention import sink_mass
    from identifiable.experiments.sinks import corpus_prefix

    if any(p is not None for p in picks):
        raise IdentifiableError("--sink prints every layer: leave out --layer, --head and --row")
    if text is None and pair is not None:
        raise IdentifiableError("--pair needs a TEXT (without TEXT, --sink reads the corpus)")
    if text is not None and n != 512:
        raise IdentifiableError("--tokens applies without TEXT (the Wikipedia sample's length)")
    if n < 2:
        raise IdentifiableError(f"--tokens must be at least 2, got {n}")
    check_writable(json_out, force=force)
    m = load(model)
    source = (text, pair) if pair is not None else text
    where = f"{n} tokens of the Wikipedia sample" if text is None else "the text"
    tr = m.trace(corpus_prefix(m, n) if source is None else source, truncate=not no_truncate)
    sm = sink_mass(tr, variant)  # type: ignore[arg-type]
    table = Table(
        title=f"{_shown(m.info)}: attention on the first token {tr.tokens[0]!r}, {where} "
        f"(n = {tr.n_tokens}), mean over {tr.n_heads} heads, variant {variant}"
    )
    for col in ("layer", "raw", "effective", "null (raw − effective)", "raw, largest head"):
        table.add_column(col, justify="right")
    df = sm.per_layer()
    for r in df.itertuples():
        table.add_row(
            str(r.layer),
            f"{r.raw:.4f}",
            f"{r.effective:+.4f}",
            f"{r.null:+.4f}",
            f"{r.raw_max:.4f}",
        )
    console.print(table)
    console.print(f"note: {NOT_A_DISTRIBUTION}; null: the first token's mass that changes nothing")
    if json_out is not None:
        layers = [
            {
                **{k: (int(v) if k == "layer" else float(v)) for k, v in row.items()},
                "heads_raw": sm.raw[i].tolist(),
                "heads_effective": sm.effective[i].tolist(),
            }
            for i, row in enumerate(df.to_dict("records"))
        ]
        write_json(
            json_out,
            {
                "model": m.info.name,
                "dequantized_from": m.info.dequantized_from,
                "tokens": tr.tokens,
                "n_tokens": tr.n_tokens,
                "source": where,
                "variant": variant,
                "first_token": tr.tokens[0],
                "layers": layers,
                "note": NOT_A_DISTRIBUTION,
            },
            force=force,
        )


def _overview(name: str, tr: Any, variant: str, budget: int | None) -> dict:
    import torch

    from identifiable.attention import compute_head_factors, iter_effective_attention
    from identifiable.attention.stats import pearson_from_sums, pearson_sums

    factors = compute_head_factors(tr)
    title = f"{name}: {tr.n_tokens} tokens, {tr.n_heads} heads of width {tr.head_dim}, variant {variant}"
    table = Table(title=title)
    for col in ("layer", "rank(T)", "dim LN(T)", "dim LN([T,1])", "r(raw, effective)"):
        table.add_column(col, justify="right")
    layers, pooled = [], torch.zeros(6, dtype=torch.float64)
    streamed = iter_effective_attention(tr, variant, factors=factors, memory_budget=budget)  # type: ignore[arg-type]
    for le in streamed:
        # masked entries (causal, windowed) are exactly 0 in both maps: leave them out of r
        seen_keys = tr.keys_seen(le.layer)
        sums = pearson_sums(le.raw, le.effective, None if bool(seen_keys.all()) else seen_keys)
        pooled = pooled + sums
        r = pearson_from_sums(sums)
        rank, dim, dim_s = (x[:, -1].tolist() for x in (le.rank, le.dim, le.dim_stochastic))
        table.add_row(str(le.layer), _span(rank), _span(dim), _span(dim_s), f"{r:.4f}")
        layers.append(
            {
                "layer": le.layer,
                "rank": rank,
                "dim": dim,
                "dim_stochastic": dim_s,
                "pearson_r": r,
            }
        )
    r_all = pearson_from_sums(pooled)
    console.print(table)
    console.print(
        f"r over all layers and heads: {r_all:.4f}"
        + (
            " (causally masked entries excluded)"
            if tr.is_causal
            else " (masked entries excluded)"
            if tr.key_mask is not None and not bool(tr.key_mask.all())
            else ""
        )
        + ("" if not tr.is_causal else "; dims are those of the whole sequence (last row)")
    )
    if tr.n_tokens <= tr.head_dim:
        console.print(
            f"n = {tr.n_tokens} ≤ head width {tr.head_dim}: attention is identifiable here (A_eff = A)."
        )
    return {
        "model": name,
        "tokens": tr.tokens,
        "n_tokens": tr.n_tokens,
        "head_dim": tr.head_dim,
        "is_causal": tr.is_causal,
        "variant": variant,
        "layers": layers,
        "pearson_r": r_all,
        "note": NOT_A_DISTRIBUTION,
        "truncated": tr.truncated,
    }


WITNESS_FIELDS = ("exists", "reason", "key", "moved_mass", "total_variation", "output_residual")


def _head_view(
    tr: Any, layer: int, head: int, row: int | None, variant: str, budget: int | None
) -> dict:
    from identifiable.attention import (
        attention_intervals,
        iter_effective_attention,
        null_space,
        witness,
    )

    ns = null_space(tr, memory_budget=budget)
    out: dict[str, Any] = {"layer": layer, "head": head}
    if row is None:
        console.print(
            f"layer {layer}, head {head}: rank(T) = {int(ns.rank[layer, head, -1])}, "
            f"dim LN(T) = {int(ns.dim[layer, head, -1])}, dim LN([T,1]) = {int(ns.dim_stochastic[layer, head, -1])}. "
            "Add --row R for each key's weights, intervals and a witness."
        )
        return out
    layer_eff = next(iter_effective_attention(tr, variant, layers=[layer], memory_budget=budget))  # type: ignore[arg-type]
    eff = layer_eff.effective[head, row]
    iv = attention_intervals(tr, layer, head, row)
    w = witness(tr, layer, head, row)
    visible = tr.keys_seen(layer)[row].nonzero().flatten().tolist()  # causal, windowed: a subset
    table = Table(
        title=f"layer {layer}, head {head}, row {row} ({tr.tokens[row]!r}): {len(visible)} keys, dim LN([T,1]) = {iv.null_dim}"
    )
    columns = ("key", "token", "raw", "effective", "interval", "witness")
    for col, just in zip(
        columns, ("right", "left", "right", "right", "center", "right"), strict=True
    ):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    keys = []
    for j in visible:
        wj = float(w.weights[j]) if w.weights is not None else None
        lo, hi = float(iv.lower[j]), float(iv.upper[j])
        table.add_row(
            str(j),
            tr.tokens[j],
            f"{float(iv.raw[j]):.4f}",
            f"{float(eff[j]):+.4f}",
            f"[{lo:.4f}, {hi:.4f}]",
            "—" if wj is None else f"{wj:.4f}",
        )
        keys.append(
            {
                "index": j,
                "token": tr.tokens[j],
                "raw": float(iv.raw[j]),
                "effective": float(eff[j]),
                "lower": lo,
                "upper": hi,
                "witness": wj,
            }
        )
    console.print(table)
    console.print(
        f"note: {NOT_A_DISTRIBUTION}; intervals: min/max weight of any valid row with the same head output"
    )
    if w.exists:
        console.print(
            f"witness: moves {w.moved_mass:.4f} off key {w.key} ({tr.tokens[w.key]!r}), "  # type: ignore[index]
            f"{w.total_variation:.4f} mass in all; same head output to {w.output_residual:.1e} (relative)"
        )
    else:
        console.print(f"no witness: {w.reason} — this row's weights are identifiable")
    out.update(
        {
            "row": row,
            "null_dim": iv.null_dim,
            "keys": keys,
            "witness": {k: getattr(w, k) for k in WITNESS_FIELDS},
        }
    )
    return out


def _span(values: list[int]) -> str:
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}–{hi}"


def register(app: typer.Typer) -> None:
    app.command()(attention)
