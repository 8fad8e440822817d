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

4. Decoders (`--decoder N,N,…`, issue 22): the Llama-3-style reference (hidden 4096, 32
   query and 8 key/value heads of width 128, d_ff 14336, 2 layers, random weights,
   float32), each measurement in a fresh subprocess, side by side in one run: a plain
   sdpa forward (no capture), the sdpa capture of all heads (maps recomputed), the
   capture of heads=[0], and the eager capture; time and peak RSS above the loaded
   model, and the pre-flight formula's estimate (models/budget.py) beside each.

    python benchmarks/bench_trace.py [--threads 1] [--repeats 5] [--compare ../main/src]
    python benchmarks/bench_trace.py --decoder 512,1024 [--threads 1]
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


LLAMA3 = {
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 14336,
    "num_hidden_layers": 2,
    "vocab_size": 1024,  # the embedding's size does not change the trace
    "max_position_embeddings": 8192,
}
DECODER_MODES = ("forward", "sdpa", "head0", "eager")


def random_llama(config: dict, attention: str):
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    cfg = AutoConfig.for_model("llama", **config, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return AutoModel.from_config(cfg, attn_implementation=attention).eval()


def decoder_child(
    mode: str, n: int, threads: int, config: dict | None = None, allocated: bool = False
) -> dict:
    """One decoder measurement (run in a fresh process): peak RSS above the loaded model,
    seconds, and the formula's estimate for the same trace; with `allocated`, a second run
    under torch's profiler for the peak of the bytes torch's allocator holds."""
    import gc
    import threading

    from identifiable.models import Model
    from identifiable.models.backends import running

    torch.set_num_threads(threads)
    attention = "eager" if mode == "eager" else "sdpa"
    model = Model.from_hf(random_llama(config or LLAMA3, attention), attention=attention)
    ids = torch.randint(3, 1000, (n,), generator=torch.Generator().manual_seed(0))
    heads = [0] if mode == "head0" else None
    inputs = model.batch_inputs([model.encode_ids(ids)])

    def run() -> object:
        if mode == "forward":
            with running(model.hf_model, "sdpa"), torch.no_grad():
                return model.hf_model(**inputs).last_hidden_state
        return model.trace(ids, heads=heads, memory_budget=1 << 50)

    small = model.encode_ids(ids[:16])
    with running(model.hf_model, "sdpa"), torch.no_grad():
        model.hf_model(**model.batch_inputs([small]))
    model.trace(ids[:16], heads=heads)  # warm up kernels and the shared W_O copy
    plan = model.memory_plan(n, model.info.n_layers, heads)
    gc.collect()
    base, peak, done = _rss_now_mb(), [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_now_mb())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    out = run()
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    maps = out.attentions.numel() * 4 if hasattr(out, "attentions") else 0
    del out
    gc.collect()
    return {
        "alloc_peak_mb": _allocated_peak_mb(run) if allocated else float("nan"),
        "mode": mode,
        "n": n,
        "seconds": seconds,
        "peak_above_model_mb": peak[0] - base,
        "maps_mb": maps / 2**20,
        "plan_mb": (0 if mode == "forward" else plan.total) / 2**20,
        "result_plan_mb": (0 if mode == "forward" else plan.result) / 2**20,
        "attention": model.attention,
    }


def _allocated_peak_mb(run) -> float:
    """Peak of the bytes torch's CPU allocator holds during `run()`, above what it held
    before (MB): every allocation and free is recorded (`profile_memory`), so the figure
    is the same from run to run, unlike RSS, which also counts freed heap that glibc keeps
    (its mmap threshold rises with the sizes freed, so a forward's large temporaries come
    from the heap and stay resident after they are freed; see README 'Memory')."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]"
    )
    held = peak = 0
    for _, nbytes in events:
        held += nbytes
        peak = max(peak, held)
    return peak / 2**20


def decoder_times(n: int, threads: int, repeats: int, config: dict | None = None) -> dict:
    """Run in a fresh process: the four modes interleaved in one process on one set of
    weights (an sdpa and an eager `Model` over the same Hugging Face model), the fastest
    of `repeats` each."""
    from identifiable.models import Model
    from identifiable.models.backends import running

    torch.set_num_threads(threads)
    hf = random_llama(config or LLAMA3, "sdpa")
    sdpa, eager = Model.from_hf(hf, attention="sdpa"), Model.from_hf(hf, attention="eager")
    ids = torch.randint(3, 1000, (n,), generator=torch.Generator().manual_seed(0))
    inputs = sdpa.batch_inputs([sdpa.encode_ids(ids)])

    def forward() -> None:
        with running(hf, "sdpa"), torch.no_grad():
            hf(**inputs)

    calls = {
        "forward": forward,
        "sdpa": lambda: sdpa.trace(ids, memory_budget=1 << 50),
        "head0": lambda: sdpa.trace(ids, heads=[0], memory_budget=1 << 50),
        "eager": lambda: eager.trace(ids, memory_budget=1 << 50),
    }
    for call in calls.values():  # warm-up
        call()
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(repeats):
        for mode, call in calls.items():
            t0 = time.perf_counter()
            call()
            best[mode] = min(best[mode], time.perf_counter() - t0)
    return best


def decoder_table(
    ns: list[int],
    threads: int,
    repeats: int = 2,
    modes: tuple[str, ...] = DECODER_MODES,
    allocated: bool = False,
) -> None:
    print(
        f"Llama-3-style reference, 2 layers, float32, {threads} thread(s); each cell a fresh "
        "process; peak = RSS above the loaded model (MB)"
    )
    head = f"{'n':>5} {'mode':8} {'time s':>8} {'× fwd':>6} {'peak MB':>8} {'× fwd':>6} "
    head += f"{'maps MB':>8} {'formula MB':>10} {'meas/formula':>12}"
    print(head + (f" {'alloc MB':>8} {'× fwd':>6}" if allocated else ""))
    print(
        f"time: the fastest of {repeats} interleaved runs in one process (same weights, same "
        "threads); memory: one fresh process per cell"
    )
    for n in ns:
        rows = {mode: decoder_run(mode, n, threads, allocated=allocated) for mode in modes}
        if modes == DECODER_MODES:  # else: each process's own single run
            times = decoder_run("times", n, threads, repeats=repeats)
            for mode in modes:
                rows[mode]["seconds"] = times[mode]
        fwd = rows["forward"]
        for mode, r in rows.items():
            ratio = r["peak_above_model_mb"] / r["plan_mb"] if r["plan_mb"] else float("nan")
            print(
                f"{n:5d} {mode:8} {r['seconds']:8.2f} {r['seconds'] / fwd['seconds']:6.2f} "
                f"{r['peak_above_model_mb']:8.0f} "
                f"{r['peak_above_model_mb'] / fwd['peak_above_model_mb']:6.2f} "
                f"{r['maps_mb']:8.0f} {r['plan_mb']:10.0f} {ratio:12.2f}"
                + (
                    f" {r['alloc_peak_mb']:8.0f} {r['alloc_peak_mb'] / fwd['alloc_peak_mb']:6.2f}"
                    if allocated
                    else ""
                )
            )
        if allocated and "sdpa" in rows:
            target = 1.5 * fwd["alloc_peak_mb"] + rows["sdpa"]["maps_mb"]
            print(
                f"      allocated: sdpa / (1.5·fwd + maps) "
                f"{rows['sdpa']['alloc_peak_mb'] / target:.3f} (≤ 1); sdpa − fwd "
                f"{rows['sdpa']['alloc_peak_mb'] - fwd['alloc_peak_mb']:.1f} MB against "
                f"{rows['sdpa']['result_plan_mb']:.1f} MB of "
                "results in the formula"
            )
        if modes != DECODER_MODES:
            continue
        extra = rows["sdpa"]["peak_above_model_mb"] / (
            1.5 * fwd["peak_above_model_mb"] + rows["sdpa"]["maps_mb"]
        )
        print(
            f"      targets: sdpa time {rows['sdpa']['seconds'] / fwd['seconds']:.2f}× fwd "
            f"(≤ 1.5); sdpa peak / (1.5·fwd + maps) {extra:.2f} (≤ 1); heads=[0] peak "
            f"{rows['head0']['peak_above_model_mb'] / fwd['peak_above_model_mb']:.2f}× fwd "
            f"(≤ 1.5 at n = 4096); eager/sdpa time "
            f"{rows['eager']['seconds'] / rows['sdpa']['seconds']:.2f}, peak "
            f"{rows['eager']['peak_above_model_mb'] / rows['sdpa']['peak_above_model_mb']:.2f}"
        )


def decoder_run(
    mode: str,
    n: int,
    threads: int,
    config: dict | None = None,
    repeats: int = 2,
    allocated: bool = False,
) -> dict:
    import os

    cmd = [sys.executable, __file__, "--decoder-child", mode, "--memory-n", str(n)]
    cmd += ["--threads", str(threads), "--repeats", str(repeats)]
    cmd += ["--allocated"] if allocated else []
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if config is not None:
        env["BENCH_DECODER_CONFIG"] = json.dumps(config)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--memory-n", type=int, default=1024)
    parser.add_argument("--child", choices=["full", "stream"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--compare", metavar="SRC", help="another checkout's src folder")
    parser.add_argument("--decoder", metavar="N,N", help="the decoder table at these n")
    parser.add_argument("--decoder-child", choices=(*DECODER_MODES, "times"))
    parser.add_argument("--modes", help="decoder: only these (e.g. forward,head0), memory only")
    parser.add_argument(
        "--allocated", action="store_true", help="decoder: also torch's allocated peak"
    )
    args = parser.parse_args()
    if args.decoder_child:
        import os

        config = (
            json.loads(os.environ["BENCH_DECODER_CONFIG"])
            if "BENCH_DECODER_CONFIG" in os.environ
            else None
        )
        if args.decoder_child == "times":
            got = decoder_times(args.memory_n, args.threads, args.repeats, config)
        else:
            got = decoder_child(
                args.decoder_child, args.memory_n, args.threads, config, args.allocated
            )
        print(json.dumps(got))
        return
    if args.decoder:
        modes = tuple(args.modes.split(",")) if args.modes else DECODER_MODES
        ns = [int(x) for x in args.decoder.split(",")]
        decoder_table(ns, args.threads, args.repeats, modes, args.allocated)
        return
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
