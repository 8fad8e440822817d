"""A `Model`'s inputs: what users give (texts, pairs, token ids, images) as `Encoding`s in
the model's own format, and a batch of them as the forward pass's keyword arguments. The
work is the `InputEncoder`'s (models/encoding.py); these are its entry points on `Model`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from identifiable.models.encoding import Encoding, ModelInput
from identifiable.models.model_core import ModelCore


class ModelInputs(ModelCore):
    """`encode`, `encode_ids`, `encode_image` and `batch_inputs` of `Model`."""

    def encode(self, text: ModelInput, *, truncate: bool = True) -> Encoding:
        """Tokenise a text or a pair `(a, b)` in the model's own format (an image for
        vision models, see `encode_image`). Token ids and a `BatchEncoding` are accepted
        too, as by `trace`, so every analysis that encodes takes what `trace` takes."""
        return self.inputs.encode(text, truncate=truncate)

    def encode_ids(
        self, input_ids: Any, *, token_type_ids: Any = None, truncate: bool = True
    ) -> Encoding:
        """An `Encoding` of token ids you made yourself (list[int] or a 1-D integer tensor).

        The ids are used as given: no special tokens are added.
        """
        return self.inputs.encode_ids(input_ids, token_type_ids=token_type_ids, truncate=truncate)

    def encode_image(self, image: Any) -> Encoding:
        """An image as the model's tokens (see `InputEncoder.encode_image`)."""
        return self.inputs.encode_image(image)

    def batch_inputs(self, encs: Sequence[Encoding]) -> dict[str, torch.Tensor]:
        """The forward pass's keyword arguments for `encs`, padded, on the model's device."""
        return self.inputs.batch(encs, self.hf_model)
