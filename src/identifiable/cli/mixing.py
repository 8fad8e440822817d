"""`identifiable mixing TEXT --method M`: one context-mixing method on one text."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from identifiable.cli.common import check_writable, console, load, mib, write_json
from identifiable.cli.options import (
    ForceOption,
    JsonOption,
    MemoryBudgetOption,
    ModelOption,
    NoTruncateOption,
    PairOption,
)
from identifiable.errors import IdentifiableError

_TextArg = Annotated[str, typer.Argument(help="The text to analyse.")]

DEFAULT_METHOD = "rollout"

_MethodArg = Annotated[
    str | None,
    typer.Option(
        "--method",
        help="attention, rollout, flow, effective-rollout, norm, globenc, alti, "
        f"value-zeroing, grad-input, erasure or hta (see docs/mixing.md). Default: "
        f"{DEFAULT_METHOD}, named as such in the output.",
        show_default=False,
    ),
]

_FlowBudgetArg = Annotated[
    float | None,
    typer.Option("--flow-budget", help="flow: seconds it may take (default 60)."),
]

_WorkersArg = Annotated[
    int | None,
    typer.Option("--workers", help="flow: processes that share the max-flow problems."),
]

_ProbesArg = Annotated[
    int | None, typer.Option("--probes", "-k", help="hta: estimate with K probes per token.")
]

_SecondNormArg = Annotated[
    bool | None,
    typer.Option(
        "--second-norm/--first-norm-only",
        help="globenc: also decompose through the second layer norm (post-LN models).",
    ),
]


def mixing(
    text: _TextArg,
    method: _MethodArg = None,
    pair: PairOption = None,
    model: ModelOption = "minilm",
    flow_budget: _FlowBudgetArg = None,
    workers: _WorkersArg = None,
    probes: _ProbesArg = None,
    second_norm: _SecondNormArg = None,
    no_truncate: NoTruncateOption = False,
    json_out: JsonOption = None,
    force: ForceOption = False,
    memory_budget: MemoryBudgetOption = None,
) -> None:
    """Token-to-token mixing per layer by one method: each token's top source token.

    Rolled-out methods show the rollout (input token → token after layer l); the others
    show their layer maps. --json writes both maps in full.
    """
    from identifiable.mixing import context_mixing, get_method

    chosen = method is not None  # the default is said in the title, never silently taken
    method = method if method is not None else DEFAULT_METHOD
    spec = get_method(method)  # unknown method: one line listing the known ones, no loading
    given = {
        "budget_s": flow_budget,
        "workers": workers,
        "probes": probes,
        "second_norm": second_norm,
    }
    flags = {
        "budget_s": "--flow-budget",
        "workers": "--workers",
        "probes": "--probes",
        "second_norm": "--second-norm",
    }
    options: dict[str, Any] = {}
    for key, value in given.items():
        if value is None:
            continue
        if key not in spec.defaults:
            raise IdentifiableError(f"{flags[key]} does not apply to --method {method}")
        options[key] = value
    if flow_budget is not None and not flow_budget > 0:  # NaN too: it would refuse nothing
        raise IdentifiableError(
            f"--flow-budget {flow_budget:g} must be a positive number of seconds"
        )
    budget = mib(memory_budget)
    check_writable(json_out, force=force)
    m = load(model)
    from identifiable.utils.progress import status

    with status(f"context mixing ({method})"):
        result = context_mixing(
            m,
            (text, pair) if pair is not None else text,
            method,
            truncate=not no_truncate,
            progress=False,
            memory_budget=budget,
            **options,
        )
    shown = result.global_map
    kind = "rolled out" if result.rolled is not None else "per layer"
    table = Table(
        title=f"{m.info.name}: {method}{'' if chosen else ' (the default; choose with --method)'} "
        f"({kind}), {result.n_tokens} tokens, {result.seconds:.2f} s"
    )
    table.add_column("layer", justify="right")
    table.add_column("top source of each token (token ← source, share of its row)")
    for layer in range(result.n_layers):
        table.add_row(str(layer), "  ".join(_top_sources(shown[layer], result.tokens)))
    console.print(table)
    if json_out is not None:
        write_json(json_out, result.to_dict(), force=force)


def _top_sources(rows: Any, tokens: list[str]) -> list[str]:
    """Each token's top source in its row of one layer's map: "token←source 40%"."""
    cells = []
    for i, tok in enumerate(tokens):
        j = int(rows[i].argmax())
        total = float(rows[i].sum())
        share = float(rows[i][j]) / total if total > 0 else 0.0
        cells.append(f"{tok if j == i else f'{tok}←{tokens[j]}'} {100 * share:.0f}%")
    return cells


def register(app: typer.Typer) -> None:
    app.command()(mixing)
