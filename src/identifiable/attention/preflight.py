"""Bytes the attention analyses allocate, known before they allocate anything.

Each analysis that holds n² numbers per head checks its formula with
`models.budget.check_analysis` (host memory, or the GPU's free memory for a CUDA trace)
before its first allocation, and refuses in one line naming `memory_budget=` (CLI
`--memory-budget`). The formulas count what the call holds at its peak, for n query rows,
n_k keys, H heads of width d_v (k = d_v + 1 columns with the ones vector), s bytes per
result entry; they are upper bounds of the same order as the measured peaks
(tests/attention/test_preflight.py compares them with torch's allocator):

    layer work    = 48·H·n_k·k + 16·256·n_k + 64 MiB       (bases and prefix coordinates
                    in float64, two row chunks of products, a window slab)
                    + 8·H·n·n_k where a layer may take the key-set route (float64 A_eff)
    effective     = s·L·H·n·n_k (the result, unless `out=` is given)
                    + 4·L·H·n·n_k (a copy of A, when layers or heads are chosen)
                    + 24·L·H·n (ranks and dims) + one layer's work
    iter_effective = s·H·n·n_k (one layer's A_eff) + one layer's work
    null_space    = 24·L·H·n + one layer's work without products
    interval_map  = 48·L·H·R·n_k (bounds and raw rows, solved and assembled)
                    + 8·R·n_k·(k + 2) per process (each row's basis)
    constrained   = 32·R·n_k + 8·R·n_k·(k + 2)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from identifiable.models.budget import check_analysis
from identifiable.models.trace import Trace

_ROW_CHUNK = 256  # causal.py's rows per chunk of products
_SLAB_BYTES = 64 * 2**20  # windows.py's temporaries per batch of blocks


def _width(trace: Trace) -> int:
    return trace.head_dim + 1


def _keysets_possible(trace: Trace) -> bool:
    """Whether a layer may take the key-set route (its A_eff is formed in float64): a key
    mask that is neither all keys, nor keys ≤ i, nor a causal window."""
    return trace.key_mask is not None and not trace.is_causal


def layer_work(trace: Trace, n_heads: int, *, products: bool = True) -> int:
    """One layer's temporaries (see the module docstring)."""
    n, n_k, k = trace.n_tokens, trace.n_keys, _width(trace)
    work = 48 * n_heads * n_k * k
    if products:
        work += 16 * _ROW_CHUNK * n_k + _SLAB_BYTES
        if _keysets_possible(trace):
            work += 8 * n_heads * n * n_k
    return work


def effective_bytes(
    trace: Trace,
    n_layers: int,
    n_heads: int,
    dtype: torch.dtype,
    *,
    out: bool,
    raw_copy: bool = False,
) -> int:
    """`effective_attention` (`out`: a fresh result; `raw_copy`: a selection's copy of A)
    or, with `n_layers` = 1 and `out` False, one layer of `iter_effective_attention`."""
    n, n_k = trace.n_tokens, trace.n_keys
    s = torch.finfo(dtype).bits // 8
    maps = n_layers * n_heads * n * n_k
    need = layer_work(trace, n_heads) + 24 * n_layers * n_heads * n
    need += s * maps if out else s * n_heads * n * n_k
    if raw_copy:
        need += trace.attentions.element_size() * maps
    return need


def null_space_bytes(trace: Trace, n_layers: int, n_heads: int) -> int:
    return 24 * n_layers * n_heads * trace.n_tokens + layer_work(trace, n_heads, products=False)


def interval_bytes(trace: Trace, n_layers: int, n_heads: int, rows: int, workers: int) -> int:
    n_k = trace.n_keys
    return 48 * n_layers * n_heads * rows * n_k + 8 * rows * n_k * (_width(trace) + 2) * max(
        1, workers
    )


def constrained_bytes(trace: Trace, rows: int) -> int:
    n_k = trace.n_keys
    return 32 * rows * n_k + 8 * rows * n_k * (_width(trace) + 2)


@dataclass(frozen=True)
class ScanBytes:
    """What a scan holds at its peak (`scan_bytes`)."""

    forward: int  # the forward pass of the longest text, where the model runs
    group: int  # one group of heads: maps, A_eff, route temporaries, statistics' chunks
    host: int  # kept maps (tables and result) and statistics, in host memory
    per_head: int  # one head's maps and A_eff

    @property
    def device(self) -> int:
        return self.forward + self.group

    def total(self, shared: bool) -> int:
        """Bytes in one memory: all of it where the device is host memory (`shared`)."""
        return self.device + self.host if shared else self.device


def scan_bytes(
    model: Any,
    n: int,
    layers: Sequence[int],
    heads: Sequence[int],
    dtype: torch.dtype,
    *,
    group: int,
    kept_maps: int,
) -> ScanBytes:
    """The scan's formula for texts of at most n tokens, `group` heads at a time and
    `kept_maps` kept map entries in all (Σ over texts of n_t² · kept heads):

        forward  = the forward part of `Model.memory_plan` (host, or `gpu_forward` on CUDA)
        per_head = (4 + s)·n²                       (A in float32, A_eff in s bytes)
        group    = g·per_head + 48·g·n·k + 64 MiB    (route work, as above)
                   + 8·4·2^22                        (row chunks: filling, products, statistics)
                   + 8·H·n·d_v                       (the layer's values)
        host     = 16·kept_maps + 64·T·L·H           (kept maps twice: rows and result)
    """
    s = torch.finfo(dtype).bits // 8
    info = model.info
    k = info.head_dim + 1
    per_head = (4 + s) * n * n
    work = 48 * group * n * k + _SLAB_BYTES + 32 * (1 << 22)
    forward = model.memory_plan(n, 1, list(heads), streaming=True).forward
    values = 8 * len(heads) * n * info.head_dim
    host = 16 * kept_maps + 64 * len(layers) * len(heads)
    return ScanBytes(forward, group * per_head + work + values, host, per_head)


def check_effective(need: int, memory_budget: int | None, device: torch.device) -> None:
    """`effective_attention`'s refusal (`effective_bytes` over the budget), in one line."""
    check_analysis(
        need,
        memory_budget,
        "effective_attention",
        device=device,
        python="choose fewer layers or heads (layers=, heads=), stream layers with "
        "iter_effective_attention, or scan per-head statistics with identifiable.scan",
        cli="shorten the text, or scan per-head statistics with identifiable scan",
    )


def check_intervals(
    trace: Trace, n_layers: int, n_heads: int, rows: int, processes: int, budget: int | None
) -> None:
    """`interval_map`'s refusal (`interval_bytes` over the budget), in one line."""
    check_analysis(
        interval_bytes(trace, n_layers, n_heads, rows, processes),
        budget,
        "interval_map",
        python="choose fewer layers, heads or rows (layers=, heads=, rows=)",
        cli="choose a layer, a head or a row (--layer, --head, --row) or raise --memory-budget",
    )
