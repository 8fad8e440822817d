"""`AttentionStack`: one attention kind across the layers of one stack, the capture object.

An encoder-only or decoder-only model has one stack; an encoder–decoder model has three
(the encoder's self-attention, the decoder's causal self-attention, and its
cross-attention over the encoder's outputs). A stack knows, from its `ArchSpec`, where
each layer reads E (the value projection's input), where the attention block's output
is (after W_O and b_O, before dropout and residual), which module returns the attention
probabilities A, and the per-head weights W_V, b_V, W_O, b_O in the orientation of
docs/definitions.md (x @ W). It also knows each layer's key set (causal, windows).

Capture is by taps: `AttentionStack.tap` hooks a forward pass and hands each layer's
tensors to a sink as they are made, one call per (tap, layer). Taps compose: several
sinks can tap one pass, and a sink may keep only the layers it wants
(`identifiable.models.capture` builds `Trace`s this way).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import torch
from torch import nn

from identifiable.errors import IdentifiableError
from identifiable.models import keyselect
from identifiable.models import recompute as recomputed
from identifiable.models.compat import (
    adapt_spec,
    ask_for_attention_weights,
    layer_attr,
    per_layer_windows,
    window_config,
)
from identifiable.models.hooks import (
    HookSet,
    first_tensor,
    get_submodule,
    hidden_input,
    module_list,
)
from identifiable.models.hybrid import (
    has_attention,
    kind_of,
    one_head_width,
    others_line,
    ranges,
)
from identifiable.models.recompute import AttentionCall
from identifiable.models.selection import indices
from identifiable.models.specs import ArchSpec

Tap = Literal["input", "e", "values", "maps", "block", "output", "head_outputs", "keys"]
"""What a tap captures, per layer, batch-first:

- "input": the layer's hidden-state input `[B, n, d]` (layer 0's is e^0);
- "e": E, the value projection's input `[B, n_k, d]`;
- "values" (not in `TAPS`): the value projection's output `[B, n_k, width]` as the module
  computed it (fused columns, bias and any adapter inside the module included: what the
  training penalty differentiates through);
- "maps": the attention probabilities A `[B, H, n, n_k]` (from the attention module);
- "block": the attention block's output `[B, n, d]` (after W_O and b_O);
- "output": the layer's output `[B, n, d]`;
- "head_outputs" (not in `TAPS`): the output projection's input `[B, n, H·d_v]`, each
  head's A (E W_V + 1 b_Vᵀ) side by side (what a trace of chosen heads verifies against);
- "keys" (not in `TAPS`): `[B, n, k]` the keys an indexer picked (models/keyselect.py).

With `recompute=True`, "maps" hands over an `AttentionCall` (models/recompute.py) where the
attention function returned no probabilities (sdpa, flash), for the sink to fill.
"""
TAPS: tuple[Tap, ...] = ("input", "e", "maps", "block", "output")
Captured = torch.Tensor | AttentionCall
Sink = Callable[[Tap, int, Captured], None]
"""Receives (tap, layer, tensor) during the forward pass, in the order the model runs."""

HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class HeadWeights:
    """One layer's W_V, b_V, W_O, b_O in the orientation of docs/definitions.md (x @ W)."""

    w_v: torch.Tensor  # [d, H_kv·d_v]
    b_v: torch.Tensor  # [H_kv·d_v]
    w_o: torch.Tensor  # [H·d_v, d]
    b_o: torch.Tensor  # [d]


