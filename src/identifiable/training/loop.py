"""Label-free fine-tuning with the null-attention penalty (docs/training.md).

Self-distillation: the fine-tuned model (the student, started from the original) is
kept close to a frozen copy of the original (the teacher) on Wikipedia pairs, while
the penalty pushes its attention rows into col(T):

    loss = (1 − cos(pool_s, pool_t)) + mean over tokens (1 − cos(h_s, h_t)) + w · penalty

pool: the mean of the last hidden states over real tokens (the sentence embedding of
all-MiniLM-L6-v2). Dropout stays off, so a step is a deterministic function of the
weights, the optimizer state and the step number: the batches are drawn from a
permutation seeded by (seed, epoch), and a run resumed from its last saved state
reaches bit for bit the weights of an uninterrupted one (same machine and threads).

Documents, not sentences, are split into training and held-out sets
(`split_documents`), so no held-out text shares a document with a training pair.
"""

from __future__ import annotations

import copy
import io
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from identifiable.errors import IdentifiableError
from identifiable.store.files import atomic_write_bytes, atomic_write_text, remove_temporaries
from identifiable.training.capture import as_model
from identifiable.training.penalty import VARIANTS, null_attention_penalty
from identifiable.utils.checks import check_finite_weights, count, expect, number
from identifiable.utils.seeds import SEED_MAX

# Files beside the weights that make a sentence-transformers model of a checkpoint.
_SENTENCE_FILES = (
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
)
STATE = "state.pt"
DONE = "done.json"


@dataclass(frozen=True)
class TrainSettings:
    """What one fine-tuning run depends on (every field is part of the resume key).

    Attributes:
        steps: optimizer steps. batch_size: pairs per step. lr: AdamW learning rate,
            reached after `warmup` steps (linear), then decayed linearly to 0.
        max_tokens, min_tokens: token range of the training pairs (min above d_v, so
            that rows can have null attention at all).
        held_out_every: every k-th document is held out (never trained on).
        save_every: steps between saved states (resume points).
        variant: the penalty's variant. seed: batches and pairs.
    """

    steps: int = 100
    batch_size: int = 8
    lr: float = 5e-5
    warmup: int = 10
    max_tokens: int = 72
    min_tokens: int = 40
    held_out_every: int = 5
    save_every: int = 25
    variant: str = "paper"
    seed: int = 0


PENALTY_MAX = 1000.0
"""The largest penalty weight. The penalty is at most 1 and the fidelity loss at most 4, so
from here on fidelity is under 0.4 % of the loss and the student no longer follows the
teacher; far larger weights (1e308) overflow the loss to inf and the weights to NaN."""

# TrainSettings fields → the `identifiable finetune` flags that set them (None: no flag)
_FLAGS = {
    "steps": "--steps",
    "batch_size": "--batch-size",
    "lr": "--lr",
    "warmup": None,
    "max_tokens": "--max-tokens",
    "min_tokens": "--min-tokens",
    "held_out_every": None,
    "save_every": "--save-every",
    "variant": "--variant",
    "seed": "--seed",
}


def check_weight(weight: Any, name: str = "penalty", flag: str | None = "--penalty") -> float:
    """A penalty weight: a finite number in 0..PENALTY_MAX (one line otherwise, naming
    `penalty=` to Python callers and `--penalty` to the CLI, which passes its text)."""
    if isinstance(weight, str):
        try:
            value: Any = float(weight)
        except ValueError:
            raise IdentifiableError(
                f"{name}= takes numbers, got {weight!r}",
                cli=f"{flag} takes weights such as 0.1 or 0,0.01,0.1,1; got {weight!r}",
            ) from None
    else:
        value = weight
    return number(value, name, flag, high=PENALTY_MAX)


