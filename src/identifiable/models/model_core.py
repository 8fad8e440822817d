"""What a `Model` holds (models/model.py builds it): the Hugging Face model, its
`AttentionStack`, its `InputEncoder` and its `ModelInfo`; the stack's parts under their
older names; the metadata each trace carries; and the one-line `repr`.

The other concerns of `Model` build on this core, one module each: `model_inputs`
(encoding), `model_memory` (memory planning), `model_tracing` (tracing) and
`model_functional` (the functional view for attribution).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from identifiable.models.capture import TraceMeta
from identifiable.models.discover import Discovery
from identifiable.models.encoding import InputEncoder
from identifiable.models.fingerprint import model_fingerprint
from identifiable.models.protocol import ModelInfo
from identifiable.models.specs import ArchSpec
from identifiable.models.stack import AttentionStack


class ModelCore:
    """The parts of a `Model` (set by `Model.__init__`) and what is read off them."""

    task_model: nn.Module
    hf_model: nn.Module
    stack: AttentionStack
    inputs: InputEncoder
    info: ModelInfo
    discovery: Discovery | None
    attention: str
    recompute_error: float | None
    special_tokens: dict[str, str]

    # ---- the parts, by their old names ----------------------------------------------
    @property
    def spec(self) -> ArchSpec:
        return self.stack.spec

    @property
    def layers(self) -> list[nn.Module]:
        return self.stack.layers

    @property
    def windows(self) -> list[int | None]:
        return self.stack.windows

    @property
    def kv_head_of(self) -> torch.Tensor:
        return self.stack.kv_head_of

    @property
    def modality(self) -> str:
        return self.stack.spec.modality

    @property
    def tokenizer(self) -> Any:
        return self.inputs.tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        self.inputs.tokenizer = value

    @property
    def image_processor(self) -> Any:
        return self.inputs.image_processor

    @property
    def device(self) -> torch.device:
        return next(self.hf_model.parameters()).device

    @property
    def meta(self) -> TraceMeta:
        """What each trace of this model says about it."""
        i = self.info
        return TraceMeta(i.name, self.spec.name, dict(self.special_tokens), i.dequantized_from)

    def __repr__(self) -> str:
        info = self.info
        kv = f" ({info.n_kv_heads} key/value)" if info.n_kv_heads != info.n_heads else ""
        dtype = str(next(self.hf_model.parameters()).dtype).removeprefix("torch.")
        return (
            f"Model({info.name!r}, family={info.architecture!r}, layers={info.n_layers}, "
            f"heads={info.n_heads}{kv}, head_dim={info.head_dim}, dtype={dtype}, "
            f"device={self.device})" + (f"; {info.not_analysed}" if info.not_analysed else "")
        )

    @property
    def fingerprint(self) -> str:
        """Stable id of config + every weight, for keying caches (models/fingerprint.py)."""
        return model_fingerprint(self.hf_model)