class AttentionStack:
    """One attention kind over the (logical) layers of one stack.

    Attributes:
        layers: the layers in the order the forward pass runs them (a layer shared
            across depths, ALBERT's, appears once per run).
        spec: where the pieces live (`ArchSpec`).
        value_modules, out_modules, attention_modules: per layer, the module whose input
            is E, the module where the block output is read (`spec.block_output`), and the
            module whose output holds A.
        v_cols: the value module's output columns that hold W_V, in key/value-head order.
        n_heads, n_kv_heads, head_dim, hidden_size: H, H_kv, d_v, d.
        kv_head_of: `[H]` the key/value head each query head reads.
        weights: per layer, `HeadWeights` (detached views of the parameters).
        windows: per layer, the attention window (None: every key the row may see).
        label: "" for a model's only stack, else "encoder", "decoder" or "cross" (messages).
        model_index: per layer, its index among the model's layers (hybrid stacks trace
            only their softmax-attention layers); None: 0, 1, ….
        others: the model's layers that are not softmax attention, index → kind
            ("linear_attn (Qwen3NextGatedDeltaNet)").
    """

    def __init__(
        self,
        layers: Sequence[nn.Module],
        spec: ArchSpec,
        *,
        n_heads: int,
        head_dim: int,
        hidden_size: int,
        windows: Sequence[int | None] | None = None,
        label: str = "",
        model_index: Sequence[int] | None = None,
        others: dict[int, str] | None = None,
    ) -> None:
        self.layers, self.spec, self.label = list(layers), spec, label
        self.model_index = list(model_index or range(len(self.layers)))
        self.others = dict(others or {})
        self.n_heads, self.head_dim, self.hidden_size = n_heads, head_dim, hidden_size
        self.value_modules = [_e_module(layer, spec) for layer in self.layers]
        self.out_modules = [
            get_submodule(layer, spec.block_output.path(spec.out_proj)) for layer in self.layers
        ]
        self.attention_modules = [_attention_module(layer, spec.value) for layer in self.layers]
        width = self.projections(0)[0].shape[1]
        self.n_kv_heads, self.v_cols = value_columns(spec, width, n_heads, head_dim)
        if self.n_kv_heads < 1 or n_heads % self.n_kv_heads:
            raise IdentifiableError(
                f"{self.prefix}the value projection has width {width}, which gives "
                f"{self.n_kv_heads} key/value heads of width {head_dim} for {n_heads} query "
                "heads; the spec does not fit this model."
            )
        self.kv_head_of = torch.arange(n_heads) // (n_heads // self.n_kv_heads)
        self.weights = [self._head_weights(i) for i in range(len(self.layers))]
        self.windows: list[int | None] = list(windows or [None] * len(self.layers))
        # (versions of the W_O parameters, the stacked W_O shared by traces): `out_proj`
        self._out_proj_cache: tuple[tuple[int, ...], torch.Tensor] | None = None

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def prefix(self) -> str:
        """The start of this stack's error messages ("cross attention: ", or nothing)."""
        return f"{self.label} attention: " if self.label else ""

    # ---- weights ---------------------------------------------------------------
    def projections(self, layer: int) -> tuple[torch.Tensor, ...]:
        """(W_V over every output column of the value module, b_V, W_O, b_O) of a layer,
        in the orientation x @ W; views of the parameters (in-place updates show)."""
        spec, mod = self.spec, self.layers[layer]
        if spec.weight_layout == "heads":
            v, o = _raw_heads(mod, spec.value), _raw_heads(mod, spec.out_proj)
            w_v = v.reshape(v.shape[0], -1)  # column h·d_v + c is v[:, h, c]
            w_o = o.reshape(o.shape[0], -1).T  # row h·d_v + c is o[:, h, c]
            return w_v, torch.zeros_like(w_v[0]), w_o, torch.zeros_like(w_o[0])
        v_mod, o_mod = self.value_modules[layer], get_submodule(mod, spec.out_proj)
        w_v = _weight_in_out(v_mod, spec.weight_layout)
        w_o = _weight_in_out(o_mod, spec.weight_layout)
        return w_v, _bias(v_mod, w_v.shape[1], w_v), w_o, _bias(o_mod, w_o.shape[1], w_o)

    def _head_weights(self, layer: int) -> HeadWeights:
        w_v, b_v, w_o, b_o = self.projections(layer)
        w_v, b_v = w_v[:, self.v_cols], b_v[self.v_cols]
        if self.spec.value_bias is not None:  # b_V added after a bias-free projection
            b_v = self.layers[layer].get_parameter(self.spec.value_bias)
        # latent attention: E is the normalised latent, not the hidden state
        e_width = w_v.shape[0] if self.spec.latent is not None else self.hidden_size
        expected_v = (e_width, self.n_kv_heads * self.head_dim)
        expected_o = (self.n_heads * self.head_dim, self.hidden_size)
        if tuple(w_v.shape) != expected_v or tuple(w_o.shape) != expected_o:
            raise IdentifiableError(
                f"{self.prefix}layer {layer}: W_V has shape {tuple(w_v.shape)} (expected "
                f"{expected_v}) and W_O {tuple(w_o.shape)} (expected {expected_o}); the output "
                "projection of this model is not separable per head as the spec assumes."
            )
        return HeadWeights(*(t.detach() for t in (w_v, b_v, w_o, b_o)))

    def per_query_head(self, kv_rows: torch.Tensor) -> torch.Tensor:
        """[..., H_kv·d_v] → [..., H, d_v], repeating each key/value head for its query heads."""
        split = kv_rows.reshape(*kv_rows.shape[:-1], self.n_kv_heads, self.head_dim)
        return split[..., self.kv_head_of.to(split.device), :]

    def values(
        self, layer: int, e: torch.Tensor, heads: Sequence[int] | None = None
    ) -> torch.Tensor:
        """`[B, H, n_k, d_v]` E·W_V (bias-free, by the definition of T) from E `[B, n_k, d]`
        (`heads`: only those query heads, `[B, len(heads), n_k, d_v]`); with
        `spec.value_norm`, the model's norm of E·W_V + b_V, which is what attention reads."""
        w_v, b_v = self.weights[layer].w_v, self.weights[layer].b_v
        # Half-precision models: E and W_V as the model holds them, multiplied in
        # float32, so T is exact for the captured operands (analyses use float64).
        work = torch.float32 if e.dtype in HALF else e.dtype
        if heads is not None:  # only the chosen heads' columns of W_V
            kv = self.kv_head_of[list(heads)]
            cols = (kv[:, None] * self.head_dim + torch.arange(self.head_dim)).reshape(-1)
            w_v, b_v = w_v[:, cols.to(w_v.device)], b_v[cols.to(b_v.device)]
        v = (e.to(work) @ w_v.to(work)).unflatten(-1, (-1, self.head_dim))  # [B, n_k, S, d_v]
        if self.spec.value_norm is not None:  # the model's norm of each head's E·W_V + b_V
            norm = self.layers[layer].get_submodule(self.spec.value_norm)
            v = norm(v + b_v.to(work).unflatten(-1, v.shape[-2:]))
        if heads is None:
            v = v[..., self.kv_head_of.to(v.device), :]
        return v.permute(0, 2, 1, 3)

    def value_bias(self) -> torch.Tensor:
        """`[L, H, d_v]` float32 CPU b_V per query head (zero where `value_norm` holds it)."""
        b_v = torch.stack([self.per_query_head(w.b_v) for w in self.weights]).float().cpu()
        return torch.zeros_like(b_v) if self.spec.value_norm is not None else b_v

    def out_bias(self) -> torch.Tensor:
        """`[L, d]` float32 CPU b_O."""
        return torch.stack([w.b_o for w in self.weights]).float().cpu()

    def has_out_proj(self) -> bool:
        """Whether the shared W_O copy of `out_proj` exists and is current (no bytes to spend)."""
        versions = tuple(w.w_o._version for w in self.weights)
        return self._out_proj_cache is not None and self._out_proj_cache[0] == versions

    def out_proj(self) -> torch.Tensor:
        """`[L, H, d_v, d]` float32 CPU W_O, one tensor shared by every trace of this stack.

        Sharing saves a copy per trace (2 GB for a 7B model) and lets
        `attention.effective` reuse its factorisation of W_O across traces (it
        caches by tensor identity). The copy is rebuilt whenever a weight was
        changed in place (an optimizer step, `load_state_dict`): the detached
        views in `weights` share their parameters' version counters.
        """
        versions = tuple(w.w_o._version for w in self.weights)
        if self._out_proj_cache is not None and self._out_proj_cache[0] == versions:
            return self._out_proj_cache[1]
        w_o = torch.stack([w.w_o.reshape(self.n_heads, self.head_dim, -1) for w in self.weights])
        w_o = w_o.float().cpu()
        self._out_proj_cache = (versions, w_o)
        return w_o

    # ---- key sets ----------------------------------------------------------------
    def key_mask(self, n: int, n_keys: int | None = None) -> torch.Tensor:
        """`[L, n, n_k]` bool: which keys each query row of each layer may attend to.

        Derived from the spec and the config, not from the attention weights: all keys
        (encoders; cross-attention, whose `n_keys` encoder outputs are given), keys ≤ i
        (decoders), narrowed to a window on sliding-window/local layers (i − j < w for
        decoders, |i − j| ≤ w for encoders, as Hugging Face builds these masks).
        """
        if n_keys is not None:  # cross-attention: every encoder output
            return torch.ones(self.n_layers, n, n_keys, dtype=torch.bool)
        return key_masks(n, self.spec.causal, self.windows)

    def check_key_mask(self, att: torch.Tensor, mask: torch.Tensor, layer: int = 0) -> None:
        """The model's attention `[L, H, n, n_k]` must be exactly 0 outside `mask` `[L, n, n_k]`
        (`layer`: the index of the first layer given, for the message)."""
        if bool(mask.all()):
            return  # nothing lies outside (encoders): skip a full pass over the weights
        # head by head: one n×n_k temporary, never a copy of every head's maps
        bad = [
            i
            for i in range(att.shape[0])
            if any(bool(a.masked_fill(mask[i], 0).any()) for a in att[i])
        ]
        if bad:
            first = layer + bad[0]
            raise IdentifiableError(
                f"{self.prefix}layer {first} attends to keys outside the mask derived from "
                f"the config (spec '{self.spec.name}': causal, windows); the spec does not "
                "describe this model's masking."
            )

    # ---- capture -----------------------------------------------------------------
    def batch_first(self, x: torch.Tensor) -> torch.Tensor:
        """A layer-level tensor as [B, n, …]: sequence-first models (XLNet) pass [n, B, …]."""
        return self.spec.axes.batch_first(x)

    def tap(
        self,
        hooks: HookSet,
        sink: Sink,
        taps: Collection[Tap] = TAPS,
        *,
        map_shape: tuple[int, int] | None = None,
        recompute: bool = False,
    ) -> None:
        """Hook every run of every layer: each tap in `taps` hands `sink` its tensor.

        One hook per distinct module, its calls counted in order, so a layer that runs
        several times (ALBERT shares one) is captured at each run, as layer 0, 1, ….
        A model that runs a module more often than the spec has layers hands on layer
        numbers ≥ `n_layers`, for the sink to refuse (`check_calls`). `map_shape` is
        (rows, keys) of the padded batch: "maps" takes the 4-D tensor of that trailing
        shape from the attention module's output (the last one, after T5's position bias).
        `recompute`: "maps" from the attention function's call (`recompute.watch`): its
        probabilities where it returns them (eager), else what it received.
        """
        calls: dict[Tap, int] = dict.fromkeys(taps, 0)

        def emit(what: Tap, x: Captured) -> None:
            calls[what] += 1
            sink(what, calls[what] - 1, x)

        def maps(m: nn.Module, a: Any, out: Any) -> None:
            emit("maps", self._maps_in(out, map_shape, calls["maps"]))

        def called(m: nn.Module, out: Any, call: Callable[[], AttentionCall]) -> None:
            weights = out[1] if isinstance(out, tuple) and len(out) > 1 else None
            emit("maps", weights if torch.is_tensor(weights) and weights.dim() == 4 else call())

        if "input" in taps:
            for mod in distinct(self.layers):
                hooks.pre(
                    mod,
                    lambda m, a, k: emit("input", self.batch_first(hidden_input(a, k))),
                    with_kwargs=True,
                )
        if "e" in taps:
            for mod in distinct(self.value_modules):
                hooks.pre(mod, lambda m, a: emit("e", self.e_rows(a[0])))
        if "values" in taps:  # resolved now: an adapter (peft) may have replaced the module
            for mod in distinct([get_submodule(layer, self.spec.value) for layer in self.layers]):
                hooks.post(mod, lambda m, a, o: emit("values", self.e_rows(first_tensor(o))))
        if "maps" in taps and recompute:
            for mod in distinct(self.attention_modules):
                recomputed.watch(hooks, mod, called)
        elif "maps" in taps:
            for mod in distinct(self.attention_modules):
                hooks.post(mod, maps)
                if (ask := ask_for_attention_weights(mod)) is not None:  # transformers 4.x
                    hooks.pre(mod, ask, with_kwargs=True)
        if "block" in taps:
            for mod in distinct(self.out_modules):
                self.spec.block_output.hook(
                    hooks, mod, lambda x: emit("block", self.batch_first(x))
                )
        if "head_outputs" in taps:
            if not self.spec.block_output.at_out_proj or self.spec.weight_layout == "heads":
                raise IdentifiableError(
                    f"{self.prefix}the '{self.spec.name}' spec has no output projection module "
                    "whose input holds each head's output: trace all heads (heads=None)"
                )
            for mod in distinct(self.out_modules):
                hooks.pre(mod, lambda m, a: emit("head_outputs", self.batch_first(a[0])))
        if "keys" in taps and self.spec.key_selector is not None:
            keyselect.tap(hooks, self.layers, self.spec.key_selector, partial(sink, "keys"))
        if "output" in taps:
            for mod in distinct(self.layers):
                hooks.post(mod, lambda m, a, o: emit("output", self.batch_first(first_tensor(o))))

    def e_rows(self, e: torch.Tensor) -> torch.Tensor:
        """The value module's input as E `[B, n_k, width]`."""
        e = self.batch_first(e)
        return self.spec.latent.rows(e) if self.spec.latent is not None else e

    def model_layers(self, chosen: Sequence[int]) -> list[int]:
        """The model's indices of the stack's layers `chosen`."""
        return [self.model_index[i] for i in chosen]

    def requested(self, layers: Sequence[int] | None) -> list[int] | None:
        """The stack's indices of the model's layers `layers` (None: all), checked."""
        chosen = indices(layers, len(self.model_index) + len(self.others), "layers")
        return None if chosen is None else self.stack_layers(chosen)

    def stack_layers(self, requested: Sequence[int]) -> list[int]:
        """The stack's indices of the model's layers `requested`, or one line naming a
        layer that is not softmax attention (or does not exist)."""
        where = {m: i for i, m in enumerate(self.model_index)}
        for m in requested:
            if m not in where:
                kind = self.others.get(m)
                what = f"is {kind}: not softmax attention" if kind else "does not exist"
                raise IdentifiableError(
                    f"{self.prefix}layer {m} {what}; choose among the softmax-attention "
                    f"layers {ranges(self.model_index)}"
                )
        return [where[m] for m in requested]

    def others_line(self) -> str:
        """One line naming the layers that are not traced, with their kind ("" if none)."""
        return others_line(self.others)

    def _maps_in(self, out: Any, shape: tuple[int, int] | None, layer: int) -> torch.Tensor:
        """The attention probabilities `[B, H, n, n_k]` in an attention module's output."""
        found = [
            self.spec.axes.maps_batch_first(t)
            for t in (out if isinstance(out, tuple | list) else (out,))
            if isinstance(t, torch.Tensor) and t.dim() == 4
        ]
        fitting = [t for t in found if shape is None or tuple(t.shape[-2:]) == shape]
        if fitting:
            return fitting[-1]
        if found and shape is not None:
            got = tuple(found[-1].shape[-2:])
            if self.spec.modality == "image":
                raise IdentifiableError(
                    f"the model made {got[-1]} tokens of the image but the patch grid names "
                    f"{shape[-1]}; the spec '{self.spec.name}' does not fit this model"
                )
            raise IdentifiableError(
                f"{self.prefix}layer {layer}'s attention maps are {got[0]}×{got[1]}, but the "
                f"input gives {shape[0]} queries and {shape[1]} keys; the spec "
                f"'{self.spec.name}' does not fit this model"
            )
        raise IdentifiableError(
            f"{self.prefix}the attention module of the '{self.spec.name}' spec returns no "
            f"attention weights per layer (layer {layer}); load the model with "
            "attn_implementation='eager' (identifiable.load_model does this for you)"
        )

    def check_calls(self, calls: dict[Tap, int], expected: int) -> None:
        """`expected` calls of each tap but "input" (which runs at least once), or one line
        saying that the spec does not describe this model."""
        counts = {k: v for k, v in calls.items() if k != "input"}
        if set(counts.values()) <= {expected} and calls.get("input", 1) >= 1:
            return
        raise IdentifiableError(
            f"{self.prefix}{expected} layers, but the value projection ran "
            f"{calls.get('e', '?')} times, the output projection {calls.get('block', '?')}, the "
            f"layers {calls.get('output', '?')} and the attention modules returned "
            f"{calls.get('maps', '?')} attention maps; the spec '{self.spec.name}' does not "
            "match this model (see docs/families.md, 'Adding an architecture')."
        )


