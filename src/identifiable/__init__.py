"""identifiable: how far can you trust what a Transformer's attention and hidden states seem to say?

Implements "On Identifiability in Transformers" (Brunner et al., ICLR 2020) for
Hugging Face models. Public names are imported lazily so that `import identifiable`
and the CLI start fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "load_model": "identifiable.models",
    "Model": "identifiable.models",
    "Trace": "identifiable.models",
    "IdentifiableError": "identifiable.errors",
    "null_space": "identifiable.attention",
    "effective_attention": "identifiable.attention",
    "iter_effective_attention": "identifiable.attention",
    "witness": "identifiable.attention",
    "attention_intervals": "identifiable.attention",
    "token_identifiability": "identifiable.experiments.tokens",
    "TokenIdentifiabilityResult": "identifiable.experiments.tokens",
    "ProbeConfig": "identifiable.tokens",
    "load_corpus": "identifiable.corpus",
    "Corpus": "identifiable.corpus",
}

if TYPE_CHECKING:
    from identifiable.errors import IdentifiableError
    from identifiable.models import Model, Trace, load_model

__all__ = ["IdentifiableError", "Model", "Trace", "__version__", "corpus", "load_model"]


def __getattr__(name: str) -> Any:
    if name == "corpus":
        return importlib.import_module("identifiable.corpus")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'identifiable' has no attribute '{name}'")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, "corpus"})
