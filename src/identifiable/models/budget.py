"""Memory of a trace, known before it is spent: the formula docs/families.md states, and the
pre-flight refusal of `Model.trace` / `Model.iter_layers` (`memory_budget=`).

Bytes, for n query rows and n_k keys, L_s chosen layers of H_s chosen heads (of H query
and H_kv key/value heads of width d_h, d_v = d_h), model width d, MLP width d_ff, weights
of s bytes each (float32: 4):

    result    = 4·L_s·H_s·n·n_k  (maps, float32)
              + 4·L_s·H_s·n_k·d_v + 4·(2·L_s + 1)·n·d  (values, hidden states, block outputs)
              + L_s·n·n_k  (key masks, bool)
              + 4·L_s·H_s·d_v·d  (W_O rows, unless the model's shared copy exists)
    forward   = s·n·(6·d + 2·(H + 2·H_kv)·d_h + 3·d_ff)   one layer's activations
              + eager only: (s + 4)·H·n·n_k  (one layer's scores beside their float32
                softmax) + s·n·n_k (the additive mask)
              + recomputed maps only: 8·CHUNK  (two float32 chunks of scores, CHUNK = 2^20) and
                n·n_k where the model builds a boolean mask (windows, padding)
    trace     = result + forward
    iter_layers = 2 × result of one layer + forward   (a layer is built while the caller
                holds the previous one)

On a CUDA model the forward part is on the GPU, where it takes the form of `gpu_forward`
(the larger of the MLP's and the attention's phase), and is checked against the GPU's free
memory (`device_room`); the result is moved to host memory layer by layer, as captured,
and `memory_budget` then bounds the result alone.

The constants (6·d, 2·(H + 2·H_kv)·d_h: hidden states, norms, Q/K/V before and after
rotary, the attention output; 3·d_ff: the gated MLP's two projections and their product)
were measured on random Llama-style models (tests/models/test_budget.py checks the whole
formula against the measured peak within 25 %).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from identifiable.errors import IdentifiableError
from identifiable.models.recompute import CHUNK_ELEMENTS


@dataclass(frozen=True)
class TracePlan:
    """The bytes a trace will hold (`result`) and use on the way (`forward`)."""

    result: int
    forward: int

    @property
    def total(self) -> int:
        return self.result + self.forward


@dataclass(frozen=True)
class Shape:
    """What the formula needs of a model (`ModelInfo` plus the MLP width and weight bytes)."""

    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_size: int
    mlp_width: int
    weight_bytes: int


def plan(
    shape: Shape,
    n: int,
    n_keys: int,
    *,
    layers: int,
    heads: int,
    eager: bool,
    streaming: bool = False,
    masked: bool = False,
    shared_out_proj: bool = False,
    gpu: bool = False,
) -> TracePlan:
    """The formula above (`layers`, `heads`: how many are chosen; `masked`: the model
    builds a boolean mask, for windows or padding; `gpu`: the forward pass runs on a CUDA
    device, whose part is `gpu_forward`)."""
    s, d, d_v = shape.weight_bytes, shape.hidden_size, shape.head_dim
    kept = 1 if streaming else layers
    result = (
        4 * kept * heads * (n * n_keys + n_keys * d_v)
        + 4 * (2 * kept + 1) * n * d
        + kept * n * n_keys
        + (0 if shared_out_proj else 4 * kept * heads * d_v * d)
    )
    if streaming:
        result *= 2
    if gpu:
        return TracePlan(result, gpu_forward(shape, n, n_keys, eager=eager, masked=masked))
    qkv = (shape.n_heads + 2 * shape.n_kv_heads) * shape.head_dim
    forward = s * n * (6 * d + 2 * qkv + 3 * shape.mlp_width)
    if eager:
        forward += (s + 4) * shape.n_heads * n * n_keys + s * n * n_keys
    else:
        forward += 8 * CHUNK_ELEMENTS + (n * n_keys if masked else 0)
    return TracePlan(result, forward)


def gpu_forward(shape: Shape, n: int, n_keys: int, *, eager: bool, masked: bool) -> int:
    """The forward pass's peak on a CUDA device (docs/families.md, 'Memory and streaming'). torch's CUDA allocator
    frees each temporary at once, so the peak is the larger of two phases, not their sum
    (host memory keeps freed heap, hence the sum above):

        mlp       = s·n·(3·d_ff + 5·d)
        attention = s·n·(2·d + 2·(H + 2·H_kv)·d_h + 2·H·d_h) + 8·CHUNK (+ n·n_k, mask)
                    + eager: (s + 4 + [4 if s < 4])·H·n·n_k + s·n·n_k
                    + sdpa in float32: (s + 5)·H·n·n_k + s·n·n_k

    Eager's half-precision softmax casts its scores to float32 before it normalises them
    (4 bytes more a score); float32 sdpa formed its scores there (as if no fused kernel
    took it: inferred, not traced); half-precision sdpa formed none. The capture added
    nothing to the peak (a trace's peak equalled the plain forward's to 0.1 MB): its
    chunks of recomputed maps are small and go to host memory. Fitted to torch's `max_memory_allocated` on an H200 (torch 2.11,
    transformers 5.17; benchmarks/bench_gpu.py --memory-n): 32 cells of two Llama-style
    models, float32 and bfloat16, sdpa and eager, n = 512..4,096, within 0.78–1.22 (0.93–1.08
    from n = 1,024)."""
    s, d, h = shape.weight_bytes, shape.hidden_size, shape.n_heads
    qkv = (h + 2 * shape.n_kv_heads) * shape.head_dim
    mlp = s * n * (3 * shape.mlp_width + 5 * d)
    attention = s * n * (2 * d + 2 * qkv + 2 * h * shape.head_dim) + 8 * CHUNK_ELEMENTS
    scores = n * n_keys
    if eager:
        attention += (s + 4 + (4 if s < 4 else 0)) * h * scores + s * scores
    else:
        attention += scores if masked else 0
        if s >= 4:
            attention += (s + 5) * h * scores + s * scores
    return max(mlp, attention)


def check(need: TracePlan, budget: int | None, what: str, *, default: bool = False) -> None:
    """Refuse, in one line naming `memory_budget=` (CLI: `--memory-budget`), a plan over
    `budget` bytes (None: no limit known; `default`: the user set none, so `budget` is the
    memory available and is named as the default). A plan whose forward part is 0 (it runs
    on a GPU, checked by `check_device`) is the result alone, held in host memory."""
    if budget is None or need.total <= budget:
        return
    parts = (
        f"{_gb(need.result)} of results, {_gb(need.forward)} for the forward pass"
        if need.forward
        else "of results in host memory; the forward pass runs on the GPU"
    )
    of = "memory available now (the default {})" if default else "{}"
    text = (
        f"{what} needs about {_gb(need.total)} ({parts}; formula in docs/families.md, "
        f"'Memory and streaming'), over the {_gb(budget)} of {of}; choose fewer layers or "
        "heads ({}), stream layers "
        "with iter_layers, shorten the input or raise the budget"
    )
    raise IdentifiableError(
        text.format("memory_budget=", "layers=, heads="),
        cli=text.format("--memory-budget", "--layers, --heads"),
    )


def check_device(
    forward: int, room: int, what: str, device: str, *, suggest_sdpa: bool, batch: int
) -> None:
    """Refuse, in one line, a forward pass of `forward` bytes on a GPU with `room` bytes
    free. The maps, values and hidden states go to host memory as they are captured
    (models/capture.py), so only the forward part of the formula lives on the GPU: fewer
    heads or layers do not shrink it; a shorter input, a smaller batch or recomputed maps
    (no eager scores of every head) do; `suggest_sdpa` says so to an eager model whose
    maps could be recomputed."""
    if forward <= room:
        return
    head = (
        f"{what} needs about {_gb(forward)} on {device} for the forward pass (formula in "
        f"docs/families.md, 'Memory and streaming'), over the {_gb(room)} free there; shorten the input"
    )
    python = head + (", trace fewer sequences at once (batch_size=)" if batch > 1 else "")
    if suggest_sdpa:
        python += ', or recompute the maps from Q and K instead of eager (attention="sdpa")'
    raise IdentifiableError(python, cli=head + " or use a GPU with more free memory")


def device_room(device: torch.device) -> int | None:
    """Bytes a CUDA device can still give torch: its free memory plus what torch's caching
    allocator holds unused. None elsewhere: on the CPU the forward pass is host memory,
    checked with the result (an MPS device shares host memory too)."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def check_trace(
    one: TracePlan,
    memory_budget: int | None,
    what: str,
    n: int,
    batch: int,
    device: torch.device | None = None,
    suggest_sdpa: bool = False,
) -> None:
    """`check` for `batch` sequences of n tokens, each planned as `one`; `memory_budget`
    (bytes, None: the memory available now) is checked to be a positive integer first.
    On a CUDA `device` the forward part is checked against its free bytes (`device_room`),
    and the budget bounds host memory: the result alone. `suggest_sdpa`: an eager model
    whose maps could be recomputed from Q and K, so a refusal may advise sdpa."""
    check_budget_value(memory_budget)
    need = TracePlan(one.result * batch, one.forward * batch)
    size = f"{n} tokens" if batch == 1 else f"{batch} sequences of {n} tokens"
    room = None if device is None else device_room(device)
    if room is not None:
        at = f"{what} ({size})"
        check_device(need.forward, room, at, str(device), suggest_sdpa=suggest_sdpa, batch=batch)
        need = TracePlan(need.result, 0)
    default = memory_budget is None
    if memory_budget is None:
        memory_budget = available_memory()
    check(need, memory_budget, f"{what} ({size})", default=default)