# ---- layers, windows and key masks -------------------------------------------


def stack_of(base: nn.Module, spec: ArchSpec, *, label: str = "") -> AttentionStack:
    """The stack of an encoder-only or decoder-only base model (or of one stack of an
    encoder–decoder model), sized from its config; transformers 4.x paths where they differ."""
    config: Any = base.config
    spec = adapt_spec(base, spec)
    every = logical_layers(base, spec)
    # hybrid stacks: only the layers holding the spec's attention are traced
    kept = [i for i, layer in enumerate(every) if has_attention(layer, spec)]
    if not kept:
        if spec.weight_layout != "heads":  # the message names the first missing module
            for path in (spec.value, spec.block_output.path(spec.out_proj)):
                get_submodule(every[0] if every else base, path)
        raise IdentifiableError(
            f"no layer of '{spec.layers}' holds the spec's '{spec.value}' and "
            f"'{spec.out_proj}'; the spec does not match this model class (see "
            "docs/families.md, 'Adding an architecture')."
        )
    n_heads = int(config.num_attention_heads)
    hidden = int(config.hidden_size)
    head_dim = layer_attr(config, "head_dim", kept[0]) or hidden // n_heads
    kept, wider = one_head_width(every, kept, spec, n_heads)
    others = {i: kind_of(layer, every[kept[0]]) for i, layer in enumerate(every) if i not in kept}
    others |= wider
    windows = layer_windows(config, spec, len(every))
    return AttentionStack(
        [every[i] for i in kept],
        spec,
        n_heads=n_heads,
        head_dim=spec.latent.head_dim(config) if spec.latent is not None else int(head_dim),
        hidden_size=hidden,
        windows=[windows[i] for i in kept],
        label=label,
        model_index=kept,
        others=others,
    )


