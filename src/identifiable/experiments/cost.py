"""What a run will cost, said before it starts: minutes per stage and the memory it holds.

Both come from the model's sizes (layers L, width d, feed-forward width, heads) and the
budget, never from running anything:

- time: each stage's arithmetic (the forward passes it traces, the probe fits of Fig. 2)
  times a rate measured on a 2-core x86 machine (benchmarks/bench_base_reproduction.py;
  the rates and the runs they come from are in benchmarks/records/base_reproduction.md),
  divided by the threads that share it. Probe fits count the steps they took on the
  embedded model, whose trained hidden states are harder to fit than a random model's;
- memory: the hidden states the Fig. 2 stage holds (`[tokens, L + 1, d]` float32), the
  model's weights and one layer's probe fits per worker thread.

The figures are estimates for a quiet machine: under load, or on a slower CPU, a run
takes longer. `reproduce` and `tokens` print them before any work starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from identifiable.errors import IdentifiableError
from identifiable.tokens.adam import native_bfloat16
from identifiable.tokens.probes import ProbeConfig

# CPU seconds per unit of work, measured (see the module docstring)
TRACE_S_PER_GFLOP = 0.026  # a traced forward pass, captures and checks included
PROBE_S_PER_GFLOP = 0.016  # probe fits: float32 products and their bookkeeping, one thread
# Forward-mode products (HTA, the mixing methods): CPU seconds per layer and per unit of
# work (one probe's pass over one token of an n-token sequence, 3 passes a probe), a fixed
# part and a part per GFLOP of one layer's products per token; each stage's pair fitted on
# its quick-run CPU seconds on BERT-base and MiniLM (base_reproduction_posterior_compiled.json)
JVP_S = {"attribution": (1.93e-5, 2.81e-3), "mixing": (0.49e-5, 2.95e-3)}
STAGE_FIXED_S = {"attention": 4.0, "tokens": 2.0, "attribution": 2.0, "mixing": 2.0}
CERTIFY_S_PER_HEAD_ROW = 0.028  # one query row's interval map, per head and sequence
# one query row's posterior (200 effective samples, split-R̂ ≤ 1.01, its certificates and
# references included) at dim P = 12 and head width 64 with the compiled billiard walk, and
# the growth of its cost with dim P and the head width (the quick runs of BERT-base and
# MiniLM, benchmarks/records/base_reproduction.md); the stage's sequences bound dim P
# (`posterior_null_dim`)
POSTERIOR_S_PER_HEAD_ROW, POSTERIOR_DIM, POSTERIOR_EXPONENT = 0.051, 12, 1.0
POSTERIOR_WIDTH, POSTERIOR_WIDTH_EXPONENT = 64, 0.7
REPORT_S = 12.0  # figures, tables and the page
LOAD_S = 10.0  # importing and loading the model and corpus
# Fig. 2 probe work per layer, in passes over the training tokens (the embedded model's
# quick-budget fits): L-BFGS loss-and-gradient evaluations of linear-cos over both starts,
# and Adam minibatch steps of the two MLPs (each ~ a twentieth of a pass at 8,192 tokens)
LBFGS_EVALUATIONS = 120
ADAM_STEPS = 1100
# Adam steps grow with the early-stopping tail: on MiniLM's six layers the steps of patience
# p and d learning-rate decays were sqrt((d + 1)·p / 15) of those of p = 5, d = 2 (0.78 at
# p = 3, d = 2; 0.63 at p = 3, d = 1); bfloat16 products (`tokens.adam.training_dtype`) take
# 0.57 of an Adam step's float32 CPU time on an AMX CPU (MiniLM 0.56, BERT-base 0.59)
BFLOAT16_ADAM_SHARE = 0.57
TRAIN_SHARE = 0.72  # of the extracted tokens (test 20 %, validation 10 % of the rest)


@dataclass(frozen=True)
class Sizes:
    """The sizes a cost depends on."""

    n_layers: int
    hidden: int
    ffn: int
    n_heads: int

    @classmethod
    def of(cls, model: Any) -> Sizes:
        info = model.info
        ffn = getattr(info, "intermediate_size", None) or 4 * info.hidden_size
        return cls(int(info.n_layers), int(info.hidden_size), int(ffn), int(info.n_heads))

    def gflop_per_token(self) -> float:
        """Forward GFLOP per token of the layers' products (attention scores excluded)."""
        d = self.hidden
        return 2 * self.n_layers * (4 * d * d + 2 * d * self.ffn) / 1e9


