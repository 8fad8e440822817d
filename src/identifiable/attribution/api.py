"""Hidden Token Attribution of a text through a loaded `Model` (docs/definitions.md#hta).

Only Model-facing glue lives here: `model.encode`, `model.embed` and
`model.layer_outputs`; the maths is in `jacobian.py` and `contributions.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from identifiable.attribution.contributions import contribution_stderr, contributions
from identifiable.attribution.jacobian import Pace, ProgressFn, jacobian_sq_norms
from identifiable.attribution.memory import DEFAULT_MEMORY_BUDGET, ModelDims, plan_chunk_size
from identifiable.errors import IdentifiableError, seconds
from identifiable.models.arguments import check_model
from identifiable.models.protocol import TracedModel
from identifiable.results import Result
from identifiable.utils.checks import count, number
from identifiable.utils.progress import task_bar, watching
from identifiable.utils.seeds import SEED_MAX

TextOrPair = str | tuple[str, str]


@dataclass
class HTAResult(
    Result,
    # query: the hidden token i, key: the input token j; layer l is e^{l+1}, the output of
    # block l (0-based, as every surface numbers layers), so tables join on `layer`
    dims={
        "contributions": ("layer", "query", "key"),
        "stderr": ("layer", "query", "key"),
        "sq_norms": ("layer", "query", "key"),
        "sq_norms_stderr": ("layer", "query", "key"),
        "input_ids": ("token",),
        "special": ("token",),
    },
    plot={"fields": ("contributions",), "layer": -1},
    summary=("probes",),
):
    """Contributions of every input token to every hidden token, at every layer's output.

    Layer l (0-based) is the hidden state e^{l+1} that block l writes; the paper's layer l
    is our layer l - 1.

    Attributes:
        contributions: `[L, n, n]` c^{l+1}_{i,j} indexed [l, i, j]; rows sum to 1.
        stderr: `[L, n, n]` delta-method standard error of `contributions`
            (estimator only; None in exact mode).
        sq_norms: `[L, n, n]` ‖∂e^l_i/∂x_j‖_F² (exact, or the unbiased estimate).
        sq_norms_stderr: `[L, n, n]` standard error of `sq_norms` (estimator only).
        tokens: the n token strings; input_ids `[n]`.
        special: `[n]` bool, positions holding the model's special tokens ([CLS], [SEP], …).
        probes: k, or None for exact mode; seed: the probes' seed.
        n_jvps, chunk_size, seconds: cost of the run.
    """

    contributions: torch.Tensor
    stderr: torch.Tensor | None
    sq_norms: torch.Tensor
    sq_norms_stderr: torch.Tensor | None
    tokens: list[str]
    input_ids: torch.Tensor
    special: torch.Tensor
    probes: int | None
    seed: int
    n_jvps: int
    chunk_size: int
    seconds: float
    model_name: str = ""
    is_causal: bool = False
    truncated: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return int(self.contributions.shape[0])

    @property
    def n_tokens(self) -> int:
        return int(self.contributions.shape[1])

    def own_contribution(self) -> torch.Tensor:
        """`[L, n]` c^l_{i,i}."""
        return torch.diagonal(self.contributions, dim1=-2, dim2=-1)

    def interval(self, level: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
        """`[L, n, n]` lower and upper ends of a `level` interval around each contribution
        (estimator only): ± t · stderr, t the Student quantile with k − 1 degrees of
        freedom (k probes), since the variance comes from the same k probes. Calibration
        against exact HTA: docs/definitions.md#hta."""
        from scipy.stats import t as student

        if self.stderr is None or self.probes is None or self.probes < 2:
            raise IdentifiableError(
                "an interval needs the estimator with at least 2 probes (exact mode has no "
                "error; probes=1 has no variance estimate): pass probes=k with k ≥ 2"
            )
        if not 0 < level < 1:
            raise IdentifiableError(f"level must be between 0 and 1, got {level}")
        half = float(student.ppf((1 + level) / 2, self.probes - 1)) * self.stderr
        return self.contributions - half, self.contributions + half

    def top_contributor(self) -> torch.Tensor:
        """`[L, n]` argmax_j c^l_{i,j} (lowest j on ties)."""
        return self.contributions.argmax(-1)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: per layer, each token's own share and top contributor."""
        own, top = self.own_contribution(), self.top_contributor()
        layers = []
        for layer in range(self.n_layers):
            layers.append(
                {
                    "layer": layer,
                    "median_own_contribution": float(own[layer].median()),
                    "tokens": [
                        {
                            "position": i,
                            "token": self.tokens[i],
                            "own": float(own[layer, i]),
                            "top_contributor": int(top[layer, i]),
                            "top_contributor_token": self.tokens[int(top[layer, i])],
                            "top_share": float(self.contributions[layer, i, top[layer, i]]),
                        }
                        for i in range(self.n_tokens)
                    ],
                }
            )
        return {
            "model": self.model_name,
            "mode": "exact"
            if self.probes is None
            else f"estimated ({self.probes} probes, seed {self.seed})",
            "tokens": self.tokens,
            "n_jvps": self.n_jvps,
            "seconds": self.seconds,
            "truncated": self.truncated,
            "contributions": self.contributions.tolist(),
            "stderr": None if self.stderr is None else self.stderr.tolist(),
            "layers": layers,
        }


def model_dims(model: TracedModel) -> ModelDims:
    """Sizes for the memory estimate; d_ff = 4d when the model does not say."""
    info = model.info
    d_ff = getattr(info, "intermediate_size", None) or 4 * info.hidden_size
    return ModelDims(info.n_layers, info.n_heads, info.hidden_size, int(d_ff))


