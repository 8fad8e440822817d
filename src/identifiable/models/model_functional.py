"""A `Model` as functions for attribution: the embedding layer's output e^0, every layer's
hidden states as a differentiable function of e^0 (models/functional.py does the work),
the vocabulary's embeddings and placeholder pixels for passes driven by hooks."""

from __future__ import annotations

import torch

from identifiable.models import functional
from identifiable.models.model_core import ModelCore


class FunctionalView(ModelCore):
    """`vocabulary_embeddings`, `embed`, `layer_outputs` and `placeholder_pixels` of `Model`."""

    def vocabulary_embeddings(self) -> torch.Tensor:
        """`[V, d_emb]` the word-embedding matrix (no position or segment part), float32 on the CPU."""
        embeddings = self.hf_model.get_input_embeddings()  # type: ignore[operator]
        return embeddings.weight.detach().float().cpu()  # type: ignore[no-any-return]

    def embed(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        *,
        pixel_values: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """e^0 `[n, d]`: the embedding layer's output, i.e. the input of layer 1.

        Image models take `pixel_values` `[C, H, W]`; without it, the image of the
        last `encode` whose `input_ids` object this is (Hidden Token Attribution
        encodes, then embeds the same ids).
        """
        return functional.embed(
            self.hf_model, self.stack, self.inputs, input_ids, token_type_ids, pixel_values
        )

    def layer_outputs(self, e0: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """Hidden states of every layer as a differentiable function of e^0.

        Args:
            e0: `[n, d]` or `[B, n, d]`, fed to layer 1 in place of the embeddings.
            input_ids: `[n]`; only sets the sequence length and positions (RoPE, masks).
        Returns:
            `[L+1, n, d]` (or `[B, L+1, n, d]`); index 0 is e0 itself.
        Works under `torch.func.jvp`/`vmap` and autograd.
        """
        return functional.layer_outputs(self.hf_model, self.stack, self.inputs, e0, input_ids)

    def placeholder_pixels(self, batch: int, dtype: torch.dtype) -> torch.Tensor:
        """`[batch, C, H, W]` zeros of the model's image size, for passes whose layer inputs
        are replaced by hooks (the pixels only have to have the right size)."""
        return self.inputs.placeholder_pixels(batch, dtype, self.device)
