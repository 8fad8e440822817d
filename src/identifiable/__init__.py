"""identifiable: how far can you trust what a Transformer's attention and hidden states seem to say?

Implements "On Identifiability in Transformers" (Brunner et al., ICLR 2020) for
Hugging Face models. Every public name and every subpackage is an attribute of this
module (`idf.context_mixing`, `idf.attention`); they are imported on first use, so that
`import identifiable` and the CLI start fast. `dir(identifiable)` lists exactly
`__all__`. Layers, heads and tokens are numbered from 0 on every surface.
"""

from __future__ import annotations

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
    "sink_mass": "identifiable.attention",
    "attention_posterior": "identifiable.attention",
    "NullSpace": "identifiable.attention",
    "EffectiveAttention": "identifiable.attention",
    "ConstrainedAttention": "identifiable.attention",
    "Witness": "identifiable.attention",
    "AttentionIntervals": "identifiable.attention",
    "IntervalMap": "identifiable.attention",
    "SinkMass": "identifiable.attention",
    "AttentionPosterior": "identifiable.attention",
    # whole-model scans
    "scan": "identifiable.runs.scan",
    "ScanResult": "identifiable.attention",
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

# One table, three uses: `__all__` below, the lazy lookup in `__getattr__`, and the static
# stub __init__.pyi that type checkers read (written by scripts/public_names.py; a test
# fails while the two disagree).
__all__ = ["__version__", *SUBPACKAGES, *_EXPORTS]


def __getattr__(name: str) -> object:
    import importlib

    if name in SUBPACKAGES:
        return importlib.import_module(f"identifiable.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'identifiable' has no attribute '{name}'")
    return getattr(importlib.import_module(module), _RENAMED.get(name, name))


def __dir__() -> list[str]:
    return sorted(__all__)
