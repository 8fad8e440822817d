"""Automatic discovery of an `ArchSpec` for families that are not in the table.

By introspection of the base model: the layer list is the `ModuleList` with
`config.num_hidden_layers` entries; inside the first layer, the value
projection is a linear module whose input width is d and whose output holds
H_kv·d_v columns (a separate V projection, preferred when its name says
value) or (H + 2·H_kv)·d_v columns (fused QKV, tried in both fused layouts);
the output projection is a linear module from H·d_v to d, preferably a sibling
of the value projection. Causal masking is read off the probe's attention.

A candidate is accepted only when `Trace.verify()` proves it on a probe input
(token ids, so no tokenizer is needed); candidates are tried in order of how
well their names match, and the first one proved wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from identifiable.errors import IdentifiableError
from identifiable.models.specs import ArchSpec

_VALUE_NAMES = ("v_proj", "value", "v", "v_lin", "value_proj", "wv", "v_linear")
_FUSED_NAMES = ("qkv_proj", "query_key_value", "wqkv", "c_attn", "qkv", "in_proj", "qkv_linear")
_OUT_NAMES = ("o_proj", "out_proj", "dense", "o", "out_lin", "wo", "c_proj", "out", "proj")
PROBE_LENGTH = 24


@dataclass(frozen=True)
class Discovery:
    """What discovery found.

    Attributes:
        spec: the accepted spec (`source="discovered"`).
        errors: `[L]` the probe trace's per-layer relative reconstruction errors.
        tolerance: the tolerance they were verified against.
        tried: one line per candidate, "value → out (layout): outcome".
    """

    spec: ArchSpec
    errors: torch.Tensor
    tolerance: float
    tried: list[str] = field(default_factory=list)


def _linears(layer: nn.Module) -> dict[str, tuple[nn.Module, str]]:
    """Linear-like modules of a layer: name → (module, weight layout)."""
    found: dict[str, tuple[nn.Module, str]] = {}
    for name, mod in layer.named_modules():
        w = getattr(mod, "weight", None)
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or not name:
            continue
        if isinstance(mod, nn.Linear):
            found[name] = (mod, "linear")
        elif type(mod).__name__ == "Conv1D":  # GPT-2 style, weight [in, out]
            found[name] = (mod, "conv1d")
    return found


def _in_out(mod: nn.Module, layout: str) -> tuple[int, int]:
    out_f, in_f = mod.weight.shape
    return (out_f, in_f) if layout == "conv1d" else (in_f, out_f)


def _layer_list(base: nn.Module) -> tuple[str, nn.ModuleList] | None:
    n_layers = int(getattr(base.config, "num_hidden_layers", 0) or 0)
    lists = [
        (name, mod)
        for name, mod in base.named_modules()
        if isinstance(mod, nn.ModuleList) and len(mod) > 0 and name
    ]
    exact = [(n, m) for n, m in lists if len(m) == n_layers]
    pool = exact or lists
    return min(pool, key=lambda nm: nm[0].count(".")) if pool else None


def _candidates(base: nn.Module, layers_path: str, layer: nn.Module) -> list[ArchSpec]:
    config = base.config
    d = int(config.hidden_size)
    n_heads = int(config.num_attention_heads)
    d_v = int(getattr(config, "head_dim", None) or d // n_heads)
    mods = _linears(layer)

    def last(name: str) -> str:
        return name.rsplit(".", 1)[-1].lower()

    def parent(name: str) -> str:
        return name.rsplit(".", 1)[0] if "." in name else ""

    values: list[tuple[int, str, str, str | None]] = []  # (rank, name, layout, fused)
    outs: list[tuple[str, str]] = []
    for name, (mod, layout) in mods.items():
        d_in, d_out = _in_out(mod, layout)
        if d_in == d and d_out % d_v == 0:
            if last(name) in _VALUE_NAMES and n_heads % (d_out // d_v) == 0:
                values.append((0, name, layout, None))
            if last(name) in _FUSED_NAMES or (d_out // d_v - n_heads) % 2 == 0:
                rank = 1 if last(name) in _FUSED_NAMES else 3
                if d_out // d_v > n_heads:
                    values.append((rank, name, layout, "qkv_blocks"))
                    values.append((rank, name, layout, "per_kv_group"))
            elif n_heads % max(1, d_out // d_v) == 0 and last(name) not in _VALUE_NAMES:
                values.append((4, name, layout, None))  # unnamed V-shaped projection
        if d_in == n_heads * d_v and d_out == d:
            outs.append((name, layout))
    specs = []
    for _, v_name, v_layout, fused in sorted(values, key=lambda t: t[0]):
        ranked = sorted(
            (o for o in outs if o[1] == v_layout),
            key=lambda o: (last(o[0]) not in _OUT_NAMES, parent(o[0]) != parent(v_name)),
        )
        for o_name, _ in ranked:
            if o_name == v_name or last(o_name) in _VALUE_NAMES + _FUSED_NAMES:
                continue
            specs.append(
                ArchSpec(
                    name=str(config.model_type),
                    model_types=(str(config.model_type),),
                    layers=layers_path,
                    value=v_name,
                    out_proj=o_name,
                    weight_layout=v_layout,  # type: ignore[arg-type]
                    fused=fused,  # type: ignore[arg-type]
                    source="discovered",
                )
            )
    return specs


def _probe_ids(base: nn.Module) -> torch.Tensor:
    vocab = int(getattr(base.config, "vocab_size", 0) or 1000)
    specials = {
        int(t)
        for t in (getattr(base.config, k, None) for k in ("pad_token_id", "bos_token_id"))
        if isinstance(t, int)
    }
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (PROBE_LENGTH,), generator=g)
    for s in specials:  # no padding tokens inside the probe
        ids[ids == s] = (s + 7) % vocab
    return ids


def discover_spec(base: nn.Module, tokenizer: Any = None) -> Discovery:
    """Find and prove a spec for `base` (a Hugging Face base model), or raise one line."""
    from identifiable.models.model import Model

    model_type = str(getattr(base.config, "model_type", type(base).__name__))
    how = (
        "write an ArchSpec (README 'Adding an architecture') and pass it as "
        "Model.from_hf(model, spec=...)"
    )
    found = _layer_list(base)
    if found is None:
        raise IdentifiableError(
            f"architecture '{model_type}' is not in the table and discovery found no list of "
            f"layers (nn.ModuleList) in {type(base).__name__}; {how}"
        )
    layers_path, layer_list = found
    candidates = _candidates(base, layers_path, layer_list[0])
    if not candidates:
        raise IdentifiableError(
            f"architecture '{model_type}' is not in the table and discovery found no value and "
            f"output projections (linear d→H_kv·d_v and H·d_v→d) in '{layers_path}.0'; {how}"
        )
    ids = _probe_ids(base)
    tried: list[str] = []
    for spec in candidates:
        label = f"{spec.value} → {spec.out_proj}" + (f" ({spec.fused})" if spec.fused else "")
        # Decoder first: an encoder's attention beyond the diagonal fails the
        # causal key mask; a decoder would pass as an encoder, so that order is wrong.
        for causal in (True, False):
            cand = replace(spec, causal=causal, norm="pre" if causal else "post")
            try:
                model = Model(base, tokenizer, spec=cand)
                trace = model.trace(ids)
                errors = trace.verify()
            except IdentifiableError as exc:
                if causal and "outside the mask" in str(exc):
                    continue  # attends beyond the diagonal: try it as an encoder
                tried.append(f"{label}: {str(exc).split(';')[0][:120]}")
                break
            except Exception as exc:  # a forward pass that breaks under this spec
                reason = (str(exc).strip().splitlines() or [""])[0][:80]
                tried.append(f"{label}: {type(exc).__name__} {reason}".rstrip())
                break
            return Discovery(cand, errors, trace.tolerance, [*tried, f"{label}: verified"])
    shown = "; ".join(tried[:4]) + (f"; … {len(tried) - 4} more" if len(tried) > 4 else "")
    raise IdentifiableError(
        f"architecture '{model_type}' is not in the table and no discovered spec reproduced "
        f"the model on a probe (tried {len(tried)} in '{layers_path}': {shown}); {how}"
    )