def check_settings(s: TrainSettings) -> None:
    """One line for settings no run can use, naming the field (`save_every=`) to Python
    callers and the flag (`--save-every`) to the CLI."""
    expect(s, TrainSettings, "settings", "a TrainSettings")
    for name in ("steps", "batch_size", "max_tokens", "min_tokens", "save_every"):
        count(getattr(s, name), name, _FLAGS[name])
    count(s.held_out_every, "held_out_every", minimum=2)  # every k-th document is held out
    count(s.warmup, "warmup", minimum=0)
    count(s.seed, "seed", "--seed", minimum=0, maximum=SEED_MAX)
    number(s.lr, "lr", "--lr", high=1.0, low_open=True)
    if s.min_tokens > s.max_tokens:
        raise IdentifiableError(
            f"min_tokens={s.min_tokens} exceeds max_tokens={s.max_tokens}",
            cli=f"--min-tokens {s.min_tokens} exceeds --max-tokens {s.max_tokens}: lower "
            "--min-tokens or raise --max-tokens",
        )
    if s.variant not in VARIANTS:
        raise IdentifiableError(
            f"variant= must be one of {', '.join(VARIANTS)}, got {s.variant!r}",
            cli=f"--variant must be one of {', '.join(VARIANTS)}, got {s.variant!r}",
        )


def split_documents(documents: Sequence[Any], every: int) -> tuple[list[Any], list[Any]]:
    """(training, held-out) documents: every `every`-th document (from the first) is held out."""
    held = [d for i, d in enumerate(documents) if i % every == 0]
    train = [d for i, d in enumerate(documents) if i % every != 0]
    if not train or not held:
        raise IdentifiableError(
            f"the corpus has {len(documents)} documents; splitting every {every}th off leaves "
            "no training or no held-out document: give a larger corpus"
        )
    return train, held


def training_pairs(model: Any, documents: Sequence[Any], s: TrainSettings) -> list[tuple[str, str]]:
    """Pairs [CLS] a [SEP] b [SEP] of the training documents, min_tokens..max_tokens long."""
    from identifiable.corpus import make_pairs

    pairs = make_pairs(
        documents, model.tokenizer, max_tokens=s.max_tokens, min_tokens=s.min_tokens, seed=s.seed
    )
    if len(pairs) < s.batch_size:
        found = f"only {len(pairs)} training pairs of {s.min_tokens}-{s.max_tokens} tokens"
        raise IdentifiableError(
            f"{found}, fewer than batch_size={s.batch_size}: lower min_tokens= or batch_size=, "
            "or give a larger corpus",
            cli=f"{found}, fewer than --batch-size {s.batch_size}: lower --min-tokens or "
            "--batch-size, or give a larger --corpus",
        )
    return pairs


# ---- batches and targets ------------------------------------------------------------


def batch_items(n_items: int, s: TrainSettings, step: int) -> list[int]:
    """Indices of step `step`'s pairs: consecutive slices of a permutation per epoch."""
    per_epoch = n_items // s.batch_size
    epoch, k = divmod(step, per_epoch)
    order = np.random.default_rng([s.seed, epoch]).permutation(n_items)
    return order[k * s.batch_size : (k + 1) * s.batch_size].tolist()


def encode_batch(model: Any, items: Sequence[Any]) -> dict[str, Tensor]:
    """A padded batch of texts or pairs in the model's own format, on its device."""
    tok = model.tokenizer
    if tok is None:
        raise IdentifiableError("fine-tuning on texts needs the model's tokenizer")
    if tok.pad_token is None:  # decoders: pad with the end-of-text token (masked anyway)
        tok.pad_token = tok.eos_token
    pairs = bool(items) and isinstance(items[0], tuple)
    args = ([a for a, _ in items], [b for _, b in items]) if pairs else (list(items),)
    enc = tok(
        *args,
        padding=True,
        truncation=True,
        max_length=model.info.max_positions,
        return_tensors="pt",
    )
    keep = set(_forward_names(model.hf_model))
    return {k: v.to(model.device) for k, v in enc.items() if k in keep}


