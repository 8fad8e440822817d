"""`finetune`: fine-tune a model with the null-attention penalty, evaluate it, write the folder.

The top floor for `identifiable finetune`: `identifiable.training.loop` trains,
`identifiable.experiments.sweep` evaluates on held-out texts, `identifiable.report`
renders. One penalty weight writes a Hugging Face checkpoint into OUT itself; several
(a sweep) write OUT/penalty-W/ each, and OUT/index.html compares them with the original.
The folder follows `reproduce --out`'s rules (`identifiable.store.outdir`): a run works in
a sibling folder, resumes from its last saved state with `resume=True`, and replaces only
a run of ours with `force=True`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from identifiable.corpus import load_documents
from identifiable.errors import IdentifiableError, seconds
from identifiable.experiments import sweep
from identifiable.report.sweep_section import write_sweep_report
from identifiable.store.cache import CACHE_DIR, RunCache
from identifiable.store.files import atomic_write_text, write_table
from identifiable.store.outdir import OutputFolder
from identifiable.training import loop as ft
from identifiable.training.capture import check_supported
from identifiable.utils.checks import check_finite_weights, count, expect, number


@dataclass
class FinetuneResult:
    """The folder, each weight's checkpoint, the sweep table and the training log."""

    out_dir: Path
    checkpoints: dict[float, Path]
    pareto: pd.DataFrame
    log: pd.DataFrame
    timings: dict[str, float]


def load_attention_model(name: str) -> Any:
    """`load_model`, with one line for an architecture that has no attention to read (a state
    space model, for instance: transformers' config then lacks attention heads)."""
    from identifiable.models import load_model

    try:
        return load_model(name)
    except IdentifiableError:
        raise
    except (AttributeError, KeyError, TypeError, NotImplementedError) as exc:
        raise IdentifiableError(
            f"'{name}' has no attention maps identifiable can read ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); give a Transformer with "
            "softmax attention (BERT, GPT-2, Llama, …)"
        ) from None


def checkpoint_dir(out: Path, weights: Sequence[float], w: float) -> Path:
    return out if len(weights) == 1 else out / f"penalty-{w:g}"


def _weights(penalty: float | Sequence[float]) -> list[float]:
    """The penalty weights, checked: one, or several different ones."""
    if isinstance(penalty, str | bytes):
        raise IdentifiableError(
            f"penalty= takes a number or a list of numbers, got {type(penalty).__name__} "
            f"{penalty!r:.40}"
        )
    many = isinstance(penalty, Sequence)
    weights = [ft.check_weight(w) for w in (penalty if many else [penalty])]  # type: ignore[union-attr]
    if not weights or len(set(weights)) != len(weights):
        raise IdentifiableError(
            "give one penalty weight or several different ones",
            cli="--penalty takes one weight or several different ones",
        )
    return weights


