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
* for the requested head only (`CertifiedHead`): the interval bands (lower and upper
  bound of every weight) of every row computed within the time budget, and the
  constrained effective attention of the same rows, all quantised with one shared
  quantiser (16-bit codes when they fit, else 8-bit, else a spread prefix of the rows),
  plus exact bit masks of each row's key set and of the identifiable weights
  (width < `IDENTIFIABLE_BELOW`). At 512 tokens this is 4 · 512² values: about 1.2 MB
  at 16 bits, far less for the zeros most lower bounds are;
* attention intervals (4 decimals) and a witness for a bounded set of query rows of the
  requested head (`IntervalRow`); any other row says so in the page;
* for an image model (`PatchGrid`): which token sits in which cell of the patch grid, and
  optionally the image the model saw as one PNG (`png_bytes`, a data: URI in the page).
  The grid's shading is read from the maps above; nothing else is stored for it.

The encoding is pure numpy on tensors given to it; nothing here knows about models.
"""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

# Bytes reserved for everything that is not a head matrix (tokens, scripts, styles, intervals).
_OVERHEAD_RESERVE = 600_000
# Heads that do not fit at full resolution are shown as block means of at most this many cells a side.
PREVIEW_SIZE = 64
# A weight counts as identifiable on the page when every valid attention row with the same
# head output gives it a value within this much (interval width upper − lower below it).
# Why 0.01: it is one percentage point of attention mass, the precision at which attention
# weights are read (two decimals), and about 2.5 steps of the page's 256-level colour scale
# for weights up to 1, so two rows differing by less than it look alike on every map.
# Stricter readings (the certify CLI's summary uses 1e-3) are one argument away.
IDENTIFIABLE_BELOW = 0.01


@dataclass(frozen=True)
class IntervalRow:
    """Certificates for one query row of one head.

    weights: `[n_keys]` the model's attention row a; lo, hi: `[n_keys]` min/max weight
    each key can take among valid distributions that give the same head output;
    witness: `[n_keys]` one such distribution, or None when none exists (`note` says why).
    credible_lo, credible_hi: `[n_keys]` the 95 % credible band of each weight under the
    uniform posterior over those distributions (`attention_posterior`), inside [lo, hi];
    None when it was not computed. posterior_note: its diagnostics and flags in words.
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
    credible_lo: np.ndarray | None = None
    credible_hi: np.ndarray | None = None
    posterior_note: str = ""


def quantise(x: np.ndarray, bits: int = 8) -> tuple[np.ndarray, float, float]:
    """Codes, offset and step with x ≈ offset + code·step (error ≤ step/2).

    x: any shape, float. bits: 8 (uint8 codes) or 16 (uint16). A constant array gets
    step 0 (codes all 0). Rounding is monotone: x ≤ y implies code(x) ≤ code(y), so
    arrays quantised together keep their order (lower ≤ raw ≤ upper stays true).
    """
    if bits not in (8, 16):
        raise ValueError(f"bits must be 8 or 16, got {bits}")
    dtype, top = (np.uint8, 255) if bits == 8 else (np.uint16, 65535)
    x = np.asarray(x, dtype=np.float64)
    lo, hi = float(x.min()), float(x.max())
    step = (hi - lo) / top
    if step <= 0.0:
        return np.zeros(x.shape, dtype=dtype), lo, 0.0
    codes = np.clip(np.rint((x - lo) / step), 0, top).astype(dtype)
    return codes, lo, step


def dequantise(codes: np.ndarray, offset: float, step: float) -> np.ndarray:
    return offset + codes.astype(np.float64) * step


def _scale(entry: dict[str, object], key: str) -> tuple[float, float]:
    """The (offset, step) pair that `quantise` gave, as stored under `key`."""
    pair = entry[key]
    if not isinstance(pair, list | tuple) or len(pair) != 2:
        raise ValueError(f"entry[{key!r}] is not an (offset, step) pair: {pair!r}")
    return float(pair[0]), float(pair[1])


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
    r_off, r_step = _scale(entry, "raw")
    e_off, e_step = _scale(entry, "eff")
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


def null_fraction(raw: torch.Tensor, effective: torch.Tensor) -> torch.Tensor:
    """`[L, H]` float64 ‖A − A_eff‖_F / ‖A‖_F per head, from raw, effective `[L, H, n, n]`.

    0 where the head's attention is identifiable (effective = raw); it grows with the share
    of the attention pattern that lies in the null space, so the viewer's head grid shows
    it. One layer at a time in float64, to bound memory on long texts.
    """
    out = torch.empty(raw.shape[:2], dtype=torch.float64)
    for layer in range(raw.shape[0]):
        a = raw[layer].double().flatten(-2)
        diff = a - effective[layer].double().flatten(-2)
        out[layer] = diff.norm(dim=-1) / a.norm(dim=-1).clamp_min(1e-300)
    return out


