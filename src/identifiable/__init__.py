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
    "reproduce": "identifiable.reproduction",
    "build_viewer": "identifiable.viewer_compute",
    "viewer_html": "identifiable.report",
    "hidden_token_attribution": "identifiable.attribution",
    "HTAResult": "identifiable.attribution",
    "load_corpus": "identifiable.corpus",
    "Corpus": "identifiable.corpus",
}

if TYPE_CHECKING:  # static types for the public API; runtime imports stay lazy
    from identifiable.attention import (
        attention_intervals,
        effective_attention,
        iter_effective_attention,
        null_space,
        witness,
    )
    from identifiable.attribution import HTAResult, hidden_token_attribution
    from identifiable.corpus import Corpus, load_corpus
    from identifiable.errors import IdentifiableError
    from identifiable.experiments.tokens import TokenIdentifiabilityResult, token_identifiability
    from identifiable.models import Model, Trace, load_model
    from identifiable.report import viewer_html
    from identifiable.reproduction import reproduce
    from identifiable.tokens import ProbeConfig
    from identifiable.viewer_compute import build_viewer

__all__ = [  # noqa: RUF022 - grouped by paper section, not alphabetically
    "__version__",
    "corpus",
    "IdentifiableError",
    "load_model",
    "Model",
    "Trace",
    "load_corpus",
    "Corpus",
    "null_space",
    "effective_attention",
    "iter_effective_attention",
    "witness",
    "attention_intervals",
    "token_identifiability",
    "TokenIdentifiabilityResult",
    "ProbeConfig",
    "hidden_token_attribution",
    "HTAResult",
    "reproduce",
    "build_viewer",
    "viewer_html",
]


def __getattr__(name: str) -> Any:
    if name == "corpus":
        return importlib.import_module("identifiable.corpus")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'identifiable' has no attribute '{name}'")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS, "corpus"})
