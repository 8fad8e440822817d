"""Family quirks: the few ways a family's layers depart from the ordinary layout, one small
frozen object per kind. An `ArchSpec` holds one of each (the default is the ordinary layout),
and the capture code calls its method instead of branching on a flag:

- `Axes`: the order of a layer's tensors (XLNet and FSMT pass hidden states sequence-first);
- `BlockOutput`: where the attention block's output is read (XLNet: a module's input);
- `LayerGroups`: how the listed layers run across depths (ALBERT runs one group at several);
- `Segments`: whether a pair's token types are passed (XLNet compares them, unembedded);
- `Tower`: the tower traced in a model of several (a full CLIP model: its vision tower).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from identifiable.models.hooks import HookSet, first_tensor, module_list


@dataclass(frozen=True)
class Axes:
    """The order of the tensors a family's layers pass (hooks see them as the model made them).

    Attributes:
        sequence_first: hidden states are `[n, B, d]` (XLNet, FSMT), not `[B, n, d]`.
        maps_sequence_first: attention maps are `[n, n_k, B, H]` (XLNet), not
            `[B, H, n, n_k]` (FSMT's maps are batch-first despite its hidden states).
    """

    sequence_first: bool = False
    maps_sequence_first: bool = False

    def batch_first(self, x: torch.Tensor) -> torch.Tensor:
        """A layer-level tensor `[n, B, …]` as `[B, n, …]`; the swap is its own inverse, so it
        also turns a batch-first tensor into the model's order."""
        return x.transpose(0, 1) if self.sequence_first else x

    def maps_batch_first(self, maps: torch.Tensor) -> torch.Tensor:
        """Attention maps as `[B, H, n, n_k]`."""
        return maps.permute(2, 3, 0, 1) if self.maps_sequence_first else maps

    def first_sequence(self, x: torch.Tensor) -> torch.Tensor:
        """Batch element 0 of a 3-D layer-level tensor (`[n, d]`); other tensors as they are
        (OPT flattens (batch, token) before its second norm: one sequence is `[n, d]` there)."""
        return self.batch_first(x)[0] if x.dim() == 3 else x


BATCH_FIRST = Axes()
"""The ordinary layout: `[B, n, d]` hidden states, `[B, H, n, n_k]` maps."""
SEQUENCE_FIRST = Axes(sequence_first=True, maps_sequence_first=True)
"""XLNet: `[n, B, d]` hidden states and `[n, n_k, B, H]` maps."""
FAIRSEQ = Axes(sequence_first=True)
"""FSMT (fairseq): `[n, B, d]` hidden states, `[B, H, n, n_k]` maps."""


@dataclass(frozen=True)
class BlockOutput:
    """Where the attention block's output (after W_O and b_O, before dropout and residual) is
    read.

    Attributes:
        at: None: the output of the spec's `out_proj`. Otherwise the dotted path (inside a
            layer) of a module that is called on the block output, read at its input, for
            models whose block output is the output of no module (XLNet multiplies by W_O
            inside the attention's forward; its attention dropout then runs on it, and also
            on the 4-D attention maps, which are skipped).
    """

    at: str | None = None

    def path(self, out_proj: str) -> str:
        """The dotted path (inside a layer) of the module to hook."""
        return self.at or out_proj

    @property
    def at_out_proj(self) -> bool:
        """Whether the block output is `out_proj`'s output, so that its input holds each
        head's output side by side (what a trace of chosen heads verifies against)."""
        return self.at is None

    def hook(self, hooks: HookSet, module: nn.Module, take: Callable[[torch.Tensor], None]) -> None:
        """Hand `take` each block output that `module` (at `path`) sees, as the model made it."""
        if self.at is None:
            hooks.post(module, lambda m, a, o: take(first_tensor(o)))
        else:
            hooks.pre(module, lambda m, a: take(a[0]) if a[0].dim() == 3 else None)


AT_OUT_PROJ = BlockOutput()
"""The ordinary place: the block output is the output of `out_proj`."""


@dataclass(frozen=True)
class LayerGroups:
    """How the entries of the spec's `layers` run across depths.

    Attributes:
        path: None: each entry is one layer, run once, in order. Otherwise (models that reuse
            layers, ALBERT) the path inside each entry of the list of layers it runs: with G
            entries and L = `config.num_hidden_layers`, run i runs entry ⌊i·G/L⌋, every layer
            inside it.
    """

    path: str | None = None

    def runs(self, listed: list[nn.Module], base: Any) -> list[nn.Module]:
        """The layers in the order the forward pass runs them (a shared layer once per run),
        from the entries `listed` of `base`'s list (whose config gives L where it is needed:
        FSMT's stacks have no config of their own)."""
        if self.path is None:
            return listed
        n_runs = int(base.config.num_hidden_layers)
        groups = [module_list(g, self.path) for g in listed]
        return [layer for i in range(n_runs) for layer in groups[int(i / (n_runs / len(groups)))]]


ONE_RUN_EACH = LayerGroups()
"""The ordinary stack: each listed layer runs once, in order."""


@dataclass(frozen=True)
class Segments:
    """Whether a pair's token types (`token_type_ids`) are passed to a model whose forward
    takes them.

    Attributes:
        compared: the model compares token types (same or different segment) instead of
            embedding them (XLNet): passed although the config has no `type_vocab_size`.
            Otherwise they are passed where the model embeds more than one segment
            (`type_vocab_size` > 1; RoBERTa has one).
    """

    compared: bool = False

    def passed(self, config: Any) -> bool:
        return self.compared or int(getattr(config, "type_vocab_size", 0) or 0) > 1


EMBEDDED_SEGMENTS = Segments()
"""The ordinary model: token types passed where it embeds more than one segment."""


@dataclass(frozen=True)
class Tower:
    """The tower traced in a base model that holds several.

    Attributes:
        path: attribute of the base model holding the traced tower (a full CLIP model: its
            `vision_model`); None: the base model is what is traced.
    """

    path: str | None = None

    def of(self, base: nn.Module) -> nn.Module:
        """The tower of `base`, where `base` has one (transformers 4.x `CLIPVisionModel` is
        its own tower), else `base`."""
        tower = getattr(base, self.path, None) if self.path else None
        return tower if isinstance(tower, nn.Module) else base


NO_TOWER = Tower()
"""The ordinary model: the base model is what is traced."""


QUIRKS: dict[str, type] = {
    "axes": Axes,
    "block_output": BlockOutput,
    "layer_groups": LayerGroups,
    "segments": Segments,
    "tower": Tower,
}
"""`ArchSpec` field → the quirk type it holds (checked when a spec is made)."""