def _forward_names(module: nn.Module) -> list[str]:
    import inspect

    return list(inspect.signature(module.forward).parameters)


def mean_pool(hidden: Tensor, mask: Tensor) -> Tensor:
    """`[B, d]` mean of `[B, N, d]` over the real tokens of `mask` `[B, N]`."""
    w = mask[..., None].to(hidden.dtype)
    return (hidden * w).sum(1) / w.sum(1).clamp_min(1)


def fidelity_loss(hidden: Tensor, target: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(1 − cos of pooled embeddings, mean over real tokens of 1 − cos of hidden states)."""
    cos = nn.functional.cosine_similarity
    pooled = (1 - cos(mean_pool(hidden, mask), mean_pool(target, mask), dim=-1)).mean()
    m = mask.to(hidden.dtype)
    tokens = ((1 - cos(hidden, target, dim=-1)) * m).sum() / m.sum()
    return pooled, tokens


class Teacher:
    """The frozen original: last hidden states of each step's batch, computed once per step
    and shared by every penalty weight of a sweep."""

    def __init__(self, model: Any) -> None:
        self.hf = copy.deepcopy(model.hf_model).eval().requires_grad_(False)
        self._cache: dict[int, Tensor] = {}

    def targets(self, step: int, inputs: dict[str, Tensor]) -> Tensor:
        if step not in self._cache:
            with torch.no_grad():
                self._cache[step] = self.hf(**inputs).last_hidden_state
        return self._cache[step]


# ---- the loop -------------------------------------------------------------------------


def _learning_rate(s: TrainSettings, step: int) -> float:
    if s.warmup and step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    span = max(1, s.steps - s.warmup)
    return s.lr * max(0.0, 1.0 - (step - s.warmup) / span)


def train_step(
    model: Any,
    opt: torch.optim.Optimizer,
    inputs: dict[str, Tensor],
    target: Tensor,
    weight: float,
    s: TrainSettings,
    step: int,
) -> dict[str, float]:
    """One optimizer step; returns the step's loss terms (before the update)."""
    for group in opt.param_groups:
        group["lr"] = _learning_rate(s, step)
    r = null_attention_penalty(model, inputs, variant=s.variant, return_outputs=True)
    pooled, tokens = fidelity_loss(r.outputs.last_hidden_state, target, inputs["attention_mask"])
    loss = pooled + tokens + weight * r.penalty
    _stop_unless_finite(loss, "loss", weight, step)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    params = [p for group in opt.param_groups for p in group["params"] if p.grad is not None]
    # the update of a non-finite gradient would make every weight NaN: stop before it
    _stop_unless_finite(nn.utils.get_total_norm([p.grad for p in params]), "gradient", weight, step)
    opt.step()
    return {
        "step": step + 1,
        "loss": float(loss.detach()),
        "fidelity": float((pooled + tokens).detach()),
        "pooled_loss": float(pooled.detach()),
        "token_loss": float(tokens.detach()),
        "null_fraction": float(r.penalty.detach()),
        "lr": opt.param_groups[0]["lr"],
    }


def _stop_unless_finite(value: Tensor, what: str, weight: float, step: int) -> None:
    """One line, before anything is saved, when a step's loss or gradient is NaN or inf."""
    value = value.detach()
    if not bool(torch.isfinite(value)):
        head = (
            f"finetune w={weight:g}: the {what} is {float(value):g} at step {step + 1}, so the "
            "weights would not be finite; no checkpoint was written: lower "
        )
        raise IdentifiableError(
            head + "the penalty weight or the learning rate (penalty=, lr=)",
            cli=head + "--penalty or --lr",
        )


_NOT_SAVED = "nothing was saved: lower the penalty weight or the learning rate"


def train_weight(
    model: Any,
    teacher: Teacher,
    items: Sequence[Any],
    weight: float,
    s: TrainSettings,
    folder: Path,
    *,
    log: Callable[[str], None] | None = None,
    on_step: Callable[[int], None] | None = None,
) -> list[dict[str, float]]:
    """Fine-tune `model` (in place) with penalty weight `weight`; resumable from `folder`.

    `folder/state.pt` (weights, optimizer, log) is written every `save_every` steps and
    removed once `folder/done.json` (the log) is written. A folder with done.json is
    loaded, not trained again. Returns one row per step (the convergence record).
    """
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    m = as_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    hf = m.hf_model
    # eps 1e-6: Adam would turn the ~1e-10 gradients of a loss at its minimum (the start of
    # self-distillation) into full-size steps; real gradients (≥ 1e-5) are unaffected
    opt = torch.optim.AdamW(hf.parameters(), lr=s.lr, weight_decay=0.0, eps=1e-6)
    rows: list[dict[str, float]] = []
    start = 0
    remove_temporaries(folder)  # half-written states of a killed run: never kept or read
    if (folder / STATE).is_file():
        state = torch.load(folder / STATE, map_location=m.device, weights_only=True)
        hf.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        rows, start = list(state["log"]), int(state["step"])
        log(f"finetune w={weight:g}: resumed at step {start}/{s.steps}")
    hf.eval()  # dropout off: deterministic steps (see the module docstring)
    t0, every = time.monotonic(), max(1, s.steps // 20)
    for step in range(start, s.steps):
        inputs = encode_batch(m, [items[i] for i in batch_items(len(items), s, step)])
        rows.append(train_step(m, opt, inputs, teacher.targets(step, inputs), weight, s, step))
        done = step + 1
        if done % s.save_every == 0 and done < s.steps:
            _save_state(folder, hf, opt, rows, done)
        if done % every == 0 or done == s.steps:
            rate = (time.monotonic() - t0) / (done - start)
            r = rows[-1]
            log(
                f"finetune w={weight:g}: step {done}/{s.steps} ({100 * done / s.steps:.0f}%) "
                f"loss {r['loss']:.5f} fidelity {r['fidelity']:.5f} null {r['null_fraction']:.4f} "
                f"lr {r['lr']:.1e} · {rate:.2f} s/step, eta {rate * (s.steps - done):.0f} s"
            )
        if on_step is not None:
            on_step(done)
    return rows


def _save_state(folder: Path, hf: nn.Module, opt: Any, rows: list, step: int) -> None:
    check_finite_weights(hf, f"the model at step {step}", _NOT_SAVED)
    buf = io.BytesIO()
    torch.save(
        {"model": hf.state_dict(), "optimizer": opt.state_dict(), "log": rows, "step": step}, buf
    )
    atomic_write_bytes(folder / STATE, buf.getvalue())


def save_checkpoint(model: Any, folder: Path, source: str | None, rows: list[dict]) -> None:
    """A Hugging Face checkpoint in `folder` (safetensors, tokenizer, sentence-transformers
    files of `source` where it has them), then done.json (the log) last."""
    m = as_model(model)
    check_finite_weights(m.hf_model, "the fine-tuned model", _NOT_SAVED)
    m.hf_model.save_pretrained(folder, safe_serialization=True)
    if m.tokenizer is not None:
        m.tokenizer.save_pretrained(folder)
    src = Path(source) if source else None
    if src is not None and src.is_dir():
        for name in _SENTENCE_FILES:
            if (src / name).is_file():
                atomic_write_bytes(folder / name, (src / name).read_bytes())
    atomic_write_text(folder / DONE, json.dumps({"log": rows}, indent=1))
    (folder / STATE).unlink(missing_ok=True)


def finished_log(folder: Path) -> list[dict] | None:
    """The log of a finished run in `folder`, or None."""
    path = folder / DONE
    if not path.is_file():
        return None
    try:
        return list(json.loads(path.read_text("utf-8"))["log"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def settings_dict(s: TrainSettings) -> dict[str, Any]:
    return asdict(s)
