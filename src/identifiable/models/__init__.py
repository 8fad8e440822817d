"""Model tracing: the only package that knows Hugging Face module names."""

from identifiable.models.devices import resolve_device
from identifiable.models.discover import Discovery, discover_spec
from identifiable.models.lens import trace_from_lens
from identifiable.models.loading import DEFAULT_MODEL, embedded_model_path, load_model
from identifiable.models.model import Encoding, Model, ModelInfo, TruncationWarning
from identifiable.models.seq2seq import SEQ2SEQ_SPECS, Seq2SeqModel, Seq2SeqSpec, Seq2SeqTrace
from identifiable.models.specs import (
    SPECS,
    ArchSpec,
    find_spec,
    spec_for,
    supported_model_types,
)
from identifiable.models.trace import Trace

__all__ = [
    "DEFAULT_MODEL",
    "SEQ2SEQ_SPECS",
    "SPECS",
    "ArchSpec",
    "Discovery",
    "Encoding",
    "Model",
    "ModelInfo",
    "Seq2SeqModel",
    "Seq2SeqSpec",
    "Seq2SeqTrace",
    "Trace",
    "TruncationWarning",
    "discover_spec",
    "embedded_model_path",
    "find_spec",
    "load_model",
    "resolve_device",
    "spec_for",
    "supported_model_types",
    "trace_from_lens",
]
