"""`identifiable tokens`: token identifiability across layers (paper Fig. 2)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from identifiable.cli.common import (
    check_model_name,
    check_seed,
    console,
    err_console,
    index_list,
    load,
)
from identifiable.cli.options import ForceOption, MaxCorpusOption, MaxLineOption, ModelOption
from identifiable.errors import IdentifiableError

# A batch is padded to its longest sequence and the extraction reads 4 batches ahead, so a
# huge value would read the whole corpus and exhaust memory before the token cap applies.
MAX_BATCH = 1024
# The hidden states are allocated up front for the cap: 2**31 tokens are terabytes for any
# real model, and a cap beyond 2**63 is not even a size torch can take (a TypeError).
MAX_TOKENS = 2**31 - 1

_COLUMNS = [
    (p, o)
    for p, o in (
        ("naive", "l2"),
        ("naive", "cos"),
        ("linear", "l2"),
        ("linear", "cos"),
        ("mlp", "l2"),
        ("mlp", "cos"),
    )
]


# the files of identifiable.tokens.cache: token-pairs-<16 hex>.safetensors and .json
_TOKEN_CACHE_FILE = re.compile(r"^token-pairs-[0-9a-f]{16}\.(safetensors|json)$")


def _is_token_cache_file(name: str) -> bool:
    return bool(_TOKEN_CACHE_FILE.match(name))


_CorpusArg = Annotated[
    str,
    typer.Option("--corpus", "-c", help="Corpus name or file for identifiable.corpus.load_corpus."),
]

_MaxTokensArg = Annotated[
    int | None,
    typer.Option("--max-tokens", "-n", help="Token cap (whole sequences). Default 8192."),
]

_QuickArg = Annotated[
    bool,
    typer.Option(
        "--quick",
        help="Small token budget (2048) for a fast look: on 2 threads about 35 s on the "
        "embedded model and on a BERT-base-sized one (measured; the run prints its estimate "
        "first).",
    ),
]

_OutArg = Annotated[
    Path,
    typer.Option(
        "--out",
        "-o",
        help="Folder for the CSV and Parquet tables: new or empty, or a tokens run of "
        "ours with --force (written beside it and swapped in whole when done).",
    ),
]

_CandidatesArg = Annotated[
    str,
    typer.Option("--candidates", help="Look-up candidates: sequence, corpus or vocabulary."),
]

_LayersArg = Annotated[
    str | None,
    typer.Option(
        "--layers",
        help="Comma-separated layers 0..L-1 (numbered from 0; -1 = the embeddings e^0); "
        "default all.",
    ),
]

_SeedArg = Annotated[
    int, typer.Option("--seed", help="Seed of the split, shuffles and probe starts.")
]

_CacheDirArg = Annotated[
    Path | None,
    typer.Option(
        "--cache-dir",
        help="Cache extracted hidden states here (safetensors): a folder holding only "
        "identifiable's cache files.",
    ),
]

_BatchSizeArg = Annotated[
    int, typer.Option("--batch-size", help=f"Sequences per forward pass, 1..{MAX_BATCH}.")
]


def tokens(
    model: ModelOption = "minilm",
    corpus: _CorpusArg = "wikipedia-sample",
    max_tokens: _MaxTokensArg = None,
    quick: _QuickArg = False,
    out: _OutArg = Path("out/tokens"),
    candidates: _CandidatesArg = "sequence",
    layers: _LayersArg = None,
    seed: _SeedArg = 0,
    cache_dir: _CacheDirArg = None,
    batch_size: _BatchSizeArg = 8,
    max_corpus_mib: MaxCorpusOption = 256,
    max_line_kib: MaxLineOption = 1024,
    force: ForceOption = False,
) -> None:
    """Can each token still be recovered from its hidden state, layer by layer? (paper Fig. 2)

    Fits naive, linear and MLP probes (L2 and cosine) from layer l back to the input
    embeddings e^0 on training sequences, and reports how often the nearest e^0 of
    the same sequence is the token's own on test sequences, with 95 % intervals.
    """
    from identifiable.corpus import read_limits
    from identifiable.experiments.pipeline import summarised_truncations
    from identifiable.experiments.tokens import (
        DEFAULT_MAX_TOKENS,
        QUICK_MAX_TOKENS,
        token_identifiability,
    )
    from identifiable.store.cachedir import check_cache_dir
    from identifiable.store.outdir import OutputFolder

    if max_tokens is not None and quick:
        raise IdentifiableError("give either --max-tokens or --quick, not both")
    cap = (
        max_tokens if max_tokens is not None else QUICK_MAX_TOKENS if quick else DEFAULT_MAX_TOKENS
    )
    if not 1 <= cap <= MAX_TOKENS:
        raise IdentifiableError(f"--max-tokens must be between 1 and {MAX_TOKENS}, got {cap}")
    if not 1 <= batch_size <= MAX_BATCH:
        raise IdentifiableError(f"--batch-size must be between 1 and {MAX_BATCH}, got {batch_size}")
    check_seed(seed)
    # the folders first (read-only checks): reproduce's rules, before any work
    folder = OutputFolder(out, force=force, kind="tokens", resumable=False)
    folder.check()
    if cache_dir is not None:
        cache_dir = check_cache_dir(cache_dir, _is_token_cache_file, out=out)
    layer_list = index_list(layers, "--layers")
    check_model_name(model)
    m = load(model)
    _announce_cost(m, cap, layer_list)
    with (
        read_limits(max_bytes=max_corpus_mib << 20, max_line_bytes=max_line_kib << 10),
        summarised_truncations(),
    ):
        result = token_identifiability(
            m,
            corpus,
            max_tokens=cap,
            candidates=candidates,  # type: ignore[arg-type]
            layers=layer_list,
            seed=seed,
            cache_dir=cache_dir,
            batch_size=batch_size,
            progress=True,
        )
    with folder.run() as work:  # written beside --out, swapped in whole at the end
        paths = result.write(work)
    console.print(_table(result))
    s, t = result.settings, result.timings
    ctrl = result.control
    if len(ctrl):
        console.print(
            f"shuffled-target control: mean rate {ctrl['rate'].mean():.3f} vs chance {ctrl['chance'].mean():.3f}"
        )
    console.print(
        f"{s['n_tokens']} tokens in {s['n_sequences']} sequences ({s['test_tokens']} test tokens in "
        f"{s['test_sequences']} held-out sequences); extraction {t['extraction_s']:.1f} s, "
        f"probes + evaluation {t['probes_and_evaluation_s']:.1f} s"
    )
    err_console.print(f"wrote {len(paths)} files to {out}")


def _announce_cost(model, cap: int, layers: list[int] | None) -> None:
    """Refuse a cap whose hidden states do not fit in memory (naming the cap that does), then
    print the estimated time (`experiments.cost`), before any text is read."""
    import torch

    from identifiable.experiments.cost import check_memory, memory_bytes, tokens_estimate
    from identifiable.models.budget import available_memory
    from identifiable.tokens.evaluate import fit_workers

    n_layers = len(layers) if layers is not None else model.info.n_layers
    workers = fit_workers(None, torch.device("cpu"), n_layers)
    available = available_memory()
    fits = cap
    while fits > 1 and available is not None and memory_bytes(model, fits, workers) > available:
        fits //= 2
    check_memory(
        memory_bytes(model, cap, workers),
        available,
        f"--max-tokens {cap}",
        f"lower --max-tokens to {fits} or less",
    )
    estimate = tokens_estimate(model, cap, n_layers, torch.get_num_threads())
    err_console.print(
        estimate.sentence(f"tokens on {model.info.name}, {cap} tokens"), soft_wrap=True
    )  # one line in a log


def _table(result) -> Table:
    df = result.per_layer
    s = result.settings
    table = Table(
        title=f"token identifiability, {s['model']} ({s['candidates']} candidates): rate [95% CI]"
    )
    table.add_column("layer", justify="right")
    present = [(p, o) for p, o in _COLUMNS if ((df["probe"] == p) & (df["objective"] == o)).any()]
    for p, o in present:
        table.add_column(f"{p} {o}", justify="right")
    for layer, rows in df.groupby("layer", sort=True):
        cells = []
        for p, o in present:
            r = rows[(rows["probe"] == p) & (rows["objective"] == o)]
            cells.append(
                f"{r['rate'].iloc[0]:.3f} [{r['ci_low'].iloc[0]:.3f}, {r['ci_high'].iloc[0]:.3f}]"
                if len(r)
                else "–"
            )
        table.add_row(str(layer), *cells)
    return table


def register(app: typer.Typer) -> None:
    app.command()(tokens)
