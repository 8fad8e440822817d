"""What the penalty reads from a model's own forward pass, with gradients.

The only module of `identifiable.training` that touches model internals. Through the
model's own capture object (`AttentionStack.tap`, the same hooks a trace uses) it records,
for every run of every layer:
- V = E W_V: the value projection's output (its V columns, minus b_V), so that any
  adapter inside that module (LoRA) is included;
- A: the attention probabilities the attention module returns (eager attention);
and reads each head's slice H of W_O from the output projection (the adapter's
delta added where peft has one), for the rank of T = V H.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast
from weakref import WeakKeyDictionary

from torch import Tensor, nn

from identifiable.errors import IdentifiableError
from identifiable.models.backends import running
from identifiable.models.hooks import HookSet, get_submodule
from identifiable.models.protocol import TracedModel
from identifiable.models.quirks import BATCH_FIRST
from identifiable.models.stack import Tap


def as_model(model: TracedModel) -> Any:
    """An identifiable `Model` for `model`: itself, or a wrapper of a Hugging Face (or peft)
    model built once per model and cached. Wrapping leaves every module's train/eval mode
    and attention implementation as they were (`capture` runs eager for its block)."""
    if hasattr(model, "spec") and hasattr(model, "hf_model"):
        return model
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise IdentifiableError(
            f"model must be an identifiable Model or a Hugging Face model, got {type(model).__name__}"
        )
    base_of = getattr(model, "get_base_model", None)  # peft
    hf = base_of() if base_of is not None else model
    cached = _WRAPPERS.get(hf)
    if cached is not None:
        return cached
    from identifiable.models import Model

    modes = {m: m.training for m in hf.modules()}
    wrapped = Model.from_hf(hf)
    for m, mode in modes.items():
        m.training = mode
    if not isinstance(wrapped, Model):
        raise IdentifiableError(
            "the penalty covers self-attention models; encoder–decoder models are not supported"
        )
    _WRAPPERS[hf] = wrapped
    return wrapped


_WRAPPERS: WeakKeyDictionary = WeakKeyDictionary()


def value_columns(model: TracedModel) -> slice | list[int]:
    """The output columns of the value module that hold W_V (fused QKV layouts sliced)."""
    from identifiable.models.model import value_columns as columns

    info = model.info
    module = get_submodule(model.layers[0], model.spec.value)
    width = int(_weight(module, model.spec.weight_layout).shape[1])
    return columns(model.spec, width, info.n_heads, info.head_dim)[1]


def _weight(module: nn.Module, layout: str) -> Tensor:
    """The module's weight in x @ W orientation, with active peft adapter deltas added."""
    w = cast(Tensor, module.weight)
    base = getattr(module, "base_layer", None)
    delta = getattr(module, "get_delta_weight", None)
    if base is not None and delta is not None:
        w = base.weight
        for name in getattr(module, "active_adapters", []):
            if name in getattr(module, "lora_A", {}):
                w = w + delta(name)
    return w if layout == "conv1d" else w.T


@dataclass
class Captured:
    """One forward pass: per layer run, V `[B, H_kv, N, d_v]` (bias-free) and A `[B, H, N, N]`."""

    values: list[Tensor] = field(default_factory=list)
    attentions: list[Tensor] = field(default_factory=list)


def check_supported(model: TracedModel) -> None:
    """One line for a model whose penalty cannot be read from its forward pass."""
    spec = model.spec
    if (
        spec.weight_layout == "heads"
        or spec.axes != BATCH_FIRST
        or not spec.block_output.at_out_proj
    ):
        raise IdentifiableError(
            f"the null-attention penalty reads the value projection's output, which the "
            f"'{spec.name}' family does not have as a module of its own; use a family "
            "with separate V and output projections (BERT, GPT-2, Llama, …)"
        )
    if getattr(model, "modality", "text") != "text":
        raise IdentifiableError("the null-attention penalty supports text models")
    if getattr(spec, "value_norm", None) is not None:
        raise IdentifiableError(
            f"the '{spec.name}' family normalises each head's values after W_V (Gemma 4's "
            "v_norm), which the penalty's value capture does not apply: use a family whose "
            "values are E·W_V + b_V"
        )
    if getattr(spec, "key_selector", None) is not None:
        raise IdentifiableError(
            f"the '{spec.name}' family picks each row's keys with an indexer (sparse attention),"
            " a key set the penalty does not cover: use a family with all-key or causal layers"
        )


@contextlib.contextmanager
def capture(model: TracedModel) -> Iterator[Captured]:
    """Record V and A of every layer run while the block runs (gradients kept), through the
    model's own capture object (`AttentionStack.tap`: its "values" and "maps" taps); see
    `check_complete` for the counts."""
    check_supported(model)
    cols = value_columns(model)
    d_v, n_kv = model.info.head_dim, model.info.n_kv_heads
    biases = [getattr(get_submodule(m, model.spec.value), "bias", None) for m in model.layers]
    got = Captured()

    def sink(what: Tap, layer: int, x: Any) -> None:
        if what == "maps":
            got.attentions.append(x)
            return
        v = x[..., cols]
        bias = biases[layer] if layer < len(biases) else None
        if bias is not None:
            v = v - bias[cols]
        got.values.append(v.unflatten(-1, (n_kv, d_v)).transpose(1, 2))

    # eager returns the probabilities; the model's own implementation comes back after
    # keep_mode: the penalty trains in the mode the caller chose (dropout on in train mode)
    with running(model.hf_model, "eager", keep_mode=True), HookSet() as hooks:
        model.stack.tap(hooks, sink, ("values", "maps"))
        yield got


def check_complete(model: TracedModel, got: Captured) -> None:
    """One line when the capture did not see one full forward pass."""
    n_layers = model.info.n_layers
    if len(got.values) != n_layers or len(got.attentions) != n_layers:
        raise IdentifiableError(
            f"{n_layers} layers, but the forward pass ran the value projection "
            f"{len(got.values)} times and returned {len(got.attentions)} attention maps; "
            "the penalty needs exactly one full forward pass of the model"
        )


def head_out_proj(model: TracedModel, layer: int) -> Tensor:
    """`[H, d_v, d]` each head's slice H of W_O (differentiable, adapters included)."""
    info = model.info
    module = get_submodule(model.layers[layer], model.spec.out_proj)
    w_o = _weight(module, model.spec.weight_layout)  # [H·d_v, d]
    return w_o.reshape(info.n_heads, info.head_dim, -1)
