"""`null_attention_penalty`: how much attention lies in the null space, as a training loss.

The penalty is the mean, over the chosen layers and heads and over every real query
row of the batch, of the row's null fraction ‖a − a_eff‖² / ‖a‖² (docs/training.md):
0 when every row lies in col(T) (raw attention is then the unique account of what the
head computes), up to 1. It is computed from the model's own forward pass, through
autograd, on padded batches (attention_mask) and in causal models; its value is the
one `identifiable.effective_attention` gives on the same inputs (tested).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from identifiable.errors import IdentifiableError
from identifiable.models.protocol import TracedModel
from identifiable.training.capture import (
    Captured,
    as_model,
    capture,
    check_complete,
    head_out_proj,
)
from identifiable.training.projection import out_proj_factor, row_null_fractions

VARIANTS = ("paper", "row-stochastic")
Heads = Sequence[int] | Mapping[int, Sequence[int]] | None


@dataclass(frozen=True)
class PenaltyResult:
    """A penalty with what it was made of.

    Attributes:
        penalty: scalar float64 tensor with gradients (the mean null fraction).
        per_layer: `[len(layers)]` float64, detached: each chosen layer's mean.
        layers: the layer indices (0-based) in `per_layer` order.
        rows: real query rows averaged per layer (sequences × heads × rows).
        outputs: what the model's forward returned (for a task loss from the same pass).
    """

    penalty: Tensor
    per_layer: Tensor
    layers: tuple[int, ...]
    rows: int
    outputs: Any = None


def null_attention_penalty(
    model: Any,
    batch: Any,
    layers: Sequence[int] | None = None,
    heads: Heads = None,
    variant: str = "paper",
    *,
    return_outputs: bool = False,
) -> Any:
    """The mean null fraction of the batch's attention rows, differentiable (a scalar).

    Args:
        model: an identifiable `Model`, a Hugging Face model (any task head) or a peft
            model; the forward pass is this model's own, with gradients.
        batch: the keyword arguments of the model's forward (a tokenizer's padded
            `BatchEncoding`, with `attention_mask`), or a list of texts (tokenised here).
        layers: 0-based layer indices (default: every layer).
        heads: head indices for every chosen layer, or {layer: heads} (default: all).
        variant: "paper" (project off LN(T)) or "row-stochastic" (off LN([T, 1])).
        return_outputs: return a `PenaltyResult` (with the model's outputs and the
            per-layer means) instead of the scalar.
    """
    if variant not in VARIANTS:
        raise IdentifiableError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    m = as_model(model)
    chosen = select_heads(m, layers, heads)
    inputs = model_inputs(m, batch)
    runner = m.hf_model if hasattr(model, "spec") else model
    with capture(m) as got:
        outputs = runner(**inputs)
    result = penalty_from_capture(m, got, inputs.get("attention_mask"), chosen, variant)
    if return_outputs:
        return PenaltyResult(result.penalty, result.per_layer, result.layers, result.rows, outputs)
    return result.penalty


def model_inputs(model: Any, batch: Any) -> dict[str, Any]:
    """The forward's keyword arguments: a mapping as given, or a list of texts tokenised
    with padding (and truncation to the model's length)."""
    if isinstance(batch, Mapping):
        if "input_ids" not in batch and "inputs_embeds" not in batch:
            raise IdentifiableError(
                "batch must hold 'input_ids' (a tokenizer's BatchEncoding) or be a list of texts"
            )
        tensors = ("input_ids", "attention_mask", "token_type_ids", "inputs_embeds")
        bad = next(
            (k for k in tensors if k in batch and not isinstance(batch[k], torch.Tensor)), None
        )
        if bad is not None:  # the model's forward would fail deep inside on a list or a number
            raise IdentifiableError(
                f"batch[{bad!r}] must be a tensor (return_tensors='pt'), got "
                f"{type(batch[bad]).__name__}"
            )
        return dict(batch)
    if isinstance(batch, list | tuple) and batch and all(isinstance(t, str) for t in batch):
        tok = model.tokenizer
        if tok is None:
            raise IdentifiableError("the model has no tokenizer: pass a BatchEncoding as batch")
        enc = tok(
            list(batch),
            padding=True,
            truncation=True,
            max_length=model.info.max_positions,
            return_tensors="pt",
        )
        return {k: v.to(model.device) for k, v in enc.items()}
    raise IdentifiableError(
        f"batch must be a tokenizer's BatchEncoding (a mapping) or a list of texts, got "
        f"{type(batch).__name__}"
    )


def select_heads(
    model: TracedModel, layers: Sequence[int] | None, heads: Heads
) -> dict[int, list[int]]:
    """{layer: heads} after checking every index against the model."""
    n_layers, n_heads = model.info.n_layers, model.info.n_heads
    chosen = list(range(n_layers)) if layers is None else [int(x) for x in layers]
    if not chosen or any(not 0 <= x < n_layers for x in chosen):
        raise IdentifiableError(f"layers must be 0-based layer indices in 0..{n_layers - 1}")
    out: dict[int, list[int]] = {}
    for layer in chosen:
        hs = heads.get(layer, range(n_heads)) if isinstance(heads, Mapping) else heads
        picked = list(range(n_heads)) if hs is None else [int(h) for h in hs]
        if not picked or any(not 0 <= h < n_heads for h in picked):
            raise IdentifiableError(f"heads must be head indices in 0..{n_heads - 1}")
        out[layer] = picked
    return out


def penalty_from_capture(
    model: TracedModel,
    got: Captured,
    attention_mask: Tensor | None,
    chosen: dict[int, list[int]],
    variant: str,
) -> PenaltyResult:
    """The penalty of one captured forward pass (see `null_attention_penalty`)."""
    check_complete(model, got)
    a0 = got.attentions[0]
    bsz, _, n_pad, _ = a0.shape
    mask = (
        torch.ones(bsz, n_pad, dtype=torch.bool, device=a0.device)
        if attention_mask is None
        else attention_mask.to(a0.device).bool()
    )
    if tuple(mask.shape) != (bsz, n_pad):
        raise IdentifiableError(
            f"attention_mask has shape {tuple(mask.shape)}, the attention maps [{bsz}, {n_pad}]"
        )
    order, lengths = _real_first(mask)
    causal = _layer_routes(model, n_pad, list(chosen))
    total = a0.new_zeros((), dtype=torch.float64)
    per_layer, rows = [], 0
    for layer, heads in chosen.items():
        s, count = _layer_sum(model, got, layer, heads, order, lengths, causal, variant)
        total = total + s
        per_layer.append(float(s.detach()) / max(count, 1))
        rows += count
    penalty = total / max(rows, 1)
    return PenaltyResult(
        penalty,
        torch.tensor(per_layer, dtype=torch.float64),
        tuple(chosen),
        rows // max(len(chosen), 1),
    )


def _real_first(mask: Tensor) -> tuple[Tensor | None, Tensor]:
    """Positions that put each sequence's real tokens first (None: already so), lengths `[B]`."""
    lengths = mask.sum(-1)
    if bool((lengths < 1).any()):
        raise IdentifiableError("a sequence of the batch has no real token (attention_mask all 0)")
    pos = torch.arange(mask.shape[1], device=mask.device)
    if bool((mask == (pos[None, :] < lengths[:, None])).all()):
        return None, lengths
    return torch.argsort((~mask).long(), dim=-1, stable=True), lengths


def _layer_routes(model: TracedModel, n: int, layers: list[int]) -> bool:
    """Whether the chosen layers are causal; one line for key sets the penalty does not cover."""
    masks = model.key_mask(n)
    full, tril = torch.ones(n, n, dtype=torch.bool), torch.ones(n, n, dtype=torch.bool).tril()
    for layer in layers:
        if not torch.equal(masks[layer], tril if model.spec.causal else full):
            raise IdentifiableError(
                f"layer {layer} attends through a window (local or sliding-window attention) "
                f"at {n} tokens; the penalty covers all-key and causal layers: choose other "
                "layers= or shorter batches"
            )
    return bool(model.spec.causal)


def _layer_sum(
    model: TracedModel,
    got: Captured,
    layer: int,
    heads: list[int],
    order: Tensor | None,
    lengths: Tensor,
    causal: bool,
    variant: str,
) -> tuple[Tensor, int]:
    """Sum of the null fractions of one layer's chosen heads over real rows, and their count."""
    a, v = got.attentions[layer], got.values[layer]
    idx = torch.tensor(heads, device=a.device)
    kv = model.kv_head_of.to(a.device)[idx]
    # every head in order (the default) reads the captured tensors as they are: no copies
    if heads != list(range(a.shape[1])):
        a = a[:, idx]  # [B, h, N, N]
    if not torch.equal(kv, torch.arange(v.shape[1], device=kv.device)):
        v = v[:, kv]  # [B, h, N, d_v]
    f = out_proj_factor(head_out_proj(model, layer)[idx].double())  # [h, d_v, r]
    if order is not None:
        a = torch.gather(a, 2, order[:, None, :, None].expand_as(a))
        a = torch.gather(a, 3, order[:, None, None, :].expand_as(a))
        v = torch.gather(v, 2, order[:, None, :, None].expand_as(v))
    bsz, n_h, n_pad, _ = a.shape
    frac, real = row_null_fractions(
        a.reshape(bsz * n_h, n_pad, n_pad),
        v.reshape(bsz * n_h, n_pad, -1),
        lengths.repeat_interleave(n_h),
        causal=causal,
        row_stochastic=variant == "row-stochastic",
        factor=f.expand(bsz, *f.shape).reshape(bsz * n_h, *f.shape[1:]),
    )
    total = frac.sum()
    if not bool(torch.isfinite(total.detach())):
        raise IdentifiableError(
            f"layer {layer}: the attention or the values hold NaN or inf; the penalty needs "
            "a finite forward pass (lower the learning rate, check the inputs)"
        )
    return total, int(real.sum())