def finetune(
    model: str = "minilm",
    penalty: float | Sequence[float] = 0.1,
    out: str | Path = "finetuned",
    *,
    corpus: str = "wikipedia-sample",
    settings: ft.TrainSettings | None = None,
    evaluate: bool = True,
    held_out_pairs: int = 32,
    held_out_sentences: int = 256,
    held_out_options: dict[str, Any] | None = None,
    resume: bool = False,
    force: bool = False,
    time_budget: float | None = None,
    log: Callable[[str], None] | None = None,
    on_step: Callable[[int], None] | None = None,
) -> FinetuneResult:
    """Fine-tune `model` for each penalty weight; see the module docstring.

    Args:
        model: a name for `load_model` ("minilm", a folder, a hub id), loaded once per weight.
        penalty: a weight ≥ 0, or several (a sweep: 0 is the fidelity-only control).
        settings: steps, batch size, learning rate, … (`TrainSettings`; default 100 steps).
        evaluate: measure the original and every fine-tuned model on held-out texts.
        held_out_pairs: how many held-out pairs the evaluation reads.
        held_out_sentences: how many held-out sentences it reads.
        held_out_options: the `experiments.sweep.HeldOut` budgets, e.g. token_max_tokens,
            probe_steps, hta_pairs.
        time_budget: seconds the training may take: refused before the first weight when
            one measured step says it needs more (the disk is checked too; see `preflight`).
    """
    t0 = time.perf_counter()
    weights = _weights(penalty)
    s = settings or ft.TrainSettings()
    ft.check_settings(s)
    held_out = (held_out_pairs, held_out_sentences, held_out_options)
    model, out, corpus = _check_arguments(model, out, corpus, time_budget, *held_out)
    folder = OutputFolder(out, resume=resume, force=force)
    folder.check()
    base = load_attention_model(model)
    check_finite_weights(base.hf_model, f"'{model}'")
    source = str(getattr(base.hf_model.config, "_name_or_path", "") or "")
    check_supported(base)  # one line now for a model the penalty cannot read
    documents = load_documents(corpus)
    train_docs, held_docs = ft.split_documents(documents, s.held_out_every)
    items = ft.training_pairs(base, train_docs, s)
    preflight(base, items, weights, s, folder, time_budget, log or _stderr)
    run_settings = {
        "model": model,
        "model_fingerprint": base.fingerprint,
        "corpus": corpus,
        "weights": weights,
        "train": ft.settings_dict(s),
        "evaluate": evaluate,
        "held_out": [held_out_pairs, held_out_sentences],
        "format": 1,
    }
    timings: dict[str, float] = {"load_s": time.perf_counter() - t0}
    with folder.run(lambda d: RunCache(d, run_settings).check_resumable()) as work:
        RunCache(work, run_settings).start()
        teacher = ft.Teacher(base)
        checkpoints, log_df = _train_all(
            model, teacher, items, weights, s, work, out, source, timings, log, on_step
        )
        pareto = pd.DataFrame()
        if evaluate:
            t_e = time.perf_counter()
            held = (held_docs, held_out_pairs, held_out_sentences)
            pareto = _evaluate(
                base, model, weights, work, *held, s.seed, log_df, len(items), log or _stderr
            )
            timings["evaluate_s"] = time.perf_counter() - t_e
        else:
            write_table(log_df, work / "tables" / "training_log")
        timings["total_s"] = time.perf_counter() - t0
        atomic_write_text(work / CACHE_DIR / "timings.json", json.dumps(timings, indent=2))
    return FinetuneResult(out, checkpoints, pareto, log_df, timings)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _check_arguments(
    model: Any,
    out: Any,
    corpus: Any,
    time_budget: Any,
    pairs: Any,
    sentences: Any,
    options: Any,
) -> tuple[str, Path, str]:
    """(model, out, corpus) of `finetune`, each checked; one line for the first bad one."""
    places = (str, os.PathLike)
    expect(model, places, "model", "a model name: 'minilm', a folder or a hub id")
    expect(out, places, "out", "a folder path")
    expect(corpus, places, "corpus", "'wikipedia-sample' or a text/MediaWiki file")
    if time_budget is not None:
        number(time_budget, "time_budget", "--time-budget", low_open=True)
    count(pairs, "held_out_pairs")
    count(sentences, "held_out_sentences")
    if options is not None:
        expect(options, dict, "held_out_options", "a dict of HeldOut budgets")
    return str(model), Path(out), str(corpus)


# Beside the weights a checkpoint holds its tokenizer and sentence-transformers files: an
# allowance (MiniLM's take 0.9 MB; Llama 3's tokenizer.json alone 9 MB).
_CHECKPOINT_EXTRA = 16 << 20