def check_budget_value(memory_budget: object) -> None:
    """One line for a `memory_budget=` that is not a positive number of bytes."""
    if memory_budget is not None and (
        isinstance(memory_budget, bool) or not isinstance(memory_budget, int) or memory_budget < 1
    ):
        raise IdentifiableError(
            f"memory_budget= takes a number of bytes ≥ 1, got {memory_budget!r}",
            cli=f"--memory-budget takes a positive number of MiB, got {memory_budget!r}",
        )


def check_analysis(
    need: int,
    memory_budget: int | None,
    what: str,
    *,
    device: torch.device | None = None,
    python: str,
    cli: str,
) -> None:
    """Refuse, in one line and before anything is allocated, an analysis that needs `need`
    bytes where it runs: on `device` (a CUDA device: its free memory, `device_room`, and
    `memory_budget` if given), else in host memory (`memory_budget`, default the memory
    available now). `python` and `cli` say what to change, as Python arguments and as
    flags; both messages name the budget (`memory_budget=` / `--memory-budget`)."""
    check_budget_value(memory_budget)
    room = None if device is None else device_room(device)
    where, limit, of = "", memory_budget, "the memory_budget= of {}"
    if room is not None:
        where = f" on {device}"
        limit, of = (
            (room, "the {} free there")
            if memory_budget is None
            else (min(room, memory_budget), "the {} free there or in the budget")
        )
    elif memory_budget is None:
        limit, of = available_memory(), "the {} available"
    if limit is None or need <= limit:
        return
    head = f"{what} needs about {_gb(need)}{where} (formula in README 'Memory'), over "
    shown = of.format(_gb(limit))
    raise IdentifiableError(
        f"{head}{shown}; {python}, or raise memory_budget= (bytes)",
        cli=f"{head}{shown.replace('memory_budget=', '--memory-budget')}; {cli}",
    )


