"""Null-space-aware training (docs/training.md): a differentiable identifiability penalty.

- `null_attention_penalty(model, batch, layers=None, heads=None, variant="paper")`: the
  mean null fraction ‖A − A_eff‖² / ‖A‖² of the batch's attention rows, a scalar with
  gradients from the model's own forward pass.
- `NullAttentionTrainer`, `NullFractionCallback` (identifiable.training.hf): the same
  inside `transformers.Trainer`.
- `finetune` (identifiable.training.finetune): label-free self-distillation of a model
  with the penalty, resumable, writing a Hugging Face checkpoint.
"""

from __future__ import annotations

import importlib
from typing import Any

from identifiable.training.penalty import VARIANTS, PenaltyResult, null_attention_penalty

_LAZY = {
    "NullAttentionTrainer": "identifiable.training.hf",
    "NullFractionCallback": "identifiable.training.hf",
    "finetune": "identifiable.training.finetune",
    "FinetuneResult": "identifiable.training.finetune",
}

__all__ = [
    "VARIANTS",
    "FinetuneResult",
    "NullAttentionTrainer",
    "NullFractionCallback",
    "PenaltyResult",
    "finetune",
    "null_attention_penalty",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'identifiable.training' has no attribute '{name}'")
    return getattr(importlib.import_module(module), name)
