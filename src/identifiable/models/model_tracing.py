"""A `Model`'s tracing: one sequence (`trace`), many in padded batches (`trace_many`), one
layer at a time during a single forward pass (`iter_layers`), and the key mask each trace
is checked against. Every trace is refused before its forward pass when it would exceed
its memory budget (`model_memory`); models/capture.py turns the taps into `Trace`s and
models/streaming.py streams the layers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from identifiable.errors import IdentifiableError
from identifiable.models import backends
from identifiable.models.capture import trace_batch
from identifiable.models.encoding import Encoding, ModelInput, many_items, with_progress
from identifiable.models.model_inputs import ModelInputs
from identifiable.models.model_memory import MemoryPlanning
from identifiable.models.selection import Selection, indices, layer_range
from identifiable.models.streaming import stream_layers
from identifiable.models.trace import Trace


class Tracing(MemoryPlanning, ModelInputs):
    """`trace`, `trace_many`, `iter_layers` and `key_mask` of `Model`."""

    def trace(
        self,
        text: ModelInput,
        *,
        truncate: bool = True,
        layers: Sequence[int] | None = None,
        heads: Sequence[int] | None = None,
        memory_budget: int | None = None,
    ) -> Trace:
        """One forward pass of one sequence, captured as a `Trace` (no padding).

        `text` is a text, a pair `(a, b)` (a tuple), token ids (list[int] or a
        1-D integer tensor, used as given) or a tokenizer's `BatchEncoding` of one
        sequence (padding positions dropped). A list of texts is refused: use a
        tuple for a pair and `trace_many` for many texts.

        `layers`: consecutive layers to keep (default all; the pass stops after the
        last); `heads`: query heads to keep (default all). Nothing outside the
        selection is kept, and under recomputed attention (`Model.attention` not
        "eager") no map outside it is ever computed. `trace.layers` / `trace.heads`
        give the model's indices. `memory_budget`: bytes the trace may use (default:
        the memory available now); a trace whose formula (docs/families.md, 'Memory and streaming',
        models/budget.py) exceeds it is refused before the forward pass; on a GPU its
        forward part is checked against the GPU's free memory, and the budget bounds the
        result (host memory)."""
        chosen = layer_range(self.stack.requested(layers), self.stack.n_layers)
        kept = indices(heads, self.stack.n_heads, "heads")
        enc = self.inputs.encode_any(text, truncate)
        self.check_memory(len(enc), len(chosen), kept, memory_budget, "this trace")
        return self._trace_batch([enc], layers=chosen, heads=kept)[0]

    def trace_many(
        self,
        texts: Iterable[ModelInput] | Any,
        *,
        batch_size: int = 8,
        truncate: bool = True,
        progress: bool | None = None,
        column: str | None = None,
        pair_columns: tuple[str, str] | None = None,
        layers: Sequence[int] | None = None,
        heads: Sequence[int] | None = None,
        memory_budget: int | None = None,
    ) -> Iterator[Trace]:
        """Stream Traces in input order, batching with padding internally.

        `texts` is an iterable of anything `trace` accepts, a `BatchEncoding` of
        a batch, or a `datasets.Dataset` with `column=` (one text per row) or
        `pair_columns=(a, b)` (a pair per row); a Dataset with a single text
        column needs neither.

        `progress`: a bar of the texts traced (None: when a person is watching).
        Each result equals `trace(text)` up to float rounding (tested). Within a
        window of a few batches texts are sorted by length, so padding stays small.
        `layers`, `heads` and `memory_budget` as for `trace`; the budget is checked
        before each batch's forward pass, for the batch padded to its longest text.
        """
        if batch_size < 1:
            raise IdentifiableError(f"batch_size must be ≥ 1, got {batch_size}")
        chosen = layer_range(self.stack.requested(layers), self.stack.n_layers)
        kept = indices(heads, self.stack.n_heads, "heads")
        if memory_budget is not None:  # a bad value is refused before any text is read
            self.check_memory(1, len(chosen), kept, memory_budget, "trace_many")
        items = many_items(texts, column, pair_columns)
        window = batch_size * 4
        buf: list[Encoding] = []
        select = Selection(chosen, kept, memory_budget)
        for text in with_progress(items, progress):
            buf.append(self.inputs.encode_any(text, truncate))
            if len(buf) == window:
                yield from self._trace_window(buf, batch_size, select)
                buf = []
        if buf:
            yield from self._trace_window(buf, batch_size, select)

    def _trace_window(
        self, encs: Sequence[Encoding], batch_size: int, select: Selection
    ) -> Iterator[Trace]:
        order = sorted(range(len(encs)), key=lambda i: len(encs[i]))
        out: dict[int, Trace] = {}
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            batch = [encs[i] for i in idx]
            n = max(len(e) for e in batch)
            self.check_memory(
                n,
                len(select.layers),
                select.heads,
                select.memory_budget,
                "trace_many",
                batch=len(batch),
            )
            traces = self._trace_batch(batch, layers=select.layers, heads=select.heads)
            for i, tr in zip(idx, traces, strict=True):
                out[i] = tr
        for i in range(len(encs)):
            yield out.pop(i)

    def _trace_batch(
        self,
        encs: Sequence[Encoding],
        *,
        layers: range | None = None,
        heads: Sequence[int] | None = None,
    ) -> list[Trace]:
        return trace_batch(
            self.hf_model,
            self.stack,
            self.inputs,
            encs,
            self.meta,
            layers=layers,
            heads=heads,
            attention=self.attention,
        )

    def key_mask(self, n: int) -> torch.Tensor:
        """`[L, n, n]` bool: which keys each query row of each layer may attend to.

        Derived from the spec and the model's config, not from the attention
        weights: all keys (encoders), keys ≤ i (decoders), narrowed to a window
        on sliding-window/local layers (`windows`: i − j < w for decoders,
        |i − j| ≤ w for encoders, as Hugging Face builds these masks). Each
        trace checks that its attention is exactly 0 outside this mask.
        """
        return self.stack.key_mask(n)

    def iter_layers(
        self,
        text: ModelInput,
        *,
        truncate: bool = True,
        layers: Sequence[int] | None = None,
        heads: Sequence[int] | None = None,
        memory_budget: int | None = None,
    ) -> Iterator[tuple[int, Trace]]:
        """Yield `(layer, trace)` one layer at a time, during a single forward pass.

        Each `trace` is a one-layer `Trace` of that layer (attentions `[1, H, n, n]`,
        hidden_states `[2, n, d]`: the layer's input and output) that verifies and
        feeds every analysis on its own. The forward pass runs in a worker thread
        that waits after each layer until the caller asks for the next, so at most
        one layer's n×n maps (two while the next is being built) are alive instead
        of all L: for a 7B model (32 layers of 32 heads) at n = 4096 that is 2.1 GB
        per layer in float32 instead of 69 GB. Stopping early (break) ends the
        forward pass.

        `layers` (any, yielded in the model's order; the pass ends after the last),
        `heads` and `memory_budget` as for `trace` (the budget is checked before the
        pass, from the streaming formula of docs/families.md, 'Memory and streaming').
        """
        chosen = self.stack.requested(layers)
        kept = indices(heads, self.stack.n_heads, "heads")
        enc = self.inputs.encode_any(text, truncate)
        self.check_memory(len(enc), 1, kept, memory_budget, "iter_layers", streaming=True)
        impl = self.attention

        def forward() -> Any:
            with backends.running(self.hf_model, impl):
                return self.hf_model(**self.batch_inputs([enc]))

        return stream_layers(
            self.stack,
            enc,
            forward,
            self.meta,
            layers=chosen,
            heads=kept,
            recompute=impl != "eager",
        )