def _gb(n: int) -> str:
    if n >= 1e11:  # "1,390 GB", not "1.39e+03 GB"
        return f"{n / 1e9:,.0f} GB"
    return f"{n / 1e9:.3g} GB" if n >= 1e8 else f"{n / 1e6:.3g} MB"


def available_memory() -> int | None:
    """Bytes this process may still allocate: the least of the system's available memory,
    its cgroup's limit less its usage, and its address-space limit (RLIMIT_AS) less what it
    has mapped; None where none of them can be read."""
    import resource

    found: list[int] = []
    meminfo = _proc_fields("/proc/meminfo")
    if "MemAvailable" in meminfo:
        found.append(meminfo["MemAvailable"])
    cgroup = _cgroup_room()
    if cgroup is not None:
        found.append(cgroup)
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        found.append(max(0, soft - _proc_fields("/proc/self/status").get("VmSize", 0)))
    if not found:
        try:
            found.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            return None
    return min(found)


def _proc_fields(path: str) -> dict[str, int]:
    """`Name: 123 kB` lines of a /proc file, in bytes (empty where it cannot be read)."""
    out: dict[str, int] = {}
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                name, _, rest = line.partition(":")
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
                    out[name] = int(parts[0]) << 10
    except OSError:
        pass
    return out


def _cgroup_room() -> int | None:
    """The memory limit of this process's cgroup (v2, else v1) less its usage, or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    v2 = next((ln.split("::", 1)[1] for ln in lines if ln.startswith("0::")), None)
    candidates = []
    if v2 is not None:
        base = Path("/sys/fs/cgroup") / v2.lstrip("/")
        candidates.append((base / "memory.max", base / "memory.current"))
    v1 = Path("/sys/fs/cgroup/memory")
    candidates.append((v1 / "memory.limit_in_bytes", v1 / "memory.usage_in_bytes"))
    for limit_file, usage_file in candidates:
        try:
            limit, usage = limit_file.read_text().strip(), usage_file.read_text().strip()
        except OSError:
            continue
        if limit.isdigit() and usage.isdigit() and int(limit) < 1 << 60:  # v1: 2**63 = none
            return max(0, int(limit) - int(usage))
    return None
