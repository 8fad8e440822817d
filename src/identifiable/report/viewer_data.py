"""Compact encoding of attention matrices for the offline viewer page.

Size rule (why the page stays small): a 12-layer, 12-head model at 512 tokens
has 144 · 512² ≈ 38 M attention weights per kind, so no lossless or per-entry
float encoding of all heads fits in 10 MB. The viewer therefore stores

* for every head: its null-space dimension (the L×H overview grid);
* for as many heads as fit `max_bytes` (the requested head and its layer first,
  then the other layers outward from it): raw A and effective A_eff, each
  quantised to uint8 with its own offset and step (A_eff can be negative),
  zlib-compressed and base64-encoded. Null attention is shown as A − A_eff.
  Quantisation error is at most half a step, shown next to every hovered value;
* for every other head, a preview: the same encoding of f×f block means
  (at most 64×64 blocks), so every head can still be looked at, coarsely;
* attention intervals and a witness for a bounded set of query rows of the
  requested head (`IntervalRow`); any other row says so in the page.

The encoding is pure numpy on tensors given to it; nothing here knows about models.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

# Bytes reserved for everything that is not a head matrix (tokens, scripts, styles, intervals).
_OVERHEAD_RESERVE = 600_000
# Heads that do not fit at full resolution are shown as block means of at most this many cells a side.
PREVIEW_SIZE = 64


@dataclass(frozen=True)
class IntervalRow:
    """Certificates for one query row of one head.

    weights: `[n_keys]` the model's attention row a; lo, hi: `[n_keys]` min/max weight
    each key can take among valid distributions that give the same head output;
    witness: `[n_keys]` one such distribution, or None when none exists (`note` says why).
    Keys a causal row cannot see hold 0 everywhere.
    """

    layer: int
    head: int
    row: int
    weights: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    witness: np.ndarray | None
    note: str = ""


def quantise(x: np.ndarray) -> tuple[np.ndarray, float, float]:
    """uint8 codes, offset and step with x ≈ offset + code·step (error ≤ step/2).

    x: any shape, float. A constant array gets step 0 (codes all 0).
    """
    x = np.asarray(x, dtype=np.float64)
    lo, hi = float(x.min()), float(x.max())
    step = (hi - lo) / 255.0
    if step <= 0.0:
        return np.zeros(x.shape, dtype=np.uint8), lo, 0.0
    codes = np.clip(np.rint((x - lo) / step), 0, 255).astype(np.uint8)
    return codes, lo, step


def dequantise(codes: np.ndarray, offset: float, step: float) -> np.ndarray:
    return offset + codes.astype(np.float64) * step


def block_means(x: np.ndarray, f: int, causal: bool) -> np.ndarray:
    """`[m, m]` means of f×f blocks of `x` `[n, n]`, m = ceil(n / f); causal-masked entries
    (key after query) are left out of the means, and blocks that are all masked hold 0."""
    n = x.shape[0]
    m = -(-n // f)
    padded = np.full((m * f, m * f), np.nan)
    padded[:n, :n] = x
    if causal:
        padded[np.triu_indices(m * f, 1)] = np.nan
    blocks = padded.reshape(m, f, m, f)
    counts = (~np.isnan(blocks)).sum(axis=(1, 3))
    sums = np.nansum(blocks, axis=(1, 3))
    return np.where(counts > 0, sums / np.maximum(counts, 1), 0.0)


def encode_head(
    raw: torch.Tensor, effective: torch.Tensor, *, block: int = 1, causal: bool = False
) -> dict[str, object]:
    """One head's matrices as a JSON-ready dict.

    raw, effective: `[n, n]`. With block = f > 1 they are first reduced to f×f block means
    (a preview, `[m, m]` with m = ceil(n / f)). The blob is zlib(uint8 raw codes ‖ uint8
    effective codes), row-major, base64; `raw`/`eff` hold [offset, step] for each half.
    """
    r = raw.detach().double().cpu().numpy()
    e = effective.detach().double().cpu().numpy()
    if block > 1:
        r, e = block_means(r, block, causal), block_means(e, block, causal)
    r_codes, r_off, r_step = quantise(r)
    e_codes, e_off, e_step = quantise(e)
    payload = zlib.compress(r_codes.tobytes() + e_codes.tobytes(), 9)
    return {
        "f": block,
        "raw": [r_off, r_step],
        "eff": [e_off, e_step],
        "blob": base64.b64encode(payload).decode("ascii"),
    }


def decode_head(entry: dict[str, object], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of `encode_head` (what the page's script does), for tests: (raw, effective) `[m, m]`."""
    m = -(-n // int(entry["f"]))  # type: ignore[call-overload]
    data = np.frombuffer(zlib.decompress(base64.b64decode(str(entry["blob"]))), dtype=np.uint8)
    r_off, r_step = entry["raw"]  # type: ignore[misc]
    e_off, e_step = entry["eff"]  # type: ignore[misc]
    raw = dequantise(data[: m * m].reshape(m, m), r_off, r_step)
    eff = dequantise(data[m * m :].reshape(m, m), e_off, e_step)
    return raw, eff


def head_order(n_layers: int, n_heads: int, layer: int, head: int) -> list[tuple[int, int]]:
    """Embedding priority: the chosen head, the rest of its layer, then layers outward."""
    order = [(layer, head)] + [(layer, k) for k in range(n_heads) if k != head]
    for dist in range(1, n_layers):
        for lay in (layer - dist, layer + dist):
            if 0 <= lay < n_layers:
                order.extend((lay, k) for k in range(n_heads))
    return order


def preview_block(n: int) -> int:
    """Block size f that brings an n-token head down to at most PREVIEW_SIZE² cells."""
    return -(-n // PREVIEW_SIZE)


def encode_heads(
    raw: torch.Tensor,
    effective: torch.Tensor,
    *,
    layer: int,
    head: int,
    max_bytes: int,
    causal: bool = False,
) -> tuple[dict[str, dict[str, object]], list[tuple[int, int]]]:
    """Encode heads in priority order: full resolution while the byte budget lasts, then
    block-mean previews (room for a preview of every head is reserved first).

    raw, effective: `[L, H, n, n]`. Returns ({"l,h": entry}, heads shown as previews or,
    for texts too short to pool, not at all). The chosen head is always at full resolution.
    """
    n_layers, n_heads, n = int(raw.shape[0]), int(raw.shape[1]), int(raw.shape[2])
    block = preview_block(n)
    m = -(-n // block)
    # Upper bound of a preview's size: incompressible codes, base64, JSON keys.
    reserve = n_layers * n_heads * (2 * m * m * 4 // 3 + 120) if block > 1 else 0
    budget = max_bytes - _OVERHEAD_RESERVE - reserve
    heads: dict[str, dict[str, object]] = {}
    reduced: list[tuple[int, int]] = []
    used = 0
    for lay, k in head_order(n_layers, n_heads, layer, head):
        entry = None
        if not heads or used < budget:
            entry = encode_head(raw[lay, k], effective[lay, k])
            size = len(str(entry["blob"])) + 120
            if heads and used + size > budget:
                entry = None
            else:
                used += size
        if entry is None:
            reduced.append((lay, k))
            if block > 1:
                entry = encode_head(raw[lay, k], effective[lay, k], block=block, causal=causal)
        if entry is not None:
            heads[f"{lay},{k}"] = entry
    return heads, sorted(reduced)


def choose_rows(n: int, rows: Sequence[int] | None, max_rows: int) -> list[int]:
    """Query rows to precompute intervals for: the given ones, else up to `max_rows` spread evenly."""
    if rows:
        return sorted({int(r) for r in rows})
    if n <= max_rows:
        return list(range(n))
    return sorted({int(x) for x in np.rint(np.linspace(0, n - 1, max_rows))})


def spread_order(rows: Sequence[int]) -> list[int]:
    """The rows reordered so that every prefix is spread out: first, last, middle, quarters, …"""
    rows = list(rows)
    if len(rows) <= 2:
        return rows
    order, seen = [rows[0], rows[-1]], {0, len(rows) - 1}
    parts = [(0, len(rows) - 1)]
    while parts:
        nxt = []
        for lo, hi in parts:
            mid = (lo + hi) // 2
            if mid not in seen:
                seen.add(mid)
                order.append(rows[mid])
            if mid - lo > 1:
                nxt.append((lo, mid))
            if hi - mid > 1:
                nxt.append((mid, hi))
        parts = nxt
    return order


def interval_json(row: IntervalRow, digits: int = 4) -> dict[str, object]:
    def r(a: np.ndarray) -> list[float]:
        return [round(float(v), digits) for v in np.asarray(a, dtype=np.float64)]

    return {
        "weights": r(row.weights),
        "lo": r(row.lo),
        "hi": r(row.hi),
        "witness": None if row.witness is None else r(row.witness),
        "note": row.note,
    }


@dataclass(frozen=True)
class MixingMaps:
    """One context-mixing method's maps for the viewer (head-independent: one map per layer).

    name: the method's registry name. maps: `[L, n, n]` token j → token i at layer l (rows
    are receiving tokens, as in attention). caption: what the maps are (e.g. "rolled out
    from the input to layer l").
    """

    name: str
    maps: torch.Tensor
    caption: str = ""


def encode_map(x: torch.Tensor, *, block: int = 1, causal: bool = False) -> dict[str, object]:
    """One `[n, n]` map as {"f", "v": [offset, step], "blob"}: uint8 codes (error ≤ step/2),
    zlib, base64; with block = f > 1 the f×f block means (a preview), as for heads."""
    v = x.detach().double().cpu().numpy()
    if block > 1:
        v = block_means(v, block, causal)
    codes, off, step = quantise(v)
    payload = zlib.compress(codes.tobytes(), 9)
    return {"f": block, "v": [off, step], "blob": base64.b64encode(payload).decode("ascii")}


def decode_map(entry: dict[str, object], n: int) -> np.ndarray:
    """Inverse of `encode_map`, for tests: `[m, m]`."""
    m = -(-n // int(entry["f"]))  # type: ignore[call-overload]
    data = np.frombuffer(zlib.decompress(base64.b64decode(str(entry["blob"]))), dtype=np.uint8)
    off, step = entry["v"]  # type: ignore[misc]
    return dequantise(data.reshape(m, m), off, step)


def encode_mixing(
    methods: Sequence[MixingMaps], *, max_bytes: int, causal: bool = False
) -> tuple[dict[str, dict[str, object]], int]:
    """Every method's per-layer maps, full resolution while `max_bytes` lasts, else
    block-mean previews (as heads get). Returns ({name: {"caption", "layers": [entry]}},
    bytes used), so the caller can give the heads what is left."""
    out: dict[str, dict[str, object]] = {}
    used = 0
    for method in methods:
        n = int(method.maps.shape[-1])
        full = [encode_map(m) for m in method.maps]
        size = sum(len(str(e["blob"])) + 60 for e in full)
        if used + size > max_bytes:
            full = [encode_map(m, block=preview_block(n), causal=causal) for m in method.maps]
            size = sum(len(str(e["blob"])) + 60 for e in full)
        used += size
        out[method.name] = {"caption": method.caption, "layers": full}
    return out, used