def preflight(
    base: Any,
    items: Sequence[Any],
    weights: Sequence[float],
    s: ft.TrainSettings,
    folder: OutputFolder,
    time_budget: float | None,
    log: Callable[[str], None],
) -> None:
    """Before the first weight: refuse a run the disk cannot hold (a checkpoint per weight
    still to train, and one resume point of weights and AdamW moments), or, with a
    `time_budget`, one that one measured training step says will take longer."""
    todo = [w for w in weights if not _finished(folder, weights, w)]
    if not todo:
        return
    params = sum(p.numel() * p.element_size() for p in base.hf_model.parameters())
    need = len(todo) * (params + _CHECKPOINT_EXTRA) + 3 * params
    where = _existing(folder.out.absolute())
    free = shutil.disk_usage(where).free
    what = f"{len(todo)} penalty weight{'s' if len(todo) > 1 else ''} × {s.steps} steps"
    if need > free:
        head = (
            f"{what} need about {_size(need)} on disk ({_size(params + _CHECKPOINT_EXTRA)} a "
            f"checkpoint, {_size(3 * params)} for resume points), more than the {_size(free)} "
            f"free at {where}: "
        )
        raise IdentifiableError(
            head + "choose fewer weights (penalty=) or another out=, or free space",
            cli=head + "choose fewer --penalty weights or another --out, or free space",
        )
    step = _seconds_per_step(base, items, s)
    # each step trains every weight and runs the teacher once (about a third of a step)
    train = step * s.steps * (len(todo) + 1 / 3)
    log(
        f"finetune: {what}: about {seconds(train)} of training ({step:.2g} s a step, measured "
        f"here) and {_size(need)} on disk ({_size(free)} free)"
    )
    if time_budget is not None and train > time_budget:
        head = f"{what} need about {seconds(train)} of training ({step:.2g} s a step here), over "
        raise IdentifiableError(
            head + f"time_budget={time_budget:g} s: choose fewer weights or steps (penalty=, "
            "settings.steps) or raise time_budget=",
            cli=head + f"--time-budget {time_budget:g}: choose fewer --penalty weights or "
            "--steps, or raise --time-budget",
        )


