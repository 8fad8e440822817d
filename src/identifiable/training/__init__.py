"""Null-space-aware training (docs/training.md): a differentiable identifiability penalty.

- `null_attention_penalty(model, batch, layers=None, heads=None, variant="paper")`: the
  mean null fraction ‖A − A_eff‖² / ‖A‖² of the batch's attention rows, a scalar with
  gradients from the model's own forward pass.
- `NullAttentionTrainer`, `NullFractionCallback` (identifiable.training.hf): the same
  inside `transformers.Trainer`.
- `training.loop` holds the steps of label-free self-distillation with the penalty;
  the resumable run that writes a Hugging Face checkpoint is `identifiable.finetune`
  (identifiable/runs/finetune.py, a level above this package).
"""

from __future__ import annotations

import importlib
from typing import Any

from identifiable.training.penalty import VARIANTS, PenaltyResult, null_attention_penalty

_LAZY = {
    "NullAttentionTrainer": "identifiable.training.hf",
    "NullFractionCallback": "identifiable.training.hf",
}

__all__ = [
    "VARIANTS",
    "NullAttentionTrainer",
    "NullFractionCallback",
    "PenaltyResult",
    "null_attention_penalty",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'identifiable.training' has no attribute '{name}'")
    return getattr(importlib.import_module(module), name)
