"""The Llama-3-style reference on a GPU (issue 22): absolute times and the GPU's memory.

The model is bench_causal.py's: hidden 4096, 32 query and 8 key/value heads of width 128,
d_ff 14336, 2 layers, RoPE (θ = 500000), random weights, built on the GPU in `--dtype`
(default bfloat16); Zipf-distributed token ids, so that tokens repeat as in text. One
process, one set of weights (an sdpa and an eager `Model` over the same Hugging Face model).

Per n (`--n`, default 2,048, 4,096, 8,192), each mode warmed up once at that n and then
timed `--repeats` times (median; `torch.cuda.synchronize()` before each clock read):
- forward: the plain sdpa forward (no capture);
- sdpa: `model.trace(ids)`, every head's maps recomputed from the captured Q and K;
- head0: `model.trace(ids, heads=[0])`;
- eager: the eager capture (the model's own probabilities).
Beside each: the peak of the bytes torch's CUDA allocator holds above the loaded model
(`max_memory_allocated`), the formula's forward part (models/budget.py: the part that
lives on the GPU; the result goes to host memory as it is captured), and the result's
bytes in host memory.

Then, for n in `--effective-n`: `effective_attention(trace, layers=[l])` of all heads per
layer (the default dtype, float32; it runs on the CPU with `--threads` torch threads,
where the trace's tensors are), and the worst relative invariant error
‖(A_eff − A) V W_O‖ / ‖A V W_O‖ over heads, computed on the GPU in float64. Skipped once
`--deadline` seconds have passed since the start.
Last: the time `model.trace` takes to refuse an eager trace whose forward part exceeds
the GPU's free memory (n = 65,536).

Each result is printed as a JSON line and rewritten to `--json` as it comes.

Run (on a machine with CUDA): python benchmarks/bench_gpu.py [--n 2048 4096 8192]
     [--dtype bfloat16] [--repeats 3] [--threads 16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_causal import zipf_ids

CUDA = torch.cuda.is_available()


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def build(dtype: torch.dtype, device: str):
    from transformers import AutoConfig, AutoModel

    from identifiable.models import Model

    cfg = AutoConfig.for_model(
        "llama", hidden_size=4096, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, intermediate_size=14336,
        max_position_embeddings=65536, rope_theta=500000.0, pad_token_id=0,
        bos_token_id=101, eos_token_id=102, vocab_size=30522,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        hf = AutoModel.from_config(cfg, attn_implementation="sdpa", dtype=dtype).eval()
    return hf, Model.from_hf(hf, attention="sdpa"), Model.from_hf(hf, attention="eager")


def clocked(fn, repeats: int) -> tuple[float, float, object]:
    """(median seconds of `repeats` runs, peak CUDA bytes above the start, last output)."""
    fn()  # warm-up at this n: kernels, the allocator's blocks
    times, peaks, out = [], [], None
    for _ in range(repeats):
        out = None
        sync()
        base = torch.cuda.memory_allocated() if CUDA else 0
        if CUDA:
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t)
        peaks.append(torch.cuda.max_memory_allocated() - base if CUDA else 0)
    return statistics.median(times), max(peaks), out


def invariant_error(trace, effective: torch.Tensor, layer: int, device: str) -> float:
    """Worst ‖(A_eff − A) V W_O‖ / ‖A V W_O‖ over the heads of one layer (float64, on
    `device`)."""
    worst = 0.0
    for h in range(effective.shape[0]):
        a = trace.attentions[layer, h].to(device, torch.float64)
        e = effective[h].to(device, torch.float64)
        v = trace.values[layer, h].to(device, torch.float64)
        w = trace.out_proj[layer, h].to(device, torch.float64)
        err = ((e - a) @ v @ w).norm() / ((a @ v) @ w).norm()
        worst = max(worst, float(err))
    return worst


SMALL = {  # tests/models/test_budget.py's model
    "hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
    "intermediate_size": 2816, "num_hidden_layers": 2, "vocab_size": 1024,
    "max_position_embeddings": 8192, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip


def memory_section(ns: list[int], emit, device: str) -> None:
    """The CUDA allocator's peak above the loaded model of a plain forward (no capture) and
    of a trace, beside the formula's forward part, for both models, float32 and bfloat16,
    sdpa and eager: what the GPU formula of models/budget.py is fitted to."""
    from transformers import AutoConfig, AutoModel

    from identifiable.models import Model
    from identifiable.models.backends import running

    big = {**SMALL, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
           "intermediate_size": 14336}  # fmt: skip
    for name, config in (("small", SMALL), ("reference", big)):
        for dtype in (torch.float32, torch.bfloat16):
            torch.manual_seed(0)
            with torch.device(device):
                hf = AutoModel.from_config(
                    AutoConfig.for_model("llama", **config), attn_implementation="sdpa",
                    dtype=dtype,
                ).eval()  # fmt: skip
            for attention in ("sdpa", "eager"):
                model = Model.from_hf(hf, attention=attention)
                model.trace(torch.arange(3, 19))
                for n in ns:
                    ids = torch.randint(3, 1000, (n,), generator=torch.Generator().manual_seed(0))
                    inputs = model.batch_inputs([model.encode_ids(ids)])

                    def forward(inputs=inputs, attention=attention, hf=hf):
                        with running(hf, attention), torch.no_grad():
                            return hf(**inputs).last_hidden_state

                    f = clocked(forward, 1)[1]
                    t = clocked(lambda ids=ids, m=model: m.trace(ids, memory_budget=1 << 50), 1)[1]
                    plan = model.memory_plan(n, 2, None)
                    emit({"section": "memory", "model": name, "dtype": str(dtype),
                          "attention": attention, "n": n, "forward_peak": f, "trace_peak": t,
                          "formula_forward": plan.forward})  # fmt: skip
            del hf
            if CUDA:
                torch.cuda.empty_cache()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="*", default=[2048, 4096, 8192])
    p.add_argument("--effective-n", type=int, nargs="*", default=[2048, 8192])
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--deadline", type=float, default=420.0, help="seconds: skip effective after")
    p.add_argument("--json", default=None)
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of this script")
    p.add_argument("--memory-n", type=int, nargs="*", default=[], help="the memory section")
    args = p.parse_args()
    if args.device == "cuda" and not CUDA:
        sys.exit("bench_gpu.py needs a CUDA device (or --device cpu for a smoke run)")
    from identifiable.attention import effective_attention
    from identifiable.models.backends import running

    start = time.perf_counter()
    torch.set_num_threads(args.threads)
    rows: list[dict] = []

    def emit(row: dict) -> None:
        row["elapsed_s"] = round(time.perf_counter() - start, 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {"device": torch.cuda.get_device_name() if CUDA else "cpu",
                     "torch": torch.__version__,
                     "dtype": args.dtype, "threads": args.threads, "rows": rows},
                    f, indent=1,
                )  # fmt: skip

    if args.memory_n:
        memory_section(args.memory_n, emit, args.device)
    if not args.n:
        return
    hf, sdpa, eager = build(getattr(torch, args.dtype), args.device)
    sdpa.trace(torch.tensor(zipf_ids(16)))  # the shared W_O copy, once per model
    eager.trace(torch.tensor(zipf_ids(16)))
    for n in args.n:
        ids = torch.tensor(zipf_ids(n))
        inputs = sdpa.batch_inputs([sdpa.encode_ids(ids)])

        def forward(inputs=inputs):
            with running(hf, "sdpa"), torch.no_grad():
                return hf(**inputs).last_hidden_state

        calls = {
            "forward": (forward, None, sdpa),
            "sdpa": (lambda ids=ids: sdpa.trace(ids, memory_budget=1 << 50), None, sdpa),
            "head0": (lambda ids=ids: sdpa.trace(ids, heads=[0], memory_budget=1 << 50), [0], sdpa),
            "eager": (lambda ids=ids: eager.trace(ids, memory_budget=1 << 50), None, eager),
        }
        forward_s = None
        kept = None
        for mode, (fn, heads, model) in calls.items():
            seconds, peak, out = clocked(fn, args.repeats)
            plan = model.memory_plan(n, 2, heads)
            forward_s = forward_s or seconds
            row = {
                "n": n, "mode": mode, "seconds": seconds, "x_forward": seconds / forward_s,
                "gpu_peak_mb": peak / 2**20,
                "formula_forward_mb": plan.forward / 2**20 if mode != "forward" else None,
                "host_result_mb": plan.result / 2**20 if mode != "forward" else None,
            }  # fmt: skip
            if mode != "forward":
                row["peak_over_formula"] = peak / plan.forward
                row["verify"] = float(out.verify().max())
            emit(row)
            if mode == "sdpa" and n in args.effective_n:
                kept = out
            del out
        if CUDA and n == max(args.n):  # the floor of any capture to host memory: the bytes alone
            maps = torch.empty(2 * 32 * n * n, device="cuda")
            for label, pin in (("fresh", False), ("pinned", True)):
                host = torch.empty(maps.numel(), pin_memory=pin)
                sync()
                t = time.perf_counter()
                host.copy_(maps)
                sync()
                emit({"n": n, "mode": f"copy maps to {label} host memory", "gb": maps.numel() * 4e-9,
                      "seconds": time.perf_counter() - t})  # fmt: skip
                del host
            del maps
        if kept is None:
            continue
        for layer in range(2):
            if time.perf_counter() - start > args.deadline:
                emit({"n": n, "mode": f"effective layer {layer}", "skipped": "deadline"})
                continue
            t = time.perf_counter()
            ea = effective_attention(kept, layers=[layer])
            seconds = time.perf_counter() - t
            emit({
                "n": n, "mode": f"effective layer {layer}", "seconds": seconds,
                "x_forward": seconds / forward_s, "dtype": str(ea.effective.dtype),
                "distinct_tokens": len(set(ids.tolist())),
                "invariant": invariant_error(kept, ea.effective[0], layer, args.device),
            })  # fmt: skip
            del ea
        del kept
    if args.device != "cuda":
        return
    big = torch.tensor(zipf_ids(65536))
    t = time.perf_counter()
    try:
        eager.trace(big, memory_budget=1 << 50)
        emit({"n": 65536, "mode": "refusal", "refused": False})
    except Exception as exc:  # the IdentifiableError's one line
        emit({"n": 65536, "mode": "refusal", "seconds": time.perf_counter() - t,
              "message": str(exc)})  # fmt: skip


if __name__ == "__main__":
    main()
