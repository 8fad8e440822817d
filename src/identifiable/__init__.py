"""identifiable: how far can you trust what a Transformer's attention and hidden states seem to say?

Implements "On Identifiability in Transformers" (Brunner et al., ICLR 2020) for
Hugging Face models. Every public name and every subpackage is an attribute of this
module (`idf.context_mixing`, `idf.attention`); they are imported on first use, so that
`import identifiable` and the CLI start fast. `dir(identifiable)` lists exactly
`__all__`. Layers, heads and tokens are numbered from 0 on every surface.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

# public name -> the module that defines it (grouped as docs/api/index.md is)
_EXPORTS: dict[str, str] = {
    # models and traces
    "load_model": "identifiable.models",
    "Model": "identifiable.models",
    "Seq2SeqModel": "identifiable.models",
    "Trace": "identifiable.models",
    "Seq2SeqTrace": "identifiable.models",
    "Encoding": "identifiable.models",
    "TruncationWarning": "identifiable.models",
    "RemoteCodeNotRun": "identifiable.models.loading",
    "ArchSpec": "identifiable.models",
    "register_spec": "identifiable.models",
    "discover_spec": "identifiable.models",
    "supported_model_types": "identifiable.models",
    "trace_from_lens": "identifiable.integrations.lens",
    "trace_from_nnsight": "identifiable.integrations.nnsight",
    # attention (Sec. 3) and its certificates
    "null_space": "identifiable.attention",
    "effective_attention": "identifiable.attention",
    "iter_effective_attention": "identifiable.attention",
    "constrained_attention": "identifiable.attention",
    "witness": "identifiable.attention",
    "attention_intervals": "identifiable.attention",
    "interval_map": "identifiable.attention",
    "NullSpace": "identifiable.attention",
    "EffectiveAttention": "identifiable.attention",
    "ConstrainedAttention": "identifiable.attention",
    "Witness": "identifiable.attention",
    "AttentionIntervals": "identifiable.attention",
    "IntervalMap": "identifiable.attention",
    # token identifiability (Sec. 4)
    "token_identifiability": "identifiable.experiments.tokens",
    "TokenIdentifiabilityResult": "identifiable.experiments.tokens",
    "ProbeConfig": "identifiable.tokens",
    # Hidden Token Attribution (Sec. 5) and context mixing
    "hidden_token_attribution": "identifiable.attribution",
    "HTAResult": "identifiable.attribution",
    "context_mixing": "identifiable.mixing",
    "MixingResult": "identifiable.mixing",
    # corpus
    "load_corpus": "identifiable.corpus",
    "Corpus": "identifiable.corpus",
    # training and comparison
    "null_attention_penalty": "identifiable.training",
    "finetune": "identifiable.runs.finetune",
    "FinetuneResult": "identifiable.runs.finetune",
    "compare": "identifiable.runs.compare",
    "Comparison": "identifiable.runs.compare",
    # report, viewer, result files, peers
    "reproduce": "identifiable.runs.reproduce",
    "Reproduction": "identifiable.runs.reproduce",
    "build_viewer": "identifiable.viewer.build",
    "viewer_html": "identifiable.viewer.page",
    "viewer_iframe": "identifiable.viewer.page",
    "viewer_fragment": "identifiable.viewer.page",
    "viewer_widget": "identifiable.viewer.widget",
    "load_result": "identifiable.results",
    "register_inseq": "identifiable.integrations.inseq",
    # errors
    "IdentifiableError": "identifiable.errors",
}

# names whose attribute in the defining module is spelled differently
_RENAMED = {"load_result": "load"}

SUBPACKAGES = (
    "attention",
    "attribution",
    "corpus",
    "experiments",
    "integrations",
    "mixing",
    "models",
    "report",
    "results",
    "runs",
    "store",
    "tokens",
    "training",
    "utils",
    "viewer",
)

if TYPE_CHECKING:  # static types for the public API; runtime imports stay lazy
    from typing import Any

    from identifiable import (
        attention,
        attribution,
        corpus,
        experiments,
        integrations,
        mixing,
        models,
        report,
        results,
        runs,
        store,
        tokens,
        training,
        utils,
        viewer,
    )
    from identifiable.attention import (
        AttentionIntervals,
        ConstrainedAttention,
        EffectiveAttention,
        IntervalMap,
        NullSpace,
        Witness,
        attention_intervals,
        constrained_attention,
        effective_attention,
        interval_map,
        iter_effective_attention,
        null_space,
        witness,
    )
    from identifiable.attribution import HTAResult, hidden_token_attribution
    from identifiable.corpus import Corpus, load_corpus
    from identifiable.errors import IdentifiableError
    from identifiable.experiments.tokens import TokenIdentifiabilityResult, token_identifiability
    from identifiable.integrations.inseq import register_inseq
    from identifiable.integrations.lens import trace_from_lens
    from identifiable.integrations.nnsight import trace_from_nnsight
    from identifiable.mixing import MixingResult, context_mixing
    from identifiable.models import (
        ArchSpec,
        Encoding,
        Model,
        Seq2SeqModel,
        Seq2SeqTrace,
        Trace,
        TruncationWarning,
        discover_spec,
        load_model,
        register_spec,
        supported_model_types,
    )
    from identifiable.models.loading import RemoteCodeNotRun
    from identifiable.results import load as load_result
    from identifiable.runs.compare import Comparison, compare
    from identifiable.runs.finetune import FinetuneResult, finetune
    from identifiable.runs.reproduce import Reproduction, reproduce
    from identifiable.tokens import ProbeConfig
    from identifiable.training import null_attention_penalty
    from identifiable.viewer.build import build_viewer
    from identifiable.viewer.page import viewer_fragment, viewer_html, viewer_iframe
    from identifiable.viewer.widget import viewer_widget

del TYPE_CHECKING  # only public names are attributes

__all__ = [  # noqa: RUF022 - grouped as the table above; a test checks the two agree
    "__version__",
    "attention",
    "attribution",
    "corpus",
    "experiments",
    "integrations",
    "mixing",
    "models",
    "report",
    "results",
    "runs",
    "store",
    "tokens",
    "training",
    "utils",
    "viewer",
    "load_model",
    "Model",
    "Seq2SeqModel",
    "Trace",
    "Seq2SeqTrace",
    "Encoding",
    "TruncationWarning",
    "RemoteCodeNotRun",
    "ArchSpec",
    "register_spec",
    "discover_spec",
    "supported_model_types",
    "trace_from_lens",
    "trace_from_nnsight",
    "null_space",
    "effective_attention",
    "iter_effective_attention",
    "constrained_attention",
    "witness",
    "attention_intervals",
    "interval_map",
    "NullSpace",
    "EffectiveAttention",
    "ConstrainedAttention",
    "Witness",
    "AttentionIntervals",
    "IntervalMap",
    "token_identifiability",
    "TokenIdentifiabilityResult",
    "ProbeConfig",
    "hidden_token_attribution",
    "HTAResult",
    "context_mixing",
    "MixingResult",
    "load_corpus",
    "Corpus",
    "null_attention_penalty",
    "finetune",
    "FinetuneResult",
    "compare",
    "Comparison",
    "reproduce",
    "Reproduction",
    "build_viewer",
    "viewer_html",
    "viewer_iframe",
    "viewer_fragment",
    "viewer_widget",
    "load_result",
    "register_inseq",
    "IdentifiableError",
]


def __getattr__(name: str) -> Any:
    import importlib

    if name in SUBPACKAGES:
        return importlib.import_module(f"identifiable.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'identifiable' has no attribute '{name}'")
    return getattr(importlib.import_module(module), _RENAMED.get(name, name))


def __dir__() -> list[str]:
    return sorted(__all__)
