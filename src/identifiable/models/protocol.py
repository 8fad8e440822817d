"""What analyses need of a model: `ModelInfo` and the `TracedModel` protocol.

`identifiable.models.Model` satisfies `TracedModel` (so does `Seq2SeqModel.encoder`, a
plain `Model`). Code outside models/ that takes "a model" should annotate it with
`TracedModel` rather than `Any`: the type checker then sees every attribute it uses, and
a test double only has to provide these.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from identifiable.models.encoding import Encoding, ModelInput
from identifiable.models.specs import ArchSpec
from identifiable.models.stack import AttentionStack
from identifiable.models.trace import Trace


@dataclass(frozen=True)
class ModelInfo:
    """Sizes and names of a traced model (an encoder–decoder model: of its encoder)."""

    name: str
    architecture: str
    model_type: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_size: int
    max_positions: int
    is_causal: bool
    intermediate_size: int = 0  # MLP width, for memory estimates
    # "GGUF Q4_1" where the weights were dequantized from a quantized file, else ""
    dequantized_from: str = ""
    # hybrid stacks: the layers that are not softmax attention, in one line ("" if none)
    not_analysed: str = ""

    @classmethod
    def of_stack(
        cls, config: Any, stack: AttentionStack, name: str, max_positions: int
    ) -> ModelInfo:
        """The info of a model traced through one `stack` (`config`: the HF config; the
        MLP width falls back to 4 × hidden size where the spec's attribute is missing)."""
        spec = stack.spec
        return cls(
            name=name or str(getattr(config, "_name_or_path", "")),
            architecture=spec.name,
            model_type=str(config.model_type),
            n_layers=stack.n_layers,
            n_heads=stack.n_heads,
            n_kv_heads=stack.n_kv_heads,
            head_dim=stack.head_dim,
            hidden_size=stack.hidden_size,
            max_positions=max_positions,
            is_causal=spec.causal,
            intermediate_size=int(getattr(config, spec.mlp_width, None) or 4 * stack.hidden_size),
            dequantized_from=dequantized_label(config),
            not_analysed=stack.others_line(),
        )


def dequantized_label(config: Any) -> str:
    """ "GGUF Q4_1" for a config written by models/dequantize.py (its `dequantized_from`),
    else ""."""
    record = getattr(config, "dequantized_from", None)
    if not isinstance(record, dict):
        return ""
    return f"{record.get('format', '?')} {record.get('quantization', '?')}"


@runtime_checkable
class TracedModel(Protocol):
    """A model that traces one stack of attention: everything the analyses call."""

    info: ModelInfo
    hf_model: nn.Module
    stack: AttentionStack
    special_tokens: dict[str, str]

    @property
    def spec(self) -> ArchSpec: ...

    @property
    def layers(self) -> list[nn.Module]: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def modality(self) -> str: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def fingerprint(self) -> str: ...

    @property
    def kv_head_of(self) -> torch.Tensor: ...

    def encode(self, text: ModelInput, *, truncate: bool = True) -> Encoding: ...

    def batch_inputs(self, encs: Sequence[Encoding]) -> dict[str, torch.Tensor]: ...

    def trace(self, text: ModelInput, *, truncate: bool = True) -> Trace: ...

    def trace_many(
        self,
        texts: Iterable[ModelInput] | Any,
        *,
        batch_size: int = 8,
        truncate: bool = True,
        progress: bool = False,
    ) -> Iterator[Trace]: ...

    def iter_layers(
        self, text: ModelInput, *, truncate: bool = True
    ) -> Iterator[tuple[int, Trace]]: ...

    def key_mask(self, n: int) -> torch.Tensor: ...

    def embed(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        *,
        pixel_values: torch.Tensor | None = None,
    ) -> torch.Tensor: ...

    def layer_outputs(self, e0: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor: ...

    def placeholder_pixels(self, batch: int, dtype: torch.dtype) -> torch.Tensor: ...

    def vocabulary_embeddings(self) -> torch.Tensor: ...
