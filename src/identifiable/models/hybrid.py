"""Hybrid stacks: which layers of a model hold softmax attention, and what the others are.

Qwen3-Next, Jamba and other hybrids interleave softmax attention with linear-attention or
state-space layers; a stack traces the layers that hold its spec's value and output
projections, and names every other layer once, with its kind.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from identifiable.models.specs import ArchSpec


def has_attention(layer: nn.Module, spec: ArchSpec) -> bool:
    """Whether `layer` holds the spec's value and output projections."""
    paths = (spec.value, spec.block_output.path(spec.out_proj))
    try:
        for path in paths:
            if spec.weight_layout == "heads" and path != spec.block_output.at:
                layer.get_parameter(path)
            else:
                layer.get_submodule(path)
    except AttributeError:
        return False
    return True


def kind_of(layer: nn.Module, attending: nn.Module) -> str:
    """What mixes tokens in a layer without the spec's attention: its first child that the
    attention layers lack ("linear_attn (Qwen3NextGatedDeltaNet)"), else its class."""
    theirs = {name for name, _ in attending.named_children()}
    mine = [(n, type(m).__name__) for n, m in layer.named_children() if n not in theirs]
    return f"{mine[0][0]} ({mine[0][1]})" if mine else type(layer).__name__


def ranges(indices: Sequence[int]) -> str:
    """[0, 1, 2, 5] → "0, 1, 2, 5" (indices as a user types them)."""
    return ", ".join(str(i) for i in indices)


def others_line(others: dict[int, str]) -> str:
    """One line naming the layers `others` (index → kind) that are not traced ("" if none)."""
    kinds: dict[str, list[int]] = {}
    for i, kind in sorted(others.items()):
        kinds.setdefault(kind, []).append(i)
    return "; ".join(
        f"{'layer' if len(ix) == 1 else 'layers'} {ranges(ix)} "
        f"{'is' if len(ix) == 1 else 'are'} {kind}: "
        f"{'' if kind.startswith('softmax attention') else 'not softmax attention, '}not analysed"
        for kind, ix in kinds.items()
    )


def one_head_width(
    every: list[nn.Module], kept: list[int], spec: ArchSpec, n_heads: int
) -> tuple[list[int], dict[int, str]]:
    """The attention layers whose heads are as wide as the first's, and the others by kind:
    a trace holds one head width, and Gemma 4's global layers have wider heads."""
    if spec.weight_layout == "heads" or spec.latent is not None:
        return kept, {}
    width = {i: _in_width(every[i].get_submodule(spec.out_proj), spec) for i in kept}
    first = width[kept[0]]
    odd = {
        i: f"softmax attention with heads of width {width[i] // n_heads} (the traced layers': "
        f"{first // n_heads}; a trace holds one head width)"
        for i in kept
        if width[i] != first
    }
    return [i for i in kept if i not in odd], odd


def _in_width(module: nn.Module, spec: ArchSpec) -> int:
    """The input width of a linear (weight `[out, in]`) or Conv1D (`[in, out]`) projection."""
    shape = module.get_parameter("weight").shape
    return int(shape[0] if spec.weight_layout == "conv1d" else shape[1])
