"""A `Model`'s memory planning: the bytes a trace will take (models/budget.py's formula,
docs/families.md, 'Memory and streaming') and the one-line refusal of a trace over its
budget, before the forward pass."""

from __future__ import annotations

from collections.abc import Sequence

from identifiable.models import backends, budget
from identifiable.models.model_core import ModelCore


class MemoryPlanning(ModelCore):
    """`memory_plan` and `check_memory` of `Model`."""

    def memory_plan(
        self, n: int, n_layers: int, heads: Sequence[int] | None, *, streaming: bool = False
    ) -> budget.TracePlan:
        """The bytes a trace of n tokens, `n_layers` layers and `heads` (None: all) takes
        (models/budget.py, docs/families.md, 'Memory and streaming')."""
        info = self.info
        shape = budget.Shape(
            info.n_heads,
            info.n_kv_heads,
            info.head_dim,
            info.hidden_size,
            info.intermediate_size or 4 * info.hidden_size,
            next(self.hf_model.parameters()).element_size(),
        )
        return budget.plan(
            shape,
            n,
            n,
            layers=n_layers,
            heads=info.n_heads if heads is None else len(heads),
            eager=self.attention == "eager",
            streaming=streaming,
            masked=any(w is not None for w in self.windows),
            shared_out_proj=heads is None and self.stack.has_out_proj(),
            gpu=self.device.type == "cuda",
        )

    def check_memory(
        self,
        n: int,
        n_layers: int,
        heads: Sequence[int] | None,
        memory_budget: int | None,
        what: str,
        *,
        streaming: bool = False,
        batch: int = 1,
    ) -> None:
        """Refuse in one line a trace over `memory_budget` bytes (None: available memory);
        `batch` sequences padded to n tokens take `batch` times one's bytes (on a GPU: as
        for `trace`)."""
        one = self.memory_plan(n, n_layers, heads, streaming=streaming)
        eager = self.attention == "eager"  # advise sdpa only where maps can be recomputed
        sdpa = eager and backends.why_not_recomputed(self.hf_model, self.stack) is None
        budget.check_trace(one, memory_budget, what, n, batch, self.device, sdpa)
