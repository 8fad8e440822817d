"""The penalty inside `transformers.Trainer`.

- `NullAttentionTrainer(..., penalty_weight=0.1)`: the Trainer's own loss (labels, label
  smoothing, gradient accumulation all as usual) plus w · the null-attention penalty of
  the same forward pass; its logs gain `null_fraction` (mean over the steps since the
  last log) and `task_loss`. Works on peft models: only the adapters' parameters are
  trainable there, so only they move.
- `NullFractionCallback(batch)`: for any Trainer, measures the null fraction of a fixed
  batch at every log (no gradients, eval mode) and records it in the log history as
  `null_fraction_probe` (also in `callback.history`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from identifiable.training.capture import as_model, capture
from identifiable.training.loop import check_weight
from identifiable.training.penalty import (
    VARIANTS,
    Heads,
    null_attention_penalty,
    penalty_from_capture,
    select_heads,
)


class NullAttentionTrainer(Trainer):
    """`transformers.Trainer` whose loss adds `penalty_weight` · the null-attention penalty."""

    def __init__(
        self,
        *args: Any,
        penalty_weight: float = 0.1,
        penalty_layers: Sequence[int] | None = None,
        penalty_heads: Heads = None,
        penalty_variant: str = "paper",
        **kwargs: Any,
    ) -> None:
        self.penalty_weight = check_weight(penalty_weight, "penalty_weight", None)
        if penalty_variant not in VARIANTS:
            from identifiable.errors import IdentifiableError

            raise IdentifiableError(
                f"penalty_variant must be one of {', '.join(VARIANTS)}, got {penalty_variant!r}"
            )
        super().__init__(*args, **kwargs)
        self.penalty_layers, self.penalty_heads = penalty_layers, penalty_heads
        self.penalty_variant = penalty_variant
        self._since_log: dict[str, list[float]] = {"null_fraction": [], "task_loss": []}

    def compute_loss(
        self,
        model: Any,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        m = as_model(self.accelerator.unwrap_model(model))
        chosen = select_heads(m, self.penalty_layers, self.penalty_heads)
        with capture(m) as got:
            loss, outputs = super().compute_loss(
                model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch
            )
        result = penalty_from_capture(
            m, got, inputs.get("attention_mask"), chosen, self.penalty_variant
        )
        total = loss + self.penalty_weight * result.penalty.to(loss.dtype)
        if model.training:
            self._since_log["null_fraction"].append(float(result.penalty.detach()))
            self._since_log["task_loss"].append(float(loss.detach()))
        return (total, outputs) if return_outputs else total

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if "loss" in logs:
            for key, values in self._since_log.items():
                if values:
                    logs[key] = sum(values) / len(values)
                    values.clear()
            logs["penalty_weight"] = self.penalty_weight
        super().log(logs, *args, **kwargs)


class NullFractionCallback(TrainerCallback):
    """Logs the null fraction of a fixed batch (a BatchEncoding or texts) at every log."""

    def __init__(
        self, batch: Any, layers: Sequence[int] | None = None, variant: str = "paper"
    ) -> None:
        self.batch, self.layers, self.variant = batch, layers, variant
        self.history: list[dict[str, Any]] = []

    def measure(self, model: Any) -> dict[str, Any]:
        """Null fraction (mean and per layer) of the batch, in eval mode, without gradients."""
        modes = {mod: mod.training for mod in model.modules()}
        model.eval()
        try:
            with torch.no_grad():
                r = null_attention_penalty(
                    model, self.batch, self.layers, variant=self.variant, return_outputs=True
                )
        finally:
            for mod, mode in modes.items():
                mod.training = mode
        return {"null_fraction": float(r.penalty), "per_layer": r.per_layer.tolist()}

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        model = kwargs.get("model")
        if model is None or logs is None or "loss" not in logs:  # training logs only
            return
        got = self.measure(model)
        self.history.append({"step": state.global_step, **got})
        logs["null_fraction_probe"] = got["null_fraction"]
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1]["null_fraction_probe"] = got["null_fraction"]
