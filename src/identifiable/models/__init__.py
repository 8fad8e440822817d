"""Model tracing: the only package that knows Hugging Face module names."""

from identifiable.models.loading import DEFAULT_MODEL, embedded_model_path, load_model
from identifiable.models.model import Encoding, Model, ModelInfo, TruncationWarning
from identifiable.models.specs import SPECS, ArchSpec, spec_for, supported_model_types
from identifiable.models.trace import Trace

__all__ = [
    "DEFAULT_MODEL",
    "SPECS",
    "ArchSpec",
    "Encoding",
    "Model",
    "ModelInfo",
    "Trace",
    "TruncationWarning",
    "embedded_model_path",
    "load_model",
    "spec_for",
    "supported_model_types",
]
