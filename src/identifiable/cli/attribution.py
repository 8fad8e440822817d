"""`identifiable attribution TEXT`: Hidden Token Attribution of one text."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from identifiable.cli.common import check_seed, check_writable, console, load, write_json
from identifiable.cli.options import (
    ForceOption,
    JsonOption,
    ModelOption,
    PairOption,
    TimeBudgetOption,
)
from identifiable.errors import IdentifiableError

MemoryOption = Annotated[
    int,
    typer.Option("--memory-budget", help="MiB one chunk of JVPs may use; checked before starting."),
]


def attribution(
    text: Annotated[str, typer.Argument(help="The text to attribute.")],
    pair: PairOption = None,
    model: ModelOption = "minilm",
    probes: Annotated[
        int | None,
        typer.Option(
            "--probes",
            "-k",
            help="Estimate with K random probes per token (1..d) instead of exactly.",
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random probes.")] = 0,
    memory_budget: MemoryOption = 2048,
    time_budget: TimeBudgetOption = None,
    json_out: JsonOption = None,
    force: ForceOption = False,
) -> None:
    """Contribution of each input token to each hidden token (paper Figs. 3-4).

    Per layer: the median own-token contribution c_ii and each token's top contributor.
    """
    from identifiable.attribution import hidden_token_attribution
    from identifiable.attribution.stats import own_is_top

    check_seed(seed)
    if memory_budget < 1:
        raise IdentifiableError(f"--memory-budget must be at least 1 MiB, got {memory_budget}")
    check_writable(json_out, force=force)  # before the computation: a bad path costs nothing
    m = load(model)
    result = hidden_token_attribution(
        m,
        (text, pair) if pair is not None else text,
        probes,
        seed=seed,
        memory_budget=memory_budget * 1024**2,
        progress=True,
        time_budget=time_budget,
    )
    own, top = result.own_contribution(), result.top_contributor()
    is_top = own_is_top(result.contributions)
    mode = "exact" if probes is None else f"{probes} probes, seed {seed}"
    table = Table(
        title=f"{m.info.name}: {result.n_tokens} tokens, {mode}, {result.n_jvps} JVPs, "
        f"{result.seconds:.1f} s"
    )
    table.add_column("layer", justify="right")
    table.add_column("median own", justify="right")
    table.add_column("own not top", justify="right")
    table.add_column("top contributor of each token (token ← top input, share)")
    for layer in range(result.n_layers):
        pairs = []
        for i, tok in enumerate(result.tokens):
            j = int(top[layer, i])
            share = float(result.contributions[layer, i, j])
            pairs.append(tok if j == i else f"{tok}←{result.tokens[j]}")
            pairs[-1] += f" {100 * share:.0f}%"
        not_top = 1.0 - float(is_top[layer].float().mean())
        table.add_row(
            str(layer),
            f"{100 * float(own[layer].median()):.1f}%",
            f"{100 * not_top:.0f}%",
            "  ".join(pairs),
        )
    console.print(table)
    if probes is not None:
        console.print("estimated: shares carry a standard error (see --json 'stderr')")
    if json_out is not None:
        write_json(json_out, result.to_dict(), force=force)


def register(app: typer.Typer) -> None:
    app.command()(attribution)