def probe_gflop_per_layer(
    sizes: Sizes,
    tokens: int,
    mlp_width: int,
    cap: int | None = None,
    batch: int = 256,
    adam_share: float = 1.0,
) -> float:
    """GFLOP of one layer's Fig. 2 fits: L-BFGS on linear-cos (a product and its gradient,
    4·N·d² per evaluation) and Adam on the two MLPs (5 products of B·d·h per step, times
    `adam_share`: the schedule's and the precision's), at most what a step cap `cap` allows."""
    d, n = sizes.hidden, tokens * TRAIN_SHARE
    evaluations, steps = float(LBFGS_EVALUATIONS), float(ADAM_STEPS) * adam_share
    if cap:  # two starts of about 1.3 evaluations an iteration; two MLPs, two learning rates
        evaluations, steps = min(evaluations, 2.6 * cap), min(steps, 6 * cap)
    lbfgs = evaluations * 4 * n * d * d
    adam = steps * 10 * batch * d * mlp_width
    closed = 4 * n * d * d + 10 * d**3  # Gram matrices, eigendecomposition, solves
    return (lbfgs + adam + closed) / 1e9


def stage_cpu_seconds(sizes: Sizes, budget: Any) -> dict[str, float]:
    """CPU seconds of each stage of `reproduce` with `budget` (on one thread)."""
    per_token = sizes.gflop_per_token() * TRACE_S_PER_GFLOP
    n = budget.max_tokens
    attention = budget.attention_sequences * n * per_token
    tokens = budget.token_max_tokens * per_token + sizes.n_layers * probe_seconds(
        sizes, budget.token_max_tokens, budget
    )
    # Hidden Token Attribution: `probes` forward-mode products per token, each ~3 passes
    probes = budget.attribution_probes or sizes.hidden
    attribution = budget.attribution_sequences * probes * 3 * budget.attribution_max_tokens**2
    mixing_probes = budget.mixing_probes or sizes.hidden
    mixing = budget.mixing_sequences * mixing_probes * 3 * budget.mixing_max_tokens**2
    rows = budget.certify_sequences * budget.certify_rows_per_head
    return {
        "attention": STAGE_FIXED_S["attention"] + attention,
        "tokens": STAGE_FIXED_S["tokens"] + tokens,
        "attribution": STAGE_FIXED_S["attribution"]
        + jvp_seconds(sizes, attribution, "attribution"),
        "mixing": STAGE_FIXED_S["mixing"] + jvp_seconds(sizes, mixing, "mixing"),
        "certify": rows * sizes.n_layers * sizes.n_heads * CERTIFY_S_PER_HEAD_ROW,
        "posterior": posterior_seconds(sizes, budget),
    }


def jvp_seconds(sizes: Sizes, units: float, stage: str) -> float:
    """CPU seconds of `units` forward-mode passes (probe × token × key) through every layer."""
    fixed, per_gflop = JVP_S[stage]
    return units * sizes.n_layers * (fixed + per_gflop * sizes.gflop_per_token() / sizes.n_layers)


