"""What differs between the transformers releases the package supports (4.57 to 5.x).

The specs in `identifiable.models.specs` name the modules of transformers 5.x. The
newest 4.x release (tested in CI beside 5.x, see scripts/setup_tf4.sh) lays out a few
modelling files differently. What differs per family is data in the family's spec; the
mechanics that read it, and the differences that are no family's own, are here, so that
the rest of models/ reads one vocabulary:

- module paths: 4.x ViT and DeiT keep `encoder.layer[i].attention.attention.value`
  (`ArchSpec.tf4_paths`, tried only when the 5.x path is missing: `adapt_spec`);
- attention weights: a 4.x attention module returns its probabilities only when it is
  called with `output_attentions=True` (`ask_for_attention_weights`); and a 4.x T5 stack
  reads the position biases out of its layers' outputs by a position that depends on the
  flag it passed down, so an encoder–decoder forward asks the model itself
  (`seq2seq_forward_options`);
- layer outputs: a 4.x DistilBERT block puts its attention weights before its hidden
  states (`hooks.first_tensor` skips a leading attention map);
- configs: 4.x ModernBERT names its local layers by `local_attention` and
  `global_attn_every_n_layers`, 5.x by `sliding_window` and `layer_types`
  (`ArchSpec.tf4_windows`, read by `window_config`);
- base models: 4.x `CLIPVisionModel` is its own base model (5.x: its `vision_model`
  tower), so the tower (`ArchSpec.tower`, `Tower.of`) is taken wherever the base model has one;
- dtypes: 4.x CLIP's vision tower is a plain `nn.Module` without `.dtype` (`dtype_of`).

`dtype=` in `from_pretrained` needs no shim: 4.57 accepts it (and `torch_dtype=`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from identifiable.errors import IdentifiableError
from identifiable.models.specs import ArchSpec


def adapt_spec(base: nn.Module, spec: ArchSpec) -> ArchSpec:
    """`spec` with the 4.x module paths when the model lacks the 5.x ones and has the 4.x ones."""
    legacy = spec.tf4_paths
    if legacy is None or _has_module(base, spec.layers) or not _has_module(base, legacy[0]):
        return spec
    layers, value, out_proj = legacy
    return dataclasses.replace(spec, layers=layers, value=value, out_proj=out_proj)


def _has_module(root: nn.Module, path: str) -> bool:
    try:
        root.get_submodule(path)
    except AttributeError:
        return False
    return True


def ask_for_attention_weights(module: nn.Module) -> Callable[..., Any] | None:
    """A forward pre-hook (register with `with_kwargs=True`) that calls `module` with
    `output_attentions=True`, or None when its forward has no such parameter (5.x
    attention modules return their weights unasked).

    Used where the model as a whole is not asked for attention maps (layer streaming):
    4.x attention modules return their probabilities only when asked. The argument is
    set by name whether the caller passed it by position (4.x ALBERT) or by keyword.
    """
    signature = inspect.signature(module.forward)
    if "output_attentions" not in signature.parameters:
        return None

    def hook(m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        bound = signature.bind_partial(*args, **kwargs)
        bound.arguments["output_attentions"] = True
        return bound.args, bound.kwargs

    return hook


def seq2seq_forward_options() -> dict[str, Any]:
    """Extra arguments of an encoder–decoder forward pass: under transformers 4.x the model
    is asked for `output_attentions` (a T5 attention module asked alone returns one more
    output than its block expects, and the stack then reads the cross-attention's position
    bias from the wrong place); 5.x needs nothing. The maps are still taken per layer from
    the attention modules; 4.x then also keeps its own tuple until the pass returns."""
    import transformers

    return {"output_attentions": True} if transformers.__version__.startswith("4.") else {}


def window_config(config: Any, spec: ArchSpec) -> tuple[Any, Any]:
    """(window size, per-layer attention types) as named by `spec`, else as a 4.x
    config states them (`spec.tf4_windows`, ModernBERT): layer i is global when i is a
    multiple of the period, otherwise local, seeing |i − j| ≤ width / 2.
    """
    window = getattr(config, spec.window_attr, None)
    types = getattr(config, spec.layer_types_attr, None)
    if spec.tf4_windows is None or window is not None or types is not None:
        return window, types
    local, every = (getattr(config, a, None) for a in spec.tf4_windows)
    if isinstance(local, int) and isinstance(every, int):
        n_layers = int(config.num_hidden_layers)
        types = [
            "full_attention" if i % every == 0 else "sliding_attention" for i in range(n_layers)
        ]
        window = local // 2
    return window, types


def layer_attr(config: Any, attr: str, layer: int = 0) -> Any:
    """`config.attr`, or layer `layer`'s value where transformers 5's heterogeneous configs
    (Gemma 4: a head width per layer) refuse the global read; None where it has none."""
    try:
        return getattr(config, attr, None)
    except Exception:  # AmbiguousGlobalPerLayerAttributeError (not an AttributeError)
        return getattr(config.per_layer_config[layer], attr, None)


# config fields that must be the same in every layer (heterogeneous configs may vary others)
_ONE_PER_MODEL = frozenset(
    ("num_attention_heads", "hidden_size", "kv_lora_rank", "q_lora_rank", "v_head_dim")
)


def refuse_varying_layers(config: Any, model_type: str) -> None:
    """One line where transformers 5's heterogeneous config sets per layer a field that a
    trace needs the same in every layer (a head width may vary: `hybrid.one_head_width`)."""
    spec = vars(config).get("_heterogeneity_spec")
    varying = sorted(set(getattr(spec, "per_layer_attributes", ()) or ()) & _ONE_PER_MODEL)
    if varying:
        raise IdentifiableError(
            f"architecture '{model_type}' sets {', '.join(varying)} per layer (a heterogeneous "
            "config); identifiable traces layers of one head count and latent width (head "
            "widths may vary): not supported"
        )


def per_layer_windows(config: Any, spec: ArchSpec, n_layers: int) -> list[int | None] | None:
    """Each layer's window from a heterogeneous config (transformers' `per_layer_config`;
    read only where the global `sliding_window` refuses to be), or None without one."""
    try:
        layers = list(getattr(config, "per_layer_config", None) or ())
    except TypeError:  # not a sequence of layer configs
        return None
    if len(layers) != n_layers:
        return None
    windows = [getattr(c, spec.window_attr, None) for c in layers]
    return [w if isinstance(w, int) and w > 0 else None for w in windows]


def dtype_of(module: nn.Module) -> torch.dtype:
    """The dtype of a module's weights (`PreTrainedModel.dtype`, which 4.x CLIP's vision
    tower, a plain `nn.Module`, lacks)."""
    dtype = getattr(module, "dtype", None)
    if isinstance(dtype, torch.dtype):
        return dtype
    return next(module.parameters()).dtype