def interval_json(
    row: IntervalRow, digits: int = 4, threshold: float = IDENTIFIABLE_BELOW
) -> dict[str, object]:
    """One row's entry; "ident" lists the keys whose exact width hi − lo is below
    `threshold` (decided before rounding to `digits`)."""

    def r(a: np.ndarray) -> list[float]:
        return [round(float(v), digits) for v in np.asarray(a, dtype=np.float64)]

    width = np.asarray(row.hi, dtype=np.float64) - np.asarray(row.lo, dtype=np.float64)
    return {
        "weights": r(row.weights),
        "lo": r(row.lo),
        "hi": r(row.hi),
        "witness": None if row.witness is None else r(row.witness),
        "ident": [int(j) for j in np.flatnonzero(width < threshold)],
        "note": row.note,
        # rounding is monotone: a band inside [lo, hi] stays inside after it
        "cred_lo": None if row.credible_lo is None else r(row.credible_lo),
        "cred_hi": None if row.credible_hi is None else r(row.credible_hi),
        "posterior_note": row.posterior_note,
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
    off, step = _scale(entry, "v")
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


# ---- the certified head: interval bands, identifiable marks, constrained attention ---------


@dataclass(frozen=True)
class CertifiedHead:
    """Interval bands and the constrained effective attention of rows of one head.

    Shapes: R rows covered, n keys. Arrays are float64; keys outside a row's key set are 0.

    Attributes:
        layer, head: 0-based.
        rows: `[R]` query rows covered, in the order they were computed (spread first: when
            the page budget drops rows, it keeps a prefix of this order).
        raw, lower, upper: `[R, n]` raw weights and the min/max each key can take over
            valid attention rows (≥ 0, summing to 1) with the same head output.
        constrained: `[R, n]` the constrained effective attention (a valid row), or None.
        keys: `[R, n]` bool, each row's key set.
        threshold: width below which a weight is marked identifiable.
        n_rows: rows of the head (n); note: what was covered and how long it took.
        constrained_rows: `[R]` bool, the rows whose constrained row was computed (None:
            all of them); the others hold anything and are not shown.
    """

    layer: int
    head: int
    rows: np.ndarray
    raw: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    constrained: np.ndarray | None
    keys: np.ndarray
    threshold: float = IDENTIFIABLE_BELOW
    n_rows: int = 0
    note: str = ""
    constrained_rows: np.ndarray | None = None

    @property
    def identifiable(self) -> np.ndarray:
        """`[R, n]` bool: inside the key set and upper − lower < threshold (exact, float64)."""
        return (self.upper - self.lower < self.threshold) & self.keys


def _bits_b64(mask: np.ndarray) -> str:
    packed = np.packbits(np.asarray(mask, dtype=bool).ravel(), bitorder="big")
    return base64.b64encode(zlib.compress(packed.tobytes(), 6)).decode("ascii")


def decode_bits(blob: str, shape: tuple[int, ...]) -> np.ndarray:
    """Inverse of the bit-mask encoding (zlib of big-endian packed bits, base64), for tests."""
    packed = np.frombuffer(zlib.decompress(base64.b64decode(blob)), dtype=np.uint8)
    size = int(np.prod(shape))
    return np.unpackbits(packed, bitorder="big")[:size].astype(bool).reshape(shape)


def _encode_certified_rows(c: CertifiedHead, take: np.ndarray, bits: int) -> dict[str, object]:
    rows = c.rows[take]
    order = np.argsort(rows, kind="stable")  # stored in row order, as the page looks them up
    pick = take[order]
    stack = [c.raw[pick], c.lower[pick], c.upper[pick]]
    with_con: list[int] = []
    if c.constrained is not None:
        has = np.ones(c.rows.size, dtype=bool) if c.constrained_rows is None else c.constrained_rows
        # Rows without a constrained row store the raw one (keeps the quantiser's range).
        stack.append(np.where(has[pick, None], c.constrained[pick], c.raw[pick]))
        with_con = [int(r) for r in c.rows[pick][has[pick]]]
    # One quantiser for all arrays: rounding is monotone, so lower ≤ raw, constrained ≤ upper
    # survive it, and the bands drawn from the codes never exclude the raw weight.
    codes, off, step = quantise(np.stack(stack), bits)
    payload = codes.astype("<u2").tobytes() if bits == 16 else codes.tobytes()
    return {
        "layer": int(c.layer),
        "head": int(c.head),
        "rows": [int(r) for r in rows[order]],
        "n_rows": int(c.n_rows),
        "bits": bits,
        "q": [off, step],
        "arrays": ["raw", "lower", "upper"]
        + (["constrained"] if c.constrained is not None else []),
        "constrained_rows": with_con,
        # Level 6: level 9 is several times slower on these arrays and gains < 1 %.
        "blob": base64.b64encode(zlib.compress(payload, 6)).decode("ascii"),
        "keys": _bits_b64(c.keys[pick]),
        "ident": _bits_b64(c.identifiable[pick]),
        "threshold": float(c.threshold),
        "dropped": int(c.rows.size - rows.size),
        "note": c.note,
    }


def _entry_size(entry: dict[str, object]) -> int:
    rows = len(entry["rows"]) + len(entry["constrained_rows"])  # type: ignore[arg-type]
    return sum(len(str(entry[k])) for k in ("blob", "keys", "ident", "note")) + 8 * rows + 300


def encode_certified(
    c: CertifiedHead | None, *, max_bytes: int
) -> tuple[dict[str, object] | None, int]:
    """The certified head as a JSON-ready dict within `max_bytes`, and the bytes it takes.

    All covered rows with 16-bit codes (error ≤ step/2, about 8e-6 for weights up to 1)
    when they fit; else 8-bit codes (error ≤ 0.002); else the longest prefix of `c.rows`
    (the spread order) that fits, with "dropped" saying how many rows were left out.
    The identifiable marks and key sets are exact bit masks, never quantised.
    """
    if c is None or c.rows.size == 0:
        return None, 0
    every = np.arange(c.rows.size)
    for bits in (16, 8):
        entry = _encode_certified_rows(c, every, bits)
        if _entry_size(entry) <= max_bytes:
            return entry, _entry_size(entry)
    lo, hi = 0, c.rows.size  # the largest prefix that fits (at least one row is kept)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _entry_size(_encode_certified_rows(c, every[:mid], 8)) <= max_bytes:
            lo = mid
        else:
            hi = mid
    entry = _encode_certified_rows(c, every[: max(lo, 1)], 8)
    return entry, _entry_size(entry)


def decode_certified(entry: dict[str, object], n: int) -> dict[str, np.ndarray]:
    """Inverse of `encode_certified` (what the page's script does), for tests:
    {"rows", "raw", "lower", "upper", ["constrained"], "keys", "identifiable"}, each `[R, n]`
    but "rows" `[R]`, and "has_constrained" `[R]` bool."""
    rows = np.array(entry["rows"], dtype=np.int64)
    data = zlib.decompress(base64.b64decode(str(entry["blob"])))
    codes = np.frombuffer(data, dtype="<u2" if entry["bits"] == 16 else np.uint8)
    off, step = _scale(entry, "q")
    names = list(entry["arrays"])  # type: ignore[call-overload]
    values = dequantise(codes, off, step).reshape(len(names), rows.size, n)
    out = {"rows": rows} | {name: values[k] for k, name in enumerate(names)}
    out["keys"] = decode_bits(str(entry["keys"]), (rows.size, n))
    out["identifiable"] = decode_bits(str(entry["ident"]), (rows.size, n))
    out["has_constrained"] = np.isin(rows, np.array(entry["constrained_rows"], dtype=np.int64))
    return out


# ---- image models: the patch grid ------------------------------------------------------------


@dataclass(frozen=True)
class PatchGrid:
    """Where an image model's tokens lie on its input image, for the viewer's patch grid.

    Attributes:
        rows, cols: the grid of patches (image size / patch size along each side).
        patches: `[rows · cols]` token index of each grid cell, row-major.
        special: token indices of the tokens that are not patches ([CLS], DeiT's [DIST]),
            shown as separate cells beside the grid.
        image_png: the image the model saw (its pixel values, de-normalised) as a PNG,
            drawn under the grid; None draws the grid alone.
        image_note: how the pixels were turned back into colours (stated under the image).
    """

    rows: int
    cols: int
    patches: tuple[int, ...]
    special: tuple[int, ...]
    image_png: bytes | None = None
    image_note: str = ""


def png_bytes(rgb: np.ndarray) -> bytes:
    """A PNG (8-bit RGB, no interlace) of `rgb` `[H, W, 3]` uint8, with zlib only.

    Written here rather than with an imaging library so that the page needs nothing but
    numpy; every scanline uses filter 0 (none), which any PNG reader accepts.
    """
    a = np.asarray(rgb)
    if a.ndim != 3 or a.shape[2] != 3 or a.dtype != np.uint8 or 0 in a.shape:
        raise ValueError(f"png_bytes takes uint8 [H, W, 3], got {a.dtype} {tuple(a.shape)}")
    a = np.ascontiguousarray(a)
    height, width = int(a.shape[0]), int(a.shape[1])
    scanlines = np.concatenate([np.zeros((height, 1), np.uint8), a.reshape(height, -1)], axis=1)

    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(scanlines.tobytes(), 9))
        + chunk(b"IEND", b"")
    )
