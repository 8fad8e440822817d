"""Tracing cost against a plain Hugging Face forward, and the memory of layer streaming.

1. Time: `model.trace(ids)` against `hf_model(**inputs, output_attentions=True)` (eager,
   no_grad) on the same token ids, same threads, interleaved, the fastest of `--repeats` each.
   Targets (issue 9): ≤ 1.3× on all-MiniLM-L6-v2 at n = 128 and on a BERT-base-sized
   random model (12 layers, 12 heads, d = 768) at n = 512.
2. Memory: peak resident memory above the loaded model, each in a fresh subprocess, of
   `model.trace(ids)` against `for layer, t in model.iter_layers(ids)` (each layer kept
   only while it is looked at), on a random 12-layer, 12-head, d = 384 BERT at n = 1024.
   A trace holds 4·[L·H·n² + L·H·n·d_v + L·H·d_v·d + (2L+1)·n·d] + L·n² bytes.

    python benchmarks/bench_trace.py [--threads 1] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch


def random_bert(layers: int, heads: int, width: int, positions: int):
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(
        "bert",
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * width,
        max_position_embeddings=positions,
    )
    return AutoModel.from_config(cfg, attn_implementation="eager").eval()


def time_pair(model, n: int, repeats: int) -> tuple[float, float]:
    ids = torch.randint(1000, 20000, (n,), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids[None], "attention_mask": torch.ones(1, n, dtype=torch.long)}
    hf, ours = [], []
    with torch.no_grad():
        model.hf_model(**inputs, output_attentions=True)  # warm-up both
        model.trace(ids)
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.hf_model(**inputs, output_attentions=True)
            t1 = time.perf_counter()
            model.trace(ids)
            t2 = time.perf_counter()
            hf.append(t1 - t0)
            ours.append(t2 - t1)
    # min: the least-disturbed run of each on a shared machine; both sides alike
    return min(hf), min(ours)


def _rss_now_mb() -> float:
    """Resident memory now (Linux /proc), MB."""
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def memory_child(mode: str, n: int, threads: int) -> None:
    """Run in a subprocess: print JSON with the peak RSS above the loaded model (MB)."""
    import gc

    from identifiable.models import Model

    torch.set_num_threads(threads)
    model = Model.from_hf(random_bert(12, 12, 384, n))
    ids = torch.randint(1000, 20000, (n,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.trace(ids[:16])  # warm up allocator and kernels on a tiny input
    gc.collect()
    import threading

    base, peak, done = _rss_now_mb(), [0.0], threading.Event()

    def sample() -> None:  # the peak of the measured section alone (ru_maxrss is for life)
        while not done.is_set():
            peak[0] = max(peak[0], _rss_now_mb())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    if mode == "full":
        tr = model.trace(ids)
        held = tr.attentions.numel() * 4
        del tr
    else:
        held = 0
        for _, tr in model.iter_layers(ids):
            held = max(held, tr.attentions.numel() * 4)
            del tr
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    print(
        json.dumps(
            {
                "peak_above_model_mb": peak[0] - base,
                "maps_mb": held / 2**20,
                "seconds": seconds,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--memory-n", type=int, default=1024)
    parser.add_argument("--child", choices=["full", "stream"])
    args = parser.parse_args()
    if args.child:
        memory_child(args.child, args.memory_n, args.threads)
        return
    torch.set_num_threads(args.threads)
    from identifiable.models import Model, load_model

    print(
        f"threads: {args.threads}, repeats: {args.repeats} (fastest of each), torch {torch.__version__}"
    )
    for label, model, n in (
        ("all-MiniLM-L6-v2", load_model("minilm"), 128),
        ("BERT-base random (12×12, d=768)", Model.from_hf(random_bert(12, 12, 768, 512)), 512),
    ):
        hf, ours = time_pair(model, n, args.repeats)
        print(
            f"{label:34s} n={n:4d}  HF forward {hf * 1e3:7.1f} ms  trace {ours * 1e3:7.1f} ms  "
            f"ratio {ours / hf:.2f}× (target ≤ 1.3×)"
        )
    results = {}
    for mode in ("full", "stream"):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                mode,
                "--memory-n",
                str(args.memory_n),
                "--threads",
                str(args.threads),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    full, stream = results["full"], results["stream"]
    print(f"memory, random BERT 12×12 d=384, n={args.memory_n}: peak RSS above the loaded model")
    print(
        f"  full trace   {full['peak_above_model_mb']:8.0f} MB (attention maps held "
        f"{full['maps_mb']:.0f} MB), {full['seconds']:.1f} s"
    )
    print(
        f"  iter_layers  {stream['peak_above_model_mb']:8.0f} MB (largest layer's maps "
        f"{stream['maps_mb']:.0f} MB), {stream['seconds']:.1f} s"
    )
    print(f"  ratio stream/full: {stream['peak_above_model_mb'] / full['peak_above_model_mb']:.2f}")


if __name__ == "__main__":
    main()
