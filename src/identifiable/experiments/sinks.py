"""The sink table of a model: raw and effective attention on the first token, per layer, on
a text or on the first n tokens of a corpus (the packaged Wikipedia sample by default)."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from identifiable.attention.effective import Variant
from identifiable.attention.sinks import SinkMass, sink_mass
from identifiable.errors import IdentifiableError
from identifiable.models.encoding import TruncationWarning

DEFAULT_SINK_TOKENS = 512


def corpus_prefix(model: Any, n_tokens: int, corpus: Any = "wikipedia-sample") -> torch.Tensor:
    """`[n_tokens]` int64: the first `n_tokens` ids of the model's own encoding (special
    tokens included) of the corpus's paragraphs in source order, joined by blank lines."""
    from identifiable.corpus import load_corpus

    limit = int(getattr(model.info, "max_positions", 0) or 0)
    if n_tokens < 2 or (limit and n_tokens > limit):
        top = f" and {limit} (the model's context)" if limit else ""
        raise IdentifiableError(
            f"the number of tokens must be at least 2{top}, got {n_tokens}",
            cli=f"--tokens must be at least 2{top}, got {n_tokens}",
        )
    text = ""
    for paragraph in load_corpus(corpus, unit="paragraph"):
        text = f"{text}\n\n{paragraph}" if text else str(paragraph)
        with warnings.catch_warnings():  # past the context: cut to n_tokens below anyway
            warnings.simplefilter("ignore", TruncationWarning)
            ids = model.encode(text).input_ids
        if len(ids) >= n_tokens:
            return torch.as_tensor(ids[:n_tokens], dtype=torch.int64)
    raise IdentifiableError(
        f"the corpus has {len(ids) if text else 0} tokens for this model, fewer than the "
        f"{n_tokens} asked for; ask for fewer tokens"
    )


def sink_table(
    model: Any,
    text: Any = None,
    *,
    n_tokens: int = DEFAULT_SINK_TOKENS,
    variant: Variant = "paper",
    memory_budget: int | None = None,
) -> SinkMass:
    """`sink_mass` of one trace of `model`: of `text` (anything `Model.trace` takes) or,
    without it, of the first `n_tokens` tokens of the packaged Wikipedia sample
    (`corpus_prefix`). `SinkMass.per_layer()` is the table."""
    source = corpus_prefix(model, n_tokens) if text is None else text
    trace = model.trace(source, memory_budget=memory_budget)
    return sink_mass(trace, variant)
