"""Layer streaming: one layer's `Trace` at a time, during a single forward pass.

The forward pass runs in a worker thread that hands over each layer's trace as soon as
the layer has run, and then waits until the caller asks for the next one, so that at
most one layer's n×n maps (two while the next is being built) are alive. The caller may
stop early (break): the worker's next layer then ends the forward pass.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from identifiable.models.capture import TraceBuilder, TraceMeta
from identifiable.models.encoding import Encoding
from identifiable.models.hooks import HookSet
from identifiable.models.stack import AttentionStack, Captured, Tap
from identifiable.models.trace import Trace


class _StopForward(Exception):
    """Raised inside the forward pass to end it once the caller stopped asking."""


def stream_layers(
    stack: AttentionStack,
    enc: Encoding,
    forward: Callable[[], Any],
    meta: TraceMeta,
    *,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    recompute: bool = False,
) -> Iterator[tuple[int, Trace]]:
    """Yield `(layer, one-layer trace)` while `forward()` runs the model on `enc`, for
    `layers` (default all; in the model's order) and `heads` (default all), checked by the
    caller. The pass ends after the last chosen layer."""
    chosen = sorted(range(stack.n_layers) if layers is None else layers)
    box: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def worker() -> None:
        try:
            with torch.no_grad():
                _run(stack, enc, forward, meta, box, stop, chosen, heads, recompute)
            box.put(("done", None))
        except _StopForward:
            box.put(("done", None))
        except BaseException as exc:  # handed to the caller's thread
            box.put(("error", exc))

    thread = threading.Thread(target=worker, name="identifiable-iter-layers", daemon=True)
    thread.start()
    try:
        while True:
            kind, item = box.get()
            if kind == "done":
                break
            if kind == "error":
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a worker waiting to hand over a layer
            with contextlib.suppress(queue.Empty):
                box.get(timeout=0.05)
        thread.join()


def _run(
    stack: AttentionStack,
    enc: Encoding,
    forward: Callable[[], Any],
    meta: TraceMeta,
    box: queue.Queue[tuple[str, Any]],
    stop: threading.Event,
    chosen: list[int],
    heads: list[int] | None,
    recompute: bool,
) -> None:
    """The forward pass, with one `TraceBuilder` per chosen layer, each handed over when
    complete; the pass is ended after the last one."""
    todo = list(chosen)

    def builder_for(layer: int) -> TraceBuilder:
        return TraceBuilder(stack, [enc], layers=range(layer, layer + 1), heads=heads)

    current = [builder_for(todo.pop(0))]

    def sink(tap: Tap, layer: int, x: Captured) -> None:
        if tap == "input" and stop.is_set():
            raise _StopForward
        builder = current[0]
        builder(tap, layer, x)
        if tap == "output" and layer == builder.layers.start:
            box.put(("layer", (layer, builder.traces(meta)[0])))
            if todo:
                current[0] = builder_for(todo.pop(0))
                current[0].selected = builder.selected  # a later layer may reuse it
            elif layer + 1 < stack.n_layers:
                raise _StopForward  # nothing after the last chosen layer is needed

    with HookSet() as hooks:
        taps = current[0].taps
        stack.tap(hooks, sink, taps, map_shape=(len(enc), len(enc)), recompute=recompute)
        forward()
    current[0].check()  # the last layer ran, and no layer ran more often than the spec says
