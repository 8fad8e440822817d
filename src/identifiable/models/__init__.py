"""Model tracing: the only package that knows Hugging Face module names."""

from identifiable.models.devices import resolve_device
from identifiable.models.discover import Discovery, discover_spec
from identifiable.models.loading import DEFAULT_MODEL, embedded_model_path, load_model
from identifiable.models.model import Encoding, Model, ModelInfo, Seq2SeqModel, TruncationWarning
from identifiable.models.protocol import TracedModel
from identifiable.models.quirks import Axes, BlockOutput, LayerGroups, Segments, Tower
from identifiable.models.specs import (
    SEQ2SEQ_SPECS,
    SPECS,
    ArchSpec,
    NormLayout,
    NormRule,
    Seq2SeqSpec,
    find_spec,
    register_spec,
    spec_for,
    supported_model_types,
)
from identifiable.models.stack import AttentionStack
from identifiable.models.trace import Seq2SeqTrace, Trace

__all__ = [
    "DEFAULT_MODEL",
    "SEQ2SEQ_SPECS",
    "SPECS",
    "ArchSpec",
    "AttentionStack",
    "Axes",
    "BlockOutput",
    "Discovery",
    "Encoding",
    "LayerGroups",
    "Model",
    "ModelInfo",
    "NormLayout",
    "NormRule",
    "Segments",
    "Seq2SeqModel",
    "Seq2SeqSpec",
    "Seq2SeqTrace",
    "Tower",
    "Trace",
    "TracedModel",
    "TruncationWarning",
    "discover_spec",
    "embedded_model_path",
    "find_spec",
    "load_model",
    "register_spec",
    "resolve_device",
    "spec_for",
    "supported_model_types",
]
