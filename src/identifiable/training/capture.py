"""What the penalty reads from a model's own forward pass, with gradients.

The only module of `identifiable.training` that touches model internals, kept small so
that it can move onto the models package's capture object later. Through `HookSet`
hooks on each layer it records, for every run of every layer:
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
from identifiable.models.compat import ask_for_attention_weights
from identifiable.models.hooks import HookSet, first_tensor, get_submodule
from identifiable.models.protocol import TracedModel


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
    if spec.weight_layout == "heads" or spec.sequence_first or spec.block_output_at:
        raise IdentifiableError(
            f"the null-attention penalty reads the value projection's output, which the "
            f"'{spec.name}' family does not have as a module of its own; use a family "
            "with separate V and output projections (BERT, GPT-2, Llama, …)"
        )
    if getattr(model, "modality", "text") != "text":
        raise IdentifiableError("the null-attention penalty supports text models")


@contextlib.contextmanager
def capture(model: TracedModel) -> Iterator[Captured]:
    """Record V and A of every layer run while the block runs (gradients kept); see
    `check_complete` for the counts."""
    check_supported(model)
    spec, info = model.spec, model.info
    cols = value_columns(model)
    d_v, n_kv = info.head_dim, info.n_kv_heads
    got = Captured()

    def on_value(module: nn.Module, args: Any, out: Any) -> None:
        v = first_tensor(out)[..., cols]
        bias = getattr(module, "bias", None)
        if bias is not None:
            v = v - bias[cols]
        got.values.append(v.unflatten(-1, (n_kv, d_v)).transpose(1, 2))

    def on_attention(module: nn.Module, args: Any, out: Any) -> None:
        maps = [
            t
            for t in (out if isinstance(out, tuple | list) else (out,))
            if isinstance(t, Tensor) and t.dim() == 4 and t.shape[-1] == t.shape[-2]
        ]
        if not maps:
            raise IdentifiableError(
                "the model returned no attention probabilities (no attention maps from its "
                "attention modules); load it with attn_implementation='eager'"
            )
        got.attentions.append(maps[-1])

    parent = spec.value.rsplit(".", 1)[0] if "." in spec.value else ""
    # eager returns the probabilities; the model's own implementation comes back after
    # keep_mode: the penalty trains in the mode the caller chose (dropout on in train mode)
    with running(model.hf_model, "eager", keep_mode=True), HookSet() as hooks:
        for layer in _distinct(model.layers):
            hooks.post(get_submodule(layer, spec.value), on_value)
            attn = get_submodule(layer, parent) if parent else layer
            hooks.post(attn, on_attention)
            if (ask := ask_for_attention_weights(attn)) is not None:  # transformers 4.x
                hooks.pre(attn, ask, with_kwargs=True)
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


def _distinct(modules: list[nn.Module]) -> list[nn.Module]:
    seen: dict[int, nn.Module] = {}
    for m in modules:
        seen.setdefault(id(m), m)
    return list(seen.values())
