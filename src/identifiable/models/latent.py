"""Multi-head latent attention (DeepSeek-V2/V3): where each head's values come from.

Each token's keys and values are expanded from one shared latent: the layer projects x to
a latent (`kv_a_proj_with_mqa`), normalises it (`kv_a_layernorm`, width r = kv_lora_rank)
and expands it with `kv_b_proj`, whose output holds, head after head, the key's
position-free part (qk_nope_head_dim columns) then the value (v_head_dim columns). So E is
the normalised latent c `[n, r]`, W_V,h is head h's value columns of `kv_b_proj`, and W_O,h
the head's v_head_dim rows of `o_proj`; T = c W_V,h W_O,h is a product of the model's own
weights, and `verify()` proves A (c W_V) W_O + b_O against the layer's output projection.
A spec points at one `LatentValues` (`ArchSpec.latent`); generic code asks it, never the
family's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from identifiable.errors import IdentifiableError


@dataclass(frozen=True)
class LatentValues:
    """How a latent-attention family lays out its values (config attribute names).

    Attributes:
        latent_attr: the latent's width r (the input width of the value module).
        key_attr: the position-free key columns before each head's value columns.
        value_attr: each head's value width d_v.
    """

    latent_attr: str = "kv_lora_rank"
    key_attr: str = "qk_nope_head_dim"
    value_attr: str = "v_head_dim"

    def head_dim(self, config: Any) -> int:
        """d_v, the value width of one head (not the query/key width)."""
        return int(getattr(config, self.value_attr))

    def columns(self, width: int, n_heads: int, head_dim: int) -> list[int]:
        """The value module's output columns holding W_V, head by head: the last d_v of
        each head's block of width / H columns."""
        block = width // n_heads
        if block * n_heads != width or block <= head_dim:
            raise IdentifiableError(
                f"the latent expansion has width {width}, which is not H·(d_k + d_v) for H = "
                f"{n_heads}, d_v = {head_dim}; the spec's latent layout does not fit this model"
            )
        return [h * block + block - head_dim + c for h in range(n_heads) for c in range(head_dim)]

    @staticmethod
    def rows(e: torch.Tensor) -> torch.Tensor:
        """E as `[B, n, r]`: the model feeds the latent as one head, `[B, 1, n, r]`."""
        return e.squeeze(1) if e.dim() == 4 and e.shape[1] == 1 else e


MLA = LatentValues()
"""DeepSeek-V2/V3's names (and those of the families sharing their attention module)."""
