"""TransformerLens models: a `TransformerBridge` and its `run_with_cache` cache as a `Trace`.

TransformerLens 4 replaced `HookedTransformer` by `TransformerBridge` (the same
hook names). Per layer l the cache gives A (`blocks.l.attn.hook_pattern`), E (the
value projection's input, `blocks.l.attn.v.hook_in`), the block output with b_O
(`blocks.l.hook_attn_out`) and the residual stream; W_V, b_V, W_O and b_O are the
bridge's per-head weights (`attn.W_V` `[H, d, d_v]`, `attn.W_O` `[H, d_v, d]`).
`Trace.verify()` proves the result exactly as for Hugging Face captures.
Install with the extra `pip install identifiable[lens]`.
"""

from __future__ import annotations

from typing import Any

import torch

from identifiable.errors import IdentifiableError
from identifiable.models.trace import Trace


def trace_from_lens(bridge: Any, tokens: Any, *, cache: Any = None) -> Trace:
    """One sequence through a TransformerLens model, as a `Trace`.

    Args:
        bridge: a `transformer_lens.TransformerBridge` (TransformerLens ≥ 4).
        tokens: a text (tokenised with `bridge.to_tokens`), token ids (list[int],
            `[n]` or `[1, n]` tensor).
        cache: an `ActivationCache` from `bridge.run_with_cache(tokens)` when you
            already ran it (else it is run here).
    Causal masking is read off the attention (exact zeros above the diagonal).
    """
    if not hasattr(bridge, "run_with_cache") or not hasattr(bridge, "blocks"):
        raise IdentifiableError(
            f"trace_from_lens takes a TransformerLens TransformerBridge, got {type(bridge).__name__}"
        )
    ids = bridge.to_tokens(tokens) if isinstance(tokens, str) else torch.as_tensor(tokens)
    ids = ids.reshape(1, -1).long()
    if cache is None:
        with torch.no_grad():
            _, cache = bridge.run_with_cache(ids)
    n_layers = len(bridge.blocks)
    atts, vals, b_vs, w_os, b_os, outs = [], [], [], [], [], []
    hidden = [_get(cache, "blocks.0.hook_resid_pre", "blocks.0.hook_in")[0]]
    n_heads = None
    for layer in range(n_layers):
        attn = bridge.blocks[layer].attn
        a = _get(cache, f"blocks.{layer}.attn.hook_pattern")[0]  # [H, n, n]
        e = _get(cache, f"blocks.{layer}.attn.v.hook_in", f"blocks.{layer}.ln1.hook_normalized")[0]
        n_heads = a.shape[0]
        w_v, b_v = attn.W_V.detach(), attn.b_V.detach()  # [H_kv, d, d_v], [H_kv, d_v]
        group = n_heads // w_v.shape[0]
        w_v, b_v = w_v.repeat_interleave(group, 0), b_v.repeat_interleave(group, 0)
        atts.append(a)
        vals.append(torch.einsum("nd,hdv->hnv", e.to(w_v.dtype), w_v))
        b_vs.append(b_v)
        w_os.append(attn.W_O.detach())
        b_os.append(attn.b_O.detach())
        outs.append(_get(cache, f"blocks.{layer}.hook_attn_out")[0])
        hidden.append(_get(cache, f"blocks.{layer}.hook_resid_post", f"blocks.{layer}.hook_out")[0])
    a = torch.stack(atts).float().cpu()
    n = a.shape[-1]
    causal = n > 1 and not bool(a.triu(1).any())
    tokenizer = getattr(bridge, "tokenizer", None)
    id_list = ids[0].tolist()
    names = (
        list(tokenizer.convert_ids_to_tokens(id_list))
        if tokenizer is not None
        else [f"<{i}>" for i in id_list]
    )
    mask = torch.ones(n_layers, n, n, dtype=torch.bool)
    n_kv = bridge.blocks[0].attn.W_V.shape[0]
    return Trace(
        tokens=names,
        input_ids=ids[0].cpu(),
        attentions=a,
        values=torch.stack(vals).float().cpu(),
        value_bias=torch.stack(b_vs).float().cpu(),
        out_proj=torch.stack(w_os).float().cpu(),
        out_bias=torch.stack(b_os).float().cpu(),
        hidden_states=torch.stack(hidden).float().cpu(),
        attn_outputs=torch.stack(outs).float().cpu(),
        is_causal=causal,
        kv_head_of=torch.arange(n_heads or 0) // max(1, (n_heads or 0) // n_kv),
        model_name=str(getattr(getattr(bridge, "cfg", None), "model_name", "") or ""),
        architecture="transformer-lens",
        key_mask=mask.tril() if causal else mask,
    )


def _get(cache: Any, *names: str) -> torch.Tensor:
    for name in names:
        try:
            return cache[name].detach()
        except (KeyError, IndexError):
            continue
    raise IdentifiableError(
        f"the TransformerLens cache has no '{names[0]}'; run bridge.run_with_cache(tokens) "
        "without names_filter (or keep these hooks)"
    )
