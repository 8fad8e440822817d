"""nnsight models: the Hugging Face model inside an nnsight wrapper, traced as it is.

nnsight (`TransformersModel`, `LanguageModel`, or the generic `NNsight`) wraps a
`torch.nn.Module` the user holds and keeps it as `wrapper._module`; its tokenizer (for
language models) is `wrapper.tokenizer`. The bridge wraps that same module with
`load_model`, so a trace through nnsight is the trace `load_model(hf_model)` gives: the
same capture, the same `verify()`, the same effective attention. The forward pass runs
on the module's own forward (nnsight's per-module controllers included, which pass
through outside an nnsight `trace` block); interventions written inside a
`with wrapper.trace(...)` block are not applied to our trace. Nothing is remote: a
wrapper around a local model needs no network (`remote=True` is never used).

nnsight itself is not imported (it is the optional extra `nnsight`): a wrapper is
recognised by its class's module and its `_module` (`loading.is_nnsight`, which
`load_model` uses too).
"""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

from torch import nn

from identifiable.models.backends import AttentionChoice
from identifiable.models.loading import is_nnsight, load_model, unwrap
from identifiable.models.trace import Trace

__all__ = ["is_nnsight", "model_from_nnsight", "trace_from_nnsight", "unwrap"]


_MODELS: WeakKeyDictionary[nn.Module, tuple[Any, str, Any]] = WeakKeyDictionary()


def model_from_nnsight(
    nn_model: Any, *, tokenizer: Any = None, attention: AttentionChoice = "auto"
) -> Any:
    """The identifiable `Model` (or `Seq2SeqModel`) of the module inside an nnsight wrapper,
    built once per module, tokenizer and `attention` (see `load_model`).

    Args:
        nn_model: an nnsight wrapper around a transformers model.
        tokenizer: default: the wrapper's own (`nn_model.tokenizer`), else the model's saved one.
        attention: as for `load_model`.
    """
    module = unwrap(nn_model)
    tokenizer = tokenizer if tokenizer is not None else getattr(nn_model, "tokenizer", None)
    cached = _MODELS.get(module)
    if cached is not None and cached[0] is tokenizer and cached[1] == attention:
        return cached[2]
    model = load_model(module, tokenizer=tokenizer, attention=attention)
    _MODELS[module] = (tokenizer, attention, model)
    return model


def trace_from_nnsight(nn_model: Any, text: Any, **options: Any) -> Trace:
    """One sequence through the model an nnsight wrapper holds, as a `Trace`.

    Args:
        nn_model: `nnsight.TransformersModel(hf_model, tokenizer=tok)` (or `LanguageModel`,
            `NNsight`) around a local transformers model.
        text: a text (tokenised with the wrapper's tokenizer, exactly as `Model.trace`
            tokenises it), a text pair, or token ids.
        options: `Model.trace`'s keywords (`layers=`, `heads=`, `truncate=`, …).
    Returns the `Trace` that `load_model(hf_model, tokenizer=tok).trace(text)` returns.
    """
    return model_from_nnsight(nn_model).trace(text, **options)
