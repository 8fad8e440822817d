"""Tracing cost against a plain Hugging Face forward, and the memory of layer streaming.

1. Time: `model.trace(ids)` against `hf_model(**inputs, output_attentions=True)` (eager,
   no_grad) on the same token ids, same threads, interleaved, the fastest of `--repeats` each.
   Targets (issue 9): ≤ 1.3× on all-MiniLM-L6-v2 at n = 128 and on a BERT-base-sized
   random model (12 layers, 12 heads, d = 768) at n = 512.
2. Memory: peak resident memory above the loaded model, each in a fresh subprocess, of
   `model.trace(ids)` against `for layer, t in model.iter_layers(ids)` (each layer kept
   only while it is looked at), on a random 12-layer, 12-head, d = 384 BERT at n = 1024.
   A trace holds 4·[L·H·n² + L·H·n·d_v + L·H·d_v·d + (2L+1)·n·d] + L·n² bytes.
3. Before/after (`--compare SRC`, SRC another checkout's `src` folder, e.g. the main
   branch's): the peak of `model.trace(ids)` as in 2, for a float32 and a bfloat16 model,
   each in a fresh subprocess importing `identifiable` from SRC or from this checkout,
   interleaved, same threads. Issue 26 moved each layer's maps to float32 CPU as they are
   captured; before, HF's tuple of every layer's maps, a torch.stack copy and (bfloat16) a
   float32 copy were alive at once.

    python benchmarks/bench_trace.py [--threads 1] [--repeats 5] [--compare ../main/src]
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


def memory_child(mode: str, n: int, threads: int, dtype: str = "float32") -> None:
    """Run in a subprocess: print JSON with the peak RSS above the loaded model (MB)."""
    import gc

    import identifiable
    from identifiable.models import Model

    torch.set_num_threads(threads)
    model = Model.from_hf(random_bert(12, 12, 384, n).to(getattr(torch, dtype)))
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
                "source": identifiable.__file__,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--memory-n", type=int, default=1024)
    parser.add_argument("--child", choices=["full", "stream"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--compare", metavar="SRC", help="another checkout's src folder")
    args = parser.parse_args()
    if args.child:
        memory_child(args.child, args.memory_n, args.threads, args.dtype)
        return
    if args.compare:
        compare(args.compare, args.memory_n, args.threads, args.repeats)
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
    results = {mode: child(mode, args.memory_n, args.threads) for mode in ("full", "stream")}
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


def child(mode: str, n: int, threads: int, dtype: str = "float32", src: str | None = None) -> dict:
    """One memory measurement in a fresh process (`src`: import identifiable from there)."""
    import os

    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.path.abspath(src) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, __file__, "--child", mode, "--memory-n", str(n)]
    cmd += ["--threads", str(threads), "--dtype", dtype]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(src: str, n: int, threads: int, repeats: int) -> None:
    """Peak memory of `model.trace` with identifiable from `src` against this checkout."""
    rounds = max(1, min(repeats, 3))
    print(
        f"trace peak RSS above the loaded model, random BERT 12×12 d=384, n={n}, "
        f"threads {threads}, {rounds} interleaved fresh processes per side (min | max)"
    )
    for dtype in ("float32", "bfloat16"):
        got: dict[str, list[dict]] = {"before": [], "after": []}
        for _ in range(rounds):
            got["before"].append(child("full", n, threads, dtype, src))
            got["after"].append(child("full", n, threads, dtype))
        peaks = {k: [r["peak_above_model_mb"] for r in v] for k, v in got.items()}
        secs = {k: [r["seconds"] for r in v] for k, v in got.items()}
        maps = got["after"][0]["maps_mb"]
        for side in ("before", "after"):
            print(
                f"  {dtype:8s} {side:6s} {min(peaks[side]):7.0f} | {max(peaks[side]):7.0f} MB "
                f"({min(peaks[side]) / maps:.2f}× the {maps:.0f} MB of float32 maps), "
                f"trace {min(secs[side]):.2f} s   [{got[side][0]['source']}]"
            )
        print(
            f"  {dtype:8s} ratio after/before (min): {min(peaks['after']) / min(peaks['before']):.2f}"
        )


if __name__ == "__main__":
    main()