def logical_layers(base: nn.Module, spec: ArchSpec) -> list[nn.Module]:
    """The layers in the order the forward pass runs them (a shared layer appears once per run)."""
    return spec.layer_groups.runs(module_list(base, spec.layers), base)


def layer_windows(config: Any, spec: ArchSpec, n_layers: int) -> list[int | None]:
    """The attention window of each layer (None: the layer sees every key its row may see)."""
    try:
        window, types = window_config(config, spec)
    except RuntimeError:  # a heterogeneous config refuses its global window: read each layer's
        if (own := per_layer_windows(config, spec, n_layers)) is None:
            raise
        return own
    if not isinstance(window, int) or window <= 0:
        return [None] * n_layers
    if isinstance(types, list | tuple) and len(types) == n_layers:
        local = {"sliding_attention", "local"}
        return [window if t in local else None for t in types]
    return [window] * n_layers  # Mistral, Mixtral: one window for every layer


def key_masks(n: int, causal: bool, windows: Sequence[int | None]) -> torch.Tensor:
    """`[L, n, n]` bool, see `AttentionStack.key_mask`."""
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    base = j <= i if causal else torch.ones(n, n, dtype=torch.bool)
    masks = []
    for w in windows:
        if w is None:
            masks.append(base)
        elif causal:
            masks.append(base & (i - j < w))
        else:
            masks.append((i - j).abs() <= w)
    return torch.stack(masks) if masks else torch.zeros(0, n, n, dtype=torch.bool)


