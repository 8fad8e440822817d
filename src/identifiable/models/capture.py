"""The one `Trace` builder: a sink for `AttentionStack.tap` that turns one forward pass into
`Trace`s, for decoder-only, encoder-only and encoder–decoder models alike.

Memory: each layer's tensors are converted to float32 and moved to the CPU as the model
makes them, straight into the traces' own tensors, which are allocated before the
forward pass (their size is known from the stack and the inputs). The model is not
asked for `output_attentions`, so no tuple of every layer's maps, no stacked copy and no
float32 copy of all of them is ever held: at any time the model holds one layer's maps
(in its own dtype, on its own device) besides the result.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from identifiable.errors import IdentifiableError
from identifiable.models import keyselect
from identifiable.models.backends import running
from identifiable.models.encoding import Encoding, InputEncoder
from identifiable.models.hooks import HookSet
from identifiable.models.recompute import AttentionCall, fill_maps
from identifiable.models.stack import TAPS, AttentionStack, Captured, Tap
from identifiable.models.trace import Trace


@dataclass(frozen=True)
class TraceMeta:
    """What each trace says about the model it came from."""

    model_name: str
    architecture: str
    special_tokens: dict[str, str] = field(default_factory=dict)
    dequantized_from: str = ""  # ModelInfo.dequantized_from


class TraceBuilder:
    """The traces of one forward pass of a batch through one stack, for chosen layers.

    Args:
        stack: the attention kind captured.
        rows: the sequences, one `Encoding` each (their query tokens).
        keys: cross-attention: the encoder's sequences (the keys); None: `rows`.
        layers: the contiguous range of layers kept (default all): a trace of layers
            a..b−1 holds hidden states [input of a, output of a, …, output of b−1].
        hidden: capture hidden states (False for cross-attention, which shares the
            decoder's: pass them to `traces`).
        heads: the query heads kept (default all), checked by the caller. A trace of chosen
            heads holds their maps, values and W_O rows only; its `attn_outputs` are
            their share of the block output, Σ_{h ∈ heads} O_h W_O^h + b_O, from each
            head's own output O_h as the model computed it (the output projection's input),
            so `verify()` proves the chosen heads.
    Use as the sink of `stack.tap(hooks, builder, builder.taps, map_shape=builder.map_shape)`,
    run the model, then call `traces`.
    """

    def __init__(
        self,
        stack: AttentionStack,
        rows: Sequence[Encoding],
        keys: Sequence[Encoding] | None = None,
        *,
        layers: range | None = None,
        hidden: bool = True,
        heads: Sequence[int] | None = None,
    ) -> None:
        self.stack, self.rows, self.keys = stack, list(rows), list(keys or rows)
        self.cross = keys is not None
        self.layers = range(stack.n_layers) if layers is None else layers
        self.heads = (
            None if heads is None or list(heads) == list(range(stack.n_heads)) else list(heads)
        )
        block: Tap = "block" if self.heads is None else "head_outputs"
        self.taps: tuple[Tap, ...] = (
            tuple(block if t == "block" else t for t in TAPS) if hidden else ("e", "maps", block)
        ) + (("keys",) if stack.spec.key_selector is not None else ())
        self.map_shape = (max(len(r) for r in self.rows), max(len(k) for k in self.keys))
        n_l, d_v, d = len(self.layers), stack.head_dim, stack.hidden_size
        n_h = stack.n_heads if self.heads is None else len(self.heads)
        sizes = [(len(r), len(k)) for r, k in zip(self.rows, self.keys, strict=True)]
        self.attentions = [torch.empty(n_l, n_h, n, k) for n, k in sizes]
        self.values = [torch.empty(n_l, n_h, k, d_v) for _, k in sizes]
        self.attn_outputs = [torch.empty(n_l, n, d) for n, _ in sizes]
        self.hidden_states = [torch.empty(n_l + 1, n, d) for n, _ in sizes] if hidden else None
        self._kept = slice(self.layers.start, self.layers.stop)
        self.masks = [stack.key_mask(n, k if self.cross else None)[self._kept] for n, k in sizes]
        self.calls: dict[Tap, int] = dict.fromkeys((t for t in self.taps if t != "keys"), 0)
        self.capture_dtype: torch.dtype | None = None
        # the last key selection of a sparse-attention indexer `[B, n, k]` (models/keyselect.py)
        self.selected: torch.Tensor | None = None

    def __call__(self, tap: Tap, layer: int, x: Captured) -> None:
        """Receive one layer's tensor (batch-first) from a tap; keep it if it is ours."""
        if tap == "keys":  # every layer's: a later layer may reuse it
            assert isinstance(x, torch.Tensor)
            self.selected = x
            return
        if layer >= self.stack.n_layers:
            self.calls[tap] += 1  # more runs than the spec has layers: refused by `check`
            return
        if layer not in self.layers or (tap == "input" and layer != self.layers.start):
            return
        self.calls[tap] += 1
        i = layer - self.layers.start
        if tap == "maps":
            # recomputed maps of a head-independent mask share one pattern: one head checked
            one = isinstance(x, AttentionCall) and x.shared_mask
            for b, (n, k) in enumerate(self._sizes()):
                fill_maps(x, b, self.heads, n, k, self.attentions[b][i])
                if "keys" in self.taps:  # the model read only the keys its indexer picked
                    self.masks[b][i] &= keyselect.picked(self.selected, b, n, k, layer)
                self.stack.check_key_mask(
                    self.attentions[b][i : i + 1, :1] if one else self.attentions[b][i : i + 1],
                    self.masks[b][i : i + 1],
                    layer,
                )
            return
        assert isinstance(x, torch.Tensor)
        if tap == "input":
            self._rows_into(self.hidden_states, 0, x)
        elif tap == "output":
            self._rows_into(self.hidden_states, i + 1, x)
        elif tap == "block":
            self._rows_into(self.attn_outputs, i, x)
        elif tap == "head_outputs":
            self._share(layer, i, x)
        elif tap == "e":
            self._values(layer, i, x)

    def _sizes(self) -> list[tuple[int, int]]:
        return [(len(r), len(k)) for r, k in zip(self.rows, self.keys, strict=True)]

    def _rows_into(self, into: list[torch.Tensor] | None, i: int, x: torch.Tensor) -> None:
        assert into is not None
        for b, (n, _) in enumerate(self._sizes()):
            into[b][i].copy_(x[b, :n])

    def _values(self, layer: int, i: int, e: torch.Tensor) -> None:
        if e.shape[1] != self.map_shape[1]:
            raise IdentifiableError(
                f"{self.stack.prefix}the value projection read {e.shape[1]} vectors but the "
                f"attention has {self.map_shape[1]} keys; the spec '{self.stack.spec.name}' "
                "reads E from the wrong module."
            )
        if self.capture_dtype is None:
            self.capture_dtype = e.dtype
        v = self.stack.values(layer, e, self.heads)  # [B, H or len(heads), n_k, d_v]
        for b, (_, k) in enumerate(self._sizes()):
            self.values[b][i].copy_(v[b, :, :k])

    def _share(self, layer: int, i: int, x: torch.Tensor) -> None:
        """The chosen heads' share of the block output, from their own outputs `x` `[B, n, H·d_v]`."""
        assert self.heads is not None
        w = self.stack.weights[layer]
        h, d_v = self.stack.n_heads, self.stack.head_dim
        w_o = w.w_o.reshape(h, d_v, -1)[self.heads].float()
        for b, (n, _) in enumerate(self._sizes()):
            o = x[b, :n].reshape(n, h, d_v)[:, self.heads].float()
            share = torch.einsum("nhv,hvd->nd", o, w_o.to(o.device)) + w.b_o.float().to(o.device)
            self.attn_outputs[b][i].copy_(share)

    def check(self) -> None:
        """Every kept layer captured once by every tap, or one line naming the spec."""
        self.stack.check_calls(self.calls, len(self.layers))

    def traces(
        self, meta: TraceMeta, *, hidden_states: Sequence[torch.Tensor] | None = None
    ) -> list[Trace]:
        """The batch's traces, in input order (`hidden_states`: cross-attention only)."""
        self.check()
        hidden = self.hidden_states if hidden_states is None else list(hidden_states)
        assert hidden is not None
        full = len(self.layers) == self.stack.n_layers
        # the full W_O is the stack's shared tensor (its identity keys attention's caches)
        kept = slice(None) if full else self._kept
        out_proj = self.stack.out_proj() if full else self.stack.out_proj()[kept]
        value_bias, out_bias = self.stack.value_bias()[kept], self.stack.out_bias()[kept]
        kv_head_of = self.stack.kv_head_of
        if self.heads is not None:
            out_proj, value_bias = out_proj[:, self.heads], value_bias[:, self.heads]
            kv_head_of = kv_head_of[self.heads]
        return [
            Trace(
                tokens=list(rows.tokens),
                input_ids=rows.input_ids.clone(),
                attentions=self.attentions[b],
                values=self.values[b],
                value_bias=value_bias,
                out_proj=out_proj,
                out_bias=out_bias,
                hidden_states=hidden[b],
                attn_outputs=self.attn_outputs[b],
                is_causal=self.stack.spec.causal,
                kv_head_of=kv_head_of.clone(),
                special_tokens=dict(meta.special_tokens),
                model_name=meta.model_name,
                architecture=meta.architecture,
                dequantized_from=meta.dequantized_from,
                truncated=rows.n_dropped,
                key_mask=self.masks[b],
                capture_dtype=str(self.capture_dtype or torch.float32).removeprefix("torch."),
                key_tokens=list(self.keys[b].tokens) if self.cross else None,
                key_input_ids=self.keys[b].input_ids.clone() if self.cross else None,
                layers=None
                if full and not self.stack.others
                else self.stack.model_layers(self.layers),
                heads=None if self.heads is None else list(self.heads),
            )
            for b, rows in enumerate(self.rows)
        ]


class _Done(Exception):
    """Ends a forward pass after the last layer a trace keeps."""


def trace_batch(
    hf_model: nn.Module,
    stack: AttentionStack,
    inputs: InputEncoder,
    encs: Sequence[Encoding],
    meta: TraceMeta,
    *,
    layers: range | None = None,
    heads: Sequence[int] | None = None,
    attention: str = "eager",
) -> list[Trace]:
    """One forward pass of a batch (padded to the longest), captured as one `Trace` each,
    under attention implementation `attention` (maps recomputed unless "eager"); the pass
    ends after the last of `layers`."""
    builder = TraceBuilder(stack, encs, layers=layers, heads=heads)
    last = builder.layers.stop - 1

    def sink(tap: Tap, layer: int, x: Captured) -> None:
        builder(tap, layer, x)
        if tap == "output" and layer == last and last + 1 < stack.n_layers:
            raise _Done

    with running(hf_model, attention), HookSet() as hooks, torch.no_grad():
        stack.tap(
            hooks, sink, builder.taps, map_shape=builder.map_shape, recompute=attention != "eager"
        )
        with contextlib.suppress(_Done):
            hf_model(**inputs.batch(encs, hf_model))
    return builder.traces(meta)