def posterior_seconds(sizes: Sizes, budget: Any) -> float:
    """CPU seconds of the posterior stage: its sampled rows (every head of every layer) at
    the cost of a row of the largest dim P the length cap allows. Fewer than ~200 effective
    samples save little: split-R̂ ≤ 1.01 needs about that many."""
    dim = min(budget.posterior_null_dim, budget.max_tokens - sizes.hidden // sizes.n_heads)
    growth = max(1.0, dim / POSTERIOR_DIM) ** POSTERIOR_EXPONENT
    growth *= (sizes.hidden / sizes.n_heads / POSTERIOR_WIDTH) ** POSTERIOR_WIDTH_EXPONENT
    per_row = POSTERIOR_S_PER_HEAD_ROW * max(1.0, budget.posterior_samples / 200) * growth
    rows = budget.posterior_sequences * budget.posterior_rows_per_head
    return rows * sizes.n_layers * sizes.n_heads * per_row


def probe_seconds(sizes: Sizes, tokens: int, budget: Any = None) -> float:
    """CPU seconds of one layer's Fig. 2 probe fits on `tokens` extracted tokens, on this
    machine's CPU (bfloat16 Adam products where it has them natively)."""
    width = getattr(budget, "probe_mlp_width", None) or max(512, 2 * sizes.hidden)
    cap = getattr(budget, "probe_max_steps", None)
    share = adam_schedule_share(budget)
    if native_bfloat16(torch.device("cpu")):
        share *= BFLOAT16_ADAM_SHARE
    return probe_gflop_per_layer(sizes, tokens, int(width), cap, adam_share=share) * (
        PROBE_S_PER_GFLOP
    )


def adam_schedule_share(budget: Any) -> float:
    """The Adam steps of a budget's early-stopping schedule against the defaults' (patience
    5, two learning-rate decays): sqrt((decays + 1)·patience / 15), fitted on MiniLM."""
    default = ProbeConfig()
    patience = getattr(budget, "probe_patience", None)
    decays = getattr(budget, "probe_lr_decays", None)
    patience = default.patience if patience is None else patience
    decays = default.lr_decays if decays is None else decays
    tail = (default.lr_decays + 1) * default.patience
    return math.sqrt(max(1, (decays + 1) * patience) / tail)


@dataclass(frozen=True)
class Estimate:
    """Wall seconds of a run on `threads` threads, per stage and in all."""

    stages: dict[str, float]
    threads: int

    @property
    def total_s(self) -> float:
        return sum(self.stages.values())

    def left(self, done: dict[str, float]) -> Estimate:
        """What is left once each stage's share `done[name]` (0 to 1) of its work is done."""
        return Estimate(
            {k: v * (1.0 - min(1.0, max(0.0, done.get(k, 0.0)))) for k, v in self.stages.items()},
            self.threads,
        )

    def sentence(self, what: str) -> str:
        """'… : about 5 min on 2 threads (Fig. 2 about 2 min)'."""
        main = f"{what}: about {minutes(self.total_s)} on {self.threads} thread"
        main += "s" if self.threads != 1 else ""
        fig2 = self.stages.get("tokens")
        if fig2 is not None and len(self.stages) > 2:
            main += f" (Fig. 2 about {minutes(fig2)})"
        return main


def minutes(seconds: float) -> str:
    """A rounded duration: '40 s', '3 min', '1.5 h'."""
    if seconds < 90:
        return f"{max(10, round(seconds / 10) * 10):.0f} s"
    if seconds < 90 * 60:
        return f"{math.ceil(seconds / 60):.0f} min"
    return f"{seconds / 3600:.1f} h"


def reproduce_estimate(model: Any, budget: Any, threads: int) -> Estimate:
    """The wall time of `reproduce` with `budget` on `threads` threads."""
    sizes = Sizes.of(model)
    cpu = stage_cpu_seconds(sizes, budget)
    wall = {name: seconds / max(1, threads) for name, seconds in cpu.items()}
    wall |= {"load": LOAD_S, "report": REPORT_S}
    return Estimate(wall, threads)


def tokens_estimate(model: Any, max_tokens: int, n_layers: int, threads: int) -> Estimate:
    """The wall time of `tokens` on `max_tokens` tokens and `n_layers` probed layers."""
    sizes = Sizes.of(model)
    extraction = max_tokens * sizes.gflop_per_token() * TRACE_S_PER_GFLOP
    probes = n_layers * probe_seconds(sizes, max_tokens)
    wall = {"load": LOAD_S, "tokens": (extraction + probes) / max(1, threads)}
    return Estimate(wall, threads)


def memory_bytes(model: Any, max_tokens: int, workers: int) -> int:
    """Bytes the Fig. 2 stage holds: the hidden states `[tokens, L + 1, d]` float32, the
    model's weights, and per worker one layer's inputs, Gram matrix and two MLPs with Adam
    state."""
    sizes = Sizes.of(model)
    d, h = sizes.hidden, max(512, 2 * sizes.hidden)
    states = max_tokens * (sizes.n_layers + 1) * d * 4
    weights = sum(p.numel() * p.element_size() for p in model.hf_model.parameters())
    per_worker = 4 * max_tokens * d * 4 + 3 * d * d * 8 + 2 * 4 * (2 * d * h) * 4
    return states + weights + workers * per_worker


def check_memory(needed: int, available: int | None, what: str, smaller: str) -> None:
    """Refuse, in one line, a run that needs more memory than is available."""
    if available is None or needed <= available:
        return
    raise IdentifiableError(
        f"{what} needs about {needed / 2**30:.1f} GiB of memory and "
        f"{available / 2**30:.1f} GiB is available; {smaller}"
    )
