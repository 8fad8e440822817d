"""One layer at a time on the device the layer runs on, maps filled per group of heads on
demand: the capture behind `identifiable.scan`.

A forward pass of one sequence is tapped as `Model.trace` taps it (`AttentionStack.tap`:
E, the maps or what the attention function received, the layer's output), but nothing
goes to host memory. At the end of each chosen layer (its "output" tap) the consumer gets
a `LayerView` on the layer's own device: `LayerView.trace(slots)` fills the maps of those
heads (`AttentionCall.fill` from the query and key, or a copy of eager's own
probabilities) into a buffer on that device and wraps them, with the heads' values and
W_O rows, as a one-layer `Trace` that every analysis takes. The forward pass waits while
the consumer runs (inside the hook), so at most the consumer's group of maps exists
besides the forward's own tensors, and the pass ends after the last chosen layer.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from identifiable.errors import IdentifiableError
from identifiable.models.backends import running
from identifiable.models.capture import TraceMeta
from identifiable.models.encoding import Encoding, InputEncoder
from identifiable.models.hooks import HookSet
from identifiable.models.keyselect import picked
from identifiable.models.recompute import AttentionCall, fill_maps
from identifiable.models.stack import AttentionStack, Captured, Tap
from identifiable.models.trace import Trace

_TAPS: tuple[Tap, ...] = ("e", "maps", "output")
# scores per row chunk while maps are filled: 2× `Model.trace`'s, so that a scan runs
# fewer, larger kernels (on a shared CPU each costs a wait on the other thread), while a
# causal map's chunks still skip most keys after their last row
FILL_CHUNK = 1 << 21


class _Done(Exception):
    """Ends the forward pass after the last chosen layer."""


class LayerWeights:
    """Each layer's W_O rows of the chosen heads on the layer's device, in the dtype the
    traces hold (float32, float64 for a float64 model). Where those rows are a view of the
    weight (every head of a float32 or float64 model) every layer's is kept for the whole
    scan; a converted copy (a half-precision model, a subset of heads) is kept for the
    last layer asked for only, since one per layer would hold a float32 W_O for the whole
    model on its device (2 GiB at 32 layers of width 4,096). The scanner caches its W_O
    factors by layer, not by this tensor."""

    def __init__(self, stack: AttentionStack, heads: Sequence[int]) -> None:
        self.stack, self.heads = stack, list(heads)
        self._out: dict[int, torch.Tensor] = {}
        self._copy: tuple[int, torch.Tensor] | None = None

    def out_proj(self, layer: int) -> torch.Tensor:
        """`[1, H_sel, d_v, d]` W_O rows of the chosen heads of `layer`."""
        if layer in self._out:
            return self._out[layer]
        if self._copy is not None and self._copy[0] == layer:
            return self._copy[1]
        self._copy = None  # the previous layer's copy goes before this one is made
        w = self.stack.weights[layer].w_o
        h, d_v = self.stack.n_heads, self.stack.head_dim
        work = torch.float64 if w.dtype == torch.float64 else torch.float32
        rows = w.reshape(h, d_v, -1)
        if self.heads != list(range(h)):
            rows = rows[self.heads]
        out = rows.to(work)[None]
        if out.data_ptr() == w.data_ptr():
            self._out[layer] = out
        else:
            self._copy = (layer, out)
        return out


@dataclass
class LayerView:
    """One chosen layer of one sequence, on the device it ran on.

    Attributes:
        layer: the model's layer index.
        heads: the model's indices of the chosen heads (slots 0..H_sel−1 below).
        values: `[H_sel, n, d_v]` E·W_V of the chosen heads (float32, float64 models:
            float64), on the layer's device.
        out_proj: `[1, H_sel, d_v, d]` their W_O rows (`LayerWeights`).
        source: the maps as the tap gave them (`AttentionCall` or eager's `[1, H, n, n]`).
        window: the layer's attention window (None: every key its row may see).
        causal: whether rows see keys ≤ i only.
        kv_head_of: `[H_sel]` the key/value head each chosen head reads.
        selected: `[n, n]` bool, the keys a sparse-attention indexer kept for each row
            (models/keyselect.py), None: no selection.
    """

    layer: int
    heads: list[int]
    values: torch.Tensor
    out_proj: torch.Tensor
    source: Captured
    window: int | None
    causal: bool
    kv_head_of: torch.Tensor
    enc: Encoding
    meta: TraceMeta
    stack: AttentionStack
    selected: torch.Tensor | None = None

    @property
    def n(self) -> int:
        return len(self.enc)

    @property
    def device(self) -> torch.device:
        return self.values.device

    def key_mask(self) -> torch.Tensor | None:
        """`[n, n]` bool on the device for a layer with a window or a key selection, else
        None (the trace's `is_causal` then says keys ≤ i or every key)."""
        if self.window is None and self.selected is None:
            return None
        n, w = self.n, self.window
        i = torch.arange(n, device=self.device)[:, None]
        j = torch.arange(n, device=self.device)[None, :]
        if w is None:
            mask = j <= i if self.causal else torch.ones(n, n, dtype=torch.bool, device=i.device)
        else:
            mask = ((j <= i) & (i - j < w)) if self.causal else (i - j).abs() <= w
        return mask if self.selected is None else mask & self.selected.to(mask.device)

    def maps(self, slots: Sequence[int], out: torch.Tensor | None = None) -> torch.Tensor:
        """`[len(slots), n, n]` attention of those chosen heads, on the device, in the
        traces' dtype (eager maps checked to be 0 outside the layer's key mask), written
        into `out` where given (a buffer the consumer reuses for its groups)."""
        n = self.n
        if out is None:
            out = torch.empty(len(slots), n, n, dtype=self.values.dtype, device=self.device)
        fill_maps(self.source, 0, [self.heads[s] for s in slots], n, n, out, FILL_CHUNK)
        if not isinstance(self.source, AttentionCall):  # recomputed maps are masked by build
            mask = self.key_mask()
            if mask is None and self.causal:
                mask = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
            if mask is not None:
                self.stack.check_key_mask(out[None], mask[None], self.layer)
        return out

    def trace(self, slots: Sequence[int], out: torch.Tensor | None = None) -> Trace:
        """A one-layer `Trace` of the chosen heads `slots` on the device (maps filled now,
        into `out` where given; no hidden states or block output, so `verify()` does not
        apply)."""
        slots = list(slots)
        attn = self.maps(slots, out)[None]
        d_v, d = self.out_proj.shape[-2:]
        dev, dtype = self.device, self.values.dtype
        mask = self.key_mask()
        return Trace(
            tokens=list(self.enc.tokens),
            input_ids=self.enc.input_ids,
            attentions=attn,
            values=self.values[slots][None],
            value_bias=torch.zeros(1, len(slots), d_v, dtype=dtype, device=dev),
            out_proj=self.out_proj[:, slots] if len(slots) < len(self.heads) else self.out_proj,
            out_bias=torch.zeros(1, d, dtype=dtype, device=dev),
            hidden_states=torch.zeros(2, 0, d, dtype=dtype, device=dev),
            attn_outputs=torch.zeros(1, 0, d, dtype=dtype, device=dev),
            is_causal=self.causal,
            kv_head_of=self.kv_head_of[slots],
            model_name=self.meta.model_name,
            architecture=self.meta.architecture,
            truncated=self.enc.n_dropped,
            key_mask=None if mask is None else mask[None],
            layers=[self.layer],
            heads=[self.heads[s] for s in slots],
        )


def scan_layers(
    hf_model: torch.nn.Module,
    stack: AttentionStack,
    inputs: InputEncoder,
    enc: Encoding,
    meta: TraceMeta,
    consumer: Callable[[LayerView], None],
    *,
    layers: Sequence[int],
    weights: LayerWeights,
    forward: Callable[[dict[str, torch.Tensor]], object],
    recompute: bool = True,
) -> None:
    """Run `forward(model inputs)` on `enc` and hand `consumer` a `LayerView` of each of
    `layers` (sorted, checked by the caller) as soon as the layer has run; the pass ends
    after the last one. The heads are `weights.heads`; `recompute`: maps from what the
    attention function received (sdpa, flash), else from the attention modules' output. Raises one line naming the spec
    when a chosen layer was not captured once by every tap."""
    chosen = sorted(layers)
    last = chosen[-1]
    calls = {tap: dict.fromkeys(chosen, 0) for tap in _TAPS}
    values: dict[int, torch.Tensor] = {}
    sources: dict[int, Captured] = {}
    kv = stack.kv_head_of[weights.heads]
    # all heads: E·W_V once per key/value head, repeated for its query heads
    every = None if weights.heads == list(range(stack.n_heads)) else weights.heads

    def sink(tap: Tap, layer: int, x: Captured) -> None:
        if tap == "keys":  # every layer's: a later layer may reuse it
            selection[0] = x
            return
        if layer not in calls[tap]:
            return
        calls[tap][layer] += 1
        if tap == "e":
            assert isinstance(x, torch.Tensor)
            v = stack.values(layer, x, every)[0]  # [H_sel, n, d_v]
            values[layer] = v.double() if x.dtype == torch.float64 else v.float()
        elif tap == "maps":
            sources[layer] = x
        elif layer in values and layer in sources:
            v = values.pop(layer)
            view = LayerView(
                layer,
                weights.heads,
                v,
                weights.out_proj(layer),
                sources.pop(layer),
                stack.windows[layer],
                stack.spec.causal,
                kv.to(v.device),
                enc,
                meta,
                stack,
                None
                if taps == _TAPS
                else picked(selection[0], 0, len(enc), len(enc), layer).to(v.device),
            )
            consumer(view)
            del view
            if layer == last and last + 1 < stack.n_layers:
                raise _Done

    taps = _TAPS + (("keys",) if stack.spec.key_selector is not None else ())
    selection: list[Any] = [None]  # the last key selection `[1, n, k]` (sparse attention)
    with HookSet() as hooks, torch.no_grad():
        stack.tap(hooks, sink, taps, map_shape=(len(enc), len(enc)), recompute=recompute)
        with contextlib.suppress(_Done):
            forward(inputs.batch([enc], hf_model))
    missing = [layer for layer in chosen if any(calls[t][layer] != 1 for t in _TAPS)]
    if missing:
        layer = missing[0]
        raise IdentifiableError(
            f"{stack.prefix}layer {layer}: the value projection ran {calls['e'][layer]} times, "
            f"the attention {calls['maps'][layer]} and the layer {calls['output'][layer]} "
            f"(expected once each); the spec '{stack.spec.name}' does not match this model "
            "(see README 'Adding an architecture')"
        )


def scan_model(
    model: Any,
    enc: Encoding,
    consumer: Callable[[LayerView], None],
    *,
    layers: Sequence[int],
    weights: LayerWeights,
) -> None:
    """`scan_layers` of an `identifiable.models.Model` under the attention implementation it
    traces with (`Model.attention`: maps recomputed from Q and K unless eager)."""
    impl = model.attention

    takes = inspect.signature(model.hf_model.forward).parameters
    cache = {"use_cache": False} if "use_cache" in takes else {}

    def forward(batch: dict[str, torch.Tensor]) -> object:
        with running(model.hf_model, impl):  # no key/value cache: every layer's would be kept
            return model.hf_model(**batch, **cache)

    scan_layers(
        model.hf_model,
        model.stack,
        model.inputs,
        enc,
        model.meta,
        consumer,
        layers=layers,
        weights=weights,
        forward=forward,
        recompute=impl != "eager",
    )
