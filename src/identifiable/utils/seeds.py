"""Seeds: the documented range, and seeds derived from one for a sub-task (a layer).

Every `--seed` / `seed=` takes 0..2**63-1 (`SEED_MAX`): numpy's generators take any
non-negative integer, torch's `manual_seed` at most 2**64-1, so a derived seed in
0..SEED_MAX still leaves room for the small offsets (`seed + 17`) the fitting code adds.
"""

from __future__ import annotations

import hashlib

SEED_MAX = 2**63 - 1
_LAYER_STRIDE = 1_000_003


def layer_seed(seed: int, layer: int) -> int:
    """The seed of one layer's probes, in 0..SEED_MAX, for any seed in 0..SEED_MAX.

    `seed * 1_000_003 + layer` where that fits (the seeds of every earlier run, so their
    results are unchanged), else the first 63 bits of SHA-256 of "seed:layer": distinct
    layers of one seed get unrelated seeds either way.
    """
    linear = seed * _LAYER_STRIDE + layer
    if 0 <= linear <= SEED_MAX:
        return linear
    digest = hashlib.sha256(f"{seed}:{layer}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & SEED_MAX


def offset_seed(seed: int, offset: int) -> int:
    """`seed + offset` (a sequence's probe seed), wrapped into 0..SEED_MAX: unchanged where
    it fits, and distinct for distinct offsets at any seed of the documented range."""
    return (int(seed) + int(offset)) % (SEED_MAX + 1)
