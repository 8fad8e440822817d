"""The model arguments of the public functions, checked before any work: one line for None,
a name where a loaded model belongs, a `Trace` where its model belongs, or a model that is
not a Hugging Face one (TransformerLens, a plain `nn.Module`)."""

from __future__ import annotations

from typing import Any

from torch import nn

from identifiable.errors import IdentifiableError
from identifiable.utils.checks import shown


def check_model(model: Any, name: str = "model", *, names: bool = False) -> None:
    """Refuse anything but a loaded model (`Model`, `Seq2SeqModel` or an object that traces
    like one); `names=True`: a name for `load_model` too (a string or a path)."""
    import os

    if names and isinstance(model, str | os.PathLike):
        return
    if callable(getattr(model, "trace", None)) and hasattr(model, "hf_model"):
        return
    load = "identifiable.load_model('minilm'), a folder or a hub id"
    wanted = f"a model name or a loaded model ({load})" if names else f"a loaded model ({load})"
    if hasattr(model, "attentions") and hasattr(model, "out_proj"):
        raise IdentifiableError(
            f"{name}= takes {wanted}, got a Trace: pass the model the trace came from"
        )
    if isinstance(model, str):
        raise IdentifiableError(
            f"{name}= takes a loaded model, got the name {model!r:.60}: load it first, "
            f"model = identifiable.load_model({model!r:.60})"
        )
    if isinstance(model, nn.Module) and hasattr(model, "config"):
        raise IdentifiableError(
            f"{name}= takes an identifiable model, got a Hugging Face {type(model).__name__}: "
            "wrap it with identifiable.Model.from_hf(model, tokenizer)"
        )
    raise IdentifiableError(f"{name}= takes {wanted}, got {shown(model)}")


def check_hf_model(hf_model: Any, tokenizer: Any = None) -> None:
    """What `Model(...)`, `Seq2SeqModel(...)` and `discover_spec` wrap: a Hugging Face model
    (an `nn.Module` with a config) and, if given, a tokenizer that can be called."""
    if type(hf_model).__name__ in ("TransformerBridge", "HookedTransformer"):
        raise IdentifiableError(
            "a TransformerLens model is not a Hugging Face model: trace it with "
            "identifiable.integrations.lens.trace_from_lens(bridge, tokens)"
        )
    if hasattr(hf_model, "task_model") and callable(getattr(hf_model, "trace", None)):
        raise IdentifiableError(
            "hf_model= takes a Hugging Face model; this one is an identifiable model "
            "already: use it as it is (its Hugging Face model is .task_model)"
        )
    if not isinstance(hf_model, nn.Module) or not hasattr(hf_model, "config"):
        raise IdentifiableError(
            "hf_model= takes a Hugging Face model (transformers.AutoModel.from_pretrained(…)), "
            f"got {shown(hf_model)}; or load one by name with identifiable.load_model"
        )
    if tokenizer is not None and not callable(tokenizer):
        raise IdentifiableError(
            "tokenizer= takes a Hugging Face tokenizer (AutoTokenizer.from_pretrained(…)) or "
            f"None, got {shown(tokenizer)}"
        )


def check_dtype(dtype: Any) -> Any:
    """`dtype=` of `load_model`: None, a floating torch dtype, or its name ("bfloat16")."""
    import torch

    named = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if dtype is None or (isinstance(named, torch.dtype) and named.is_floating_point):
        return named
    raise IdentifiableError(
        "dtype= takes a floating torch dtype such as torch.float32 or torch.bfloat16 (or its "
        f"name), got {shown(dtype)}"
    )


def check_fields(obj: Any, tensors: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    """One line for a record built by hand (a `Trace`, an `Encoding`) whose tensor fields
    are not tensors, or whose `tokens` are not a list of strings."""
    import torch

    kind = type(obj).__name__
    for field in tensors + optional:
        value = getattr(obj, field)
        if not isinstance(value, torch.Tensor) and not (field in optional and value is None):
            raise IdentifiableError(f"{kind} field {field}= takes a tensor, got {shown(value)}")
    tokens = getattr(obj, "tokens", [])
    if not isinstance(tokens, list | tuple) or not all(isinstance(t, str) for t in tokens):
        raise IdentifiableError(
            f"{kind} field tokens= takes a list of strings, got {shown(tokens)}"
        )