def _check_plan(
    model: TracedModel, n: int, probes: int | None, budget: int, chunk_size: int | None
) -> None:
    """The memory plan of `jacobian.jacobian_sq_norms`, decided from the formula before the
    embedding or any layer runs (a refusal costs the tokenisation only)."""
    dims = model_dims(model)
    k = dims.hidden_size if probes is None else probes
    if not isinstance(k, int) or not 1 <= k <= dims.hidden_size:
        return  # ProbeBank names the bad probe count, before any model call
    what = "exact Hidden Token Attribution" if probes is None else f"{k}-probe estimation"
    itemsize = _itemsize(model)
    plan_chunk_size(n, dims, itemsize, n * k, budget, chunk_size, what=what)


def _itemsize(model: TracedModel) -> int:
    hf = getattr(model, "hf", None) or getattr(model, "hf_model", None)
    try:
        return int(next(hf.parameters()).element_size())  # type: ignore[union-attr]
    except (AttributeError, StopIteration, TypeError):
        return 4


def special_mask(model: TracedModel, input_ids: torch.Tensor) -> torch.Tensor:
    """`[n]` bool: positions whose id is one of the tokenizer's special tokens."""
    ids = getattr(model.tokenizer, "all_special_ids", None) or []
    return torch.isin(input_ids, torch.tensor(list(ids), dtype=input_ids.dtype))


_interactive = watching  # a seam for the tests


@contextmanager
def _progress_bar(enabled: bool, description: str) -> Iterator[ProgressFn | None]:
    if not enabled:
        yield None
        return
    with task_bar(description) as bar:
        yield bar.update


def _refusal(budget: float) -> Callable[[float, int, int], IdentifiableError]:
    def refuse(estimate: float, done: int, total: int) -> IdentifiableError:
        head = (
            f"hidden_token_attribution needs about {seconds(estimate)} ({total} JVPs, "
            f"{done} of them run), more than the time budget of {budget:g} s: raise "
        )
        return IdentifiableError(
            head + "time_budget= or pass fewer probes (probes=k; k = 1 is the cheapest)",
            cli=head + "--time-budget or pass fewer probes (--probes K)",
        )

    return refuse


def hidden_token_attribution(
    model: TracedModel,
    text: TextOrPair,
    probes: int | None = None,
    *,
    seed: int = 0,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    chunk_size: int | None = None,
    truncate: bool = True,
    progress: bool | Callable[[int, int], None] | None = None,
    time_budget: float | None = None,
) -> HTAResult:
    """Contribution c^l_{i,j} of each input token j to each hidden token i, every layer.

    Args:
        model: an `identifiable.models.Model`.
        text: a text or a pair (a, b), tokenised in the model's own format.
        probes: None for exact mode (n·d JVPs), or k in 1..d for the unbiased k-probe
            estimator of the squared norms (n·k JVPs, with standard errors).
        seed: seed of the random probes.
        memory_budget: bytes a chunk of JVPs may use; checked before any work starts.
        chunk_size: tangents per batch (default: the most the budget allows).
        truncate: cut texts longer than the model's maximum (else raise).
        progress: show a rich progress bar on stderr (True), none (False), or call this
            function with (done, total). None (the default): a bar for exact mode (n·d
            JVPs, seconds to minutes) in an interactive session (a terminal or Jupyter).
        time_budget: seconds; a few timed JVPs price the rest, and a run that will not fit
            is refused at once, with its estimate (an overrun stops at the budget + 5 %).
    """
    check_model(model)
    count(seed, "seed", "--seed", minimum=0, maximum=SEED_MAX)
    count(memory_budget, "memory_budget")
    if chunk_size is not None:
        count(chunk_size, "chunk_size")
    if time_budget is not None:
        number(time_budget, "time_budget", "--time-budget", low_open=True)
    start = time.perf_counter()
    enc = model.encode(text, truncate=truncate)
    input_ids = enc.input_ids
    _check_plan(model, len(input_ids), probes, memory_budget, chunk_size)
    e0 = model.embed(input_ids, getattr(enc, "token_type_ids", None))
    ids_dev = input_ids.to(e0.device)

    def f(x: torch.Tensor) -> torch.Tensor:
        return model.layer_outputs(x, ids_dev)

    label = "exact attribution" if probes is None else f"attribution, {probes} probes"
    show = progress is True or (progress is None and probes is None and _interactive())
    with _progress_bar(show, label) as bar:
        callback = progress if callable(progress) else bar
        norms = jacobian_sq_norms(
            f,
            e0,
            probes=probes,
            seed=seed,
            dims=model_dims(model),
            memory_budget=memory_budget,
            chunk_size=chunk_size,
            on_progress=callback,
            pace=None if time_budget is None else Pace(time_budget, _refusal(time_budget), start),
        )
    sq = norms.sq.cpu()
    var = None if norms.sq_var is None else norms.sq_var.cpu()
    return HTAResult(
        contributions=contributions(sq),
        stderr=None if var is None else contribution_stderr(sq, var),
        sq_norms=sq,
        sq_norms_stderr=None if var is None else var.sqrt(),
        tokens=list(enc.tokens),
        input_ids=input_ids.clone(),
        special=special_mask(model, input_ids),
        probes=probes,
        seed=seed,
        n_jvps=norms.n_jvps,
        chunk_size=norms.chunk_size,
        seconds=time.perf_counter() - start,
        model_name=model.info.name,
        is_causal=bool(model.info.is_causal),
        truncated=int(getattr(enc, "n_dropped", 0)),
    )