def _finished(folder: OutputFolder, weights: Sequence[float], w: float) -> bool:
    return folder.resume and ft.finished_log(checkpoint_dir(folder.partial, weights, w)) is not None


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _size(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def _seconds_per_step(base: Any, items: Sequence[Any], s: ft.TrainSettings) -> float:
    """Seconds of one training step's forward and backward pass on the first batch (the
    faster of two, so that the first call's one-time costs are not counted); the model's
    gradients are cleared after."""
    from identifiable.training import null_attention_penalty

    hf = base.hf_model
    inputs = ft.encode_batch(base, [items[i] for i in ft.batch_items(len(items), s, 0)])
    times = []
    try:
        for _ in range(2):
            t0 = time.perf_counter()
            r = null_attention_penalty(base, inputs, variant=s.variant, return_outputs=True)
            (r.penalty + r.outputs.last_hidden_state.float().square().mean()).backward()
            times.append(time.perf_counter() - t0)
    finally:
        hf.zero_grad(set_to_none=True)
    return min(times)


def _train_all(
    model: str,
    teacher: Any,
    items: Any,
    weights: Sequence[float],
    s: Any,
    work: Path,
    out: Path,
    source: str,
    timings: dict[str, float],
    log: Any,
    on_step: Any,
) -> tuple[dict[float, Path], pd.DataFrame]:
    """Train one student per penalty weight (a finished checkpoint in `work` is kept, so a
    resumed run trains only what is missing); (checkpoints in `out`, the training log)."""
    from identifiable.models import load_model

    checkpoints, logs = {}, []
    for w in weights:
        t_w = time.perf_counter()
        target = checkpoint_dir(work, weights, w)
        rows = ft.finished_log(target)
        if rows is None:
            student = load_model(model)
            state = work / CACHE_DIR / f"train-{w:g}"
            rows = ft.train_weight(student, teacher, items, w, s, state, log=log, on_step=on_step)
            ft.save_checkpoint(student, target, source, rows)
            _remove_state(state)
        checkpoints[w] = checkpoint_dir(out, weights, w)
        logs.append(pd.DataFrame(rows).assign(penalty=w))
        timings[f"train_{w:g}_s"] = time.perf_counter() - t_w
    return checkpoints, pd.concat(logs, ignore_index=True)


def _remove_state(state: Path) -> None:
    with contextlib.suppress(OSError):
        for p in state.iterdir():
            p.unlink()
        state.rmdir()


def _evaluate(
    base: Any,
    model: str,
    weights: list[float],
    work: Path,
    held_docs: list,
    pairs: int,
    sentences: int,
    seed: int,
    log_df: pd.DataFrame,
    n_train: int,
    log: Callable[[str], None],
) -> pd.DataFrame:
    from identifiable.models import Model, load_model

    # the evaluation can outlast the training: say what it does and how to skip it
    log(
        f"evaluating the original and {len(weights)} fine-tuned model(s) on {pairs} held-out "
        f"pairs and {sentences} sentences (null fraction, embeddings, token identifiability, "
        "HTA); skip with --no-evaluate (evaluate=False)"
    )
    held = sweep.held_out_texts(base, held_docs, pairs=pairs, sentences=sentences, seed=seed)
    cache = work / CACHE_DIR / "tokens"
    total, t0 = len(weights) + 1, time.perf_counter()
    results = {"original": sweep.evaluate_model(base, None, held, seed, cache / "original")}
    log(f"evaluated original (1/{total}, {time.perf_counter() - t0:.0f} s)")
    ref = results["original"]["embeddings"]
    labels: dict[str, float | None] = {"original": None}
    for k, w in enumerate(weights, 2):
        label = f"w={w:g}"
        m = load_model(str(checkpoint_dir(work, weights, w)))
        if not isinstance(m, Model):  # the penalty refused encoder–decoder models before
            raise IdentifiableError(f"checkpoint {label} is not a self-attention model")
        results[label] = sweep.evaluate_model(m, ref, held, seed, cache / label)
        labels[label] = w
        log(f"evaluated {label} ({k}/{total}, {time.perf_counter() - t0:.0f} s)")
    pareto, by_layer = sweep.pareto_table(results, labels)
    tokens = pd.concat([r["tokens"].assign(model=k) for k, r in results.items()], ignore_index=True)
    tables = {
        "pareto": pareto,
        "null_by_layer": by_layer,
        "tokens": tokens,
        "training_log": log_df,
        "null_rows": pd.concat(
            [r["null"].assign(model=k) for k, r in results.items()], ignore_index=True
        ),
    }
    write_sweep_report(work, tables, _meta(pareto, held, n_train, base))
    return pareto


def _meta(pareto: pd.DataFrame, held: sweep.HeldOut, n_train: int, base: Any) -> dict[str, Any]:
    base_row = pareto.iloc[0]
    best = pareto.iloc[1:]
    met = best[best["goal_met"]]
    if len(met):
        r = met.iloc[0]
        verdict = (
            f"Goal met at {r['model']}: median null fraction {r['null_median']:.3f} "
            f"(original {base_row['null_median']:.3f}, ratio {r['null_ratio_to_original']:.2f}) "
            f"with held-out embedding cosine {r['cosine_mean']:.4f}."
        )
    else:
        r = best.sort_values("null_median").iloc[0] if len(best) else base_row
        verdict = (
            f"Goal not met: no weight halves the median null fraction (original "
            f"{base_row['null_median']:.3f}) while keeping cosine ≥ {sweep.COSINE_GOAL}; "
            f"the lowest is {r['null_median']:.3f} at {r['model']} with cosine "
            f"{r['cosine_mean']:.4f}."
        )
    return {
        "null_goal": sweep.NULL_GOAL,
        "cosine_goal": sweep.COSINE_GOAL,
        "verdict": verdict,
        "summary": (
            f"Model {base.info.name} (d_v = {base.info.head_dim}); {n_train} training pairs; "
            f"held out: {len(held.pairs)} pairs of {base.info.head_dim + 1}-128 tokens and "
            f"{len(held.sentences)} sentences, from documents never trained on."
        ),
        "method": (
            "Self-distillation against the frozen original (pooled and token cosine) plus "
            "w · the mean null fraction of the batch (docs/training.md). Null fractions "
            "here come from identifiable.effective_attention on the held-out traces; "
            "Fig. 2 rates from the reproduction's tokens stage at the last layer (budget "
            f"of {held.token_max_tokens} tokens), HTA from its attribution stage "
            f"({held.hta_pairs} pairs, {held.hta_probes} random probes per token)."
        ),
    }