def value_columns(
    spec: ArchSpec, width: int, n_heads: int, head_dim: int
) -> tuple[int, slice | list[int]]:
    """(H_kv, the output columns of the value module that hold W_V, in key/value-head order).

    Args:
        width: output width of the value module (the fused width for fused QKV).
    """
    if spec.latent is not None:  # every query head has its own value block
        return n_heads, spec.latent.columns(width, n_heads, head_dim)
    if spec.fused is None:
        return width // head_dim, slice(0, width)
    n_kv = (width // head_dim - n_heads) // 2  # fused width is (H + 2·H_kv)·d_v
    if n_kv < 1 or (n_heads + 2 * n_kv) * head_dim != width or n_heads % n_kv:
        raise IdentifiableError(
            f"the fused QKV projection has width {width}, which is not (H + 2·H_kv)·d_v for "
            f"H = {n_heads}, d_v = {head_dim}; the spec's fused layout does not fit this model."
        )
    if spec.fused == "qvk_mp4":  # block g: [q | v | k] of heads g·H/4 … (g+1)·H/4 − 1
        local = n_heads * head_dim // 4
        return n_kv, [g * 3 * local + local + c for g in range(4) for c in range(local)]
    if spec.fused == "qkv_blocks":
        start = (n_heads + n_kv) * head_dim
        return n_kv, slice(start, start + n_kv * head_dim)
    group = n_heads // n_kv + 2  # per key/value head: its query heads, its key, its value
    cols = [(g * group + group - 1) * head_dim + c for g in range(n_kv) for c in range(head_dim)]
    return n_kv, cols


def base_model_of(hf_model: nn.Module) -> nn.Module:
    """The body of a task-head model (`*ForMaskedLM`, `*ForCausalLM`, `*ForSequenceClassification`,
    `*ForTokenClassification`, `*ForQuestionAnswering`, …), or the model itself; of a
    multimodal model (Llava, Gemma 3, Qwen2.5-VL), its language model, which is what the
    model runs on token ids alone."""
    base = getattr(hf_model, "base_model", None)
    base = base if isinstance(base, nn.Module) else hf_model
    tower = getattr(base, "language_model", None)
    text = getattr(getattr(base, "config", None), "text_config", None)
    if text is not None and isinstance(tower, nn.Module) and hasattr(tower, "config"):
        return base_model_of(tower)
    return base


def distinct(modules: Sequence[nn.Module]) -> list[nn.Module]:
    """Each module once, in first-seen order (a layer shared across depths repeats)."""
    return list({id(m): m for m in modules}.values())


def _attention_module(layer: nn.Module, value_path: str) -> nn.Module:
    """The module around the value projection, whose output carries the attention weights."""
    parent = value_path.rsplit(".", 1)[0] if "." in value_path else ""
    return get_submodule(layer, parent) if parent else layer


def _e_module(layer: nn.Module, spec: ArchSpec) -> nn.Module:
    """The module whose first input is E: the value projection, or (raw "heads"
    parameters, which have no module of their own) the attention module holding W_V."""
    if spec.weight_layout == "heads":
        return _attention_module(layer, spec.value)
    return get_submodule(layer, spec.value)


def _weight_in_out(module: nn.Module, layout: str) -> torch.Tensor:
    w = module.weight
    assert isinstance(w, torch.Tensor)
    return w if layout == "conv1d" else w.T


def _bias(module: nn.Module, size: int, like: torch.Tensor) -> torch.Tensor:
    b = getattr(module, "bias", None)
    return b if b is not None else torch.zeros(size, dtype=like.dtype, device=like.device)


def _raw_heads(layer: nn.Module, path: str) -> torch.Tensor:
    """A raw `[d, H, d_v]` projection parameter (`ArchSpec.weight_layout` "heads")."""
    try:
        p = layer.get_parameter(path)
    except AttributeError as exc:
        raise IdentifiableError(
            f"the model has no parameter '{path}' ({exc}); its architecture spec does not match "
            "this model class (see docs/families.md, 'Adding an architecture')."
        ) from None
    if p.dim() != 3:
        raise IdentifiableError(
            f"parameter '{path}' has shape {tuple(p.shape)}, but weight layout 'heads' reads "
            "[d, H, d_v]; the spec does not match this model."
        )
    return p
