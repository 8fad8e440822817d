"""`identifiable finetune`: label-free fine-tuning that makes raw attention identifiable."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from identifiable.cli.common import check_model_name, check_seed, console, resumable
from identifiable.cli.options import ModelOption, ResumeOption
from identifiable.errors import IdentifiableError


def _weights(value: str) -> list[float]:
    from identifiable.training.loop import PENALTY_MAX, check_weight

    parts = [p.strip() for p in value.split(",")]
    if not value.strip() or any(not p for p in parts):
        raise IdentifiableError(
            f"--penalty takes weights between 0 and {PENALTY_MAX:g} such as 0.1 or "
            f"0,0.01,0.1,1; got {value!r}"
        )
    return [check_weight(p) for p in parts]


def finetune(
    model: ModelOption = "minilm",
    penalty: Annotated[
        str,
        typer.Option(
            "--penalty", "-p", help="Penalty weight w ≥ 0, or several (a sweep): 0,0.01,0.1,1."
        ),
    ] = "0.1",
    steps: Annotated[int, typer.Option("--steps", help="Optimizer steps per weight.")] = 100,
    out: Annotated[
        Path,
        typer.Option(
            "--out", "-o", help="Output folder: the checkpoint (one weight) or the sweep."
        ),
    ] = Path("finetuned"),
    corpus: Annotated[
        str, typer.Option("--corpus", "-c", help="'wikipedia-sample' or a MediaWiki/text file.")
    ] = "wikipedia-sample",
    batch_size: Annotated[int, typer.Option("--batch-size", help="Pairs per step.")] = 8,
    lr: Annotated[float, typer.Option("--lr", help="AdamW learning rate.")] = 5e-5,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Longest training pair.")] = 72,
    min_tokens: Annotated[
        int, typer.Option("--min-tokens", help="Shortest training pair (above the head width).")
    ] = 40,
    save_every: Annotated[
        int, typer.Option("--save-every", help="Steps between resume points.")
    ] = 25,
    variant: Annotated[
        str, typer.Option("--variant", help="paper or row-stochastic (the penalty's projection).")
    ] = "paper",
    no_evaluate: Annotated[
        bool, typer.Option("--no-evaluate", help="Train only: no held-out evaluation and report.")
    ] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the pairs and batches.")] = 0,
    resume: ResumeOption = False,
    force: Annotated[
        bool, typer.Option("--force", help="Replace a previous run of ours in --out.")
    ] = False,
    time_budget: Annotated[
        float | None, typer.Option("--time-budget", help="Seconds training may take (checked).")
    ] = None,
) -> None:
    """Fine-tune with the null-attention penalty (self-distillation, no labels); write a
    Hugging Face checkpoint and a held-out report (OUT/index.html)."""
    from identifiable.runs.finetune import finetune as run
    from identifiable.training.loop import TrainSettings

    check_model_name(model)
    check_seed(seed)
    weights = _weights(penalty)
    settings = TrainSettings(
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        save_every=save_every,
        variant=variant,
        seed=seed,
        warmup=min(10, steps // 10),
    )
    with resumable():
        result = run(
            model,
            weights,
            out,
            corpus=corpus,
            settings=settings,
            evaluate=not no_evaluate,
            resume=resume,
            force=force,
            time_budget=time_budget,
        )
    for w, path in result.checkpoints.items():
        console.print(f"checkpoint (penalty {w:g}): {path}")
    if not result.pareto.empty:
        console.print(f"report: {out / 'index.html'} · {result.timings['total_s']:.0f} s")


def register(app: typer.Typer) -> None:
    app.command()(finetune)
