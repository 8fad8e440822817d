"""Tiny float64 models and texts long enough (n > d_v = 16) to have null attention."""

from __future__ import annotations

TEXTS = [
    "the river ran past the old mill and the village where the miller lived with his three "
    "daughters, who sold bread at the market every saturday morning",
    "a short sentence here",
    "music and language share a long history; both have rhythm, grammar and a sense of time "
    "that listeners feel before they can name it",
]


def batch_for(model, texts, *, left: bool = False):
    """A padded BatchEncoding with only the keys the model's forward takes."""
    tok = model.tokenizer
    tok.padding_side = "left" if left else "right"
    try:
        enc = tok(list(texts), padding=True, return_tensors="pt")
    finally:
        tok.padding_side = "right"
    keep = {"input_ids", "attention_mask"}
    if model.inputs.accepts_token_types:
        keep.add("token_type_ids")
    return {k: v for k, v in enc.items() if k in keep}


def nonfinite_files(root) -> list[str]:
    """The weight files under `root` (safetensors, torch state files) holding NaN or inf:
    what "nothing non-finite is ever saved" counts."""
    from pathlib import Path

    import torch
    from safetensors.torch import load_file

    found = []
    for path in Path(root).rglob("*"):
        if path.suffix == ".safetensors":
            tensors = list(load_file(path).values())
        elif path.suffix == ".pt" or path.name.endswith(".pt.tmp") or ".pt." in path.name:
            try:
                state = torch.load(path, weights_only=True)
            except Exception:  # a half-written temporary: counted by the temporaries check
                continue
            tensors = [t for part in ("model",) for t in state.get(part, {}).values()]
        else:
            continue
        if any(t.is_floating_point() and not bool(t.isfinite().all()) for t in tensors):
            found.append(str(path))
    return found
