"""`identifiable.scan` against a plain sdpa forward pass, side by side (issue 46).

Models are random Llama-style configs (float32, sdpa), inputs Zipf-like token ids (token
k drawn with probability ∝ 1/k over the vocabulary, so tokens repeat as in text):

- `llama3`: hidden 4096, 32 query and 8 key/value heads of width 128, d_ff 14336,
  2 layers (the issue's reference at real widths);
- `deep`: 32 layers at reduced width, hidden 512, 8 query and 2 key/value heads of width
  64, d_ff 1408.

Measurements, each a fresh process with the same threads:

1. time: one process holds the model and runs the forward pass (`hf_model(**inputs)`
   under no_grad, what a scan runs) and the scan of the same ids, interleaved, the fastest
   of `--repeats` each;
2. memory: the peak RSS above the loaded model (the kernel's high-water mark VmHWM, reset
   before the call; sampled every 2 ms where it cannot be reset) of the forward pass alone
   and of the scan alone, each in its own fresh process; `--memory-runs K` interleaves K
   such pairs and reports their medians and every pair;
3. agreement (`--check`): the scan's null fraction against `effective_attention` of a
   one-head trace, on sampled heads;
4. phases (`--phases`): one Llama-width causal layer (random q and k, values repeated as
   Zipf-like tokens repeat) through `LayerScanner` alone, no model, the time of the fill,
   rank decisions, projection and statistics.

    python benchmarks/bench_scan.py --model llama3 --n 4096 --threads 2 --check
    python benchmarks/bench_scan.py --model deep --n 2048 --threads 2 --memory-runs 5
    python benchmarks/bench_scan.py --model deep --n 512,1024,2048 --layers 2,8,32 --threads 2

Prints one row per (model, layers, n) and the ratios; `--json FILE` writes them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time

import torch

CONFIGS = {
    "llama3": {
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 14336,
        "num_hidden_layers": 2,
        "vocab_size": 32000,
        "max_position_embeddings": 8192,
    },
    "deep": {
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 1408,
        "num_hidden_layers": 32,
        "vocab_size": 32000,
        "max_position_embeddings": 8192,
    },
}


def load(name: str, layers: int | None):
    from transformers import AutoConfig, AutoModel

    from identifiable.models import Model

    config = dict(CONFIGS[name])
    if layers is not None:
        config["num_hidden_layers"] = layers
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("llama", **config, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    hf = AutoModel.from_config(cfg, attn_implementation="sdpa").eval()
    return Model.from_hf(hf, attention="sdpa", name=name)


def zipf_ids(n: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """n token ids, id k + 3 with probability ∝ 1/(k + 1) (a Zipf law with exponent 1)."""
    weights = 1.0 / torch.arange(1, vocab - 2, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed)
    return torch.multinomial(weights, n, replacement=True, generator=g) + 3


def _rss_mb() -> float:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _calls(model, ids: torch.Tensor) -> dict:
    from identifiable import scan
    from identifiable.models.backends import running

    inputs = model.batch_inputs([model.encode_ids(ids)])

    def forward() -> None:
        with running(model.hf_model, "sdpa"), torch.no_grad():
            model.hf_model(**inputs)

    return {"forward": forward, "scan": lambda: scan(model, [ids], progress=False)}


def _high_water_mb() -> float | None:
    """The kernel's peak RSS of this process since the last `_reset_high_water` (VmHWM),
    exact where sampling can miss a short peak; None where /proc lacks it."""
    try:
        with open("/proc/self/status") as f:
            line = next(x for x in f if x.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) / 1024


def _reset_high_water() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        return False
    return True


def memory_child(mode: str, name: str, layers: int | None, n: int, threads: int) -> dict:
    """Peak RSS above the loaded model of one call (this process runs nothing else): the
    kernel's high-water mark where it can be reset, else sampled every 2 ms."""
    import gc

    torch.set_num_threads(threads)
    model = load(name, layers)
    ids = zipf_ids(n, CONFIGS[name]["vocab_size"])
    small = _calls(model, ids[:64])
    small[mode]()  # warm-up: kernels, W_O factors
    call = _calls(model, ids)[mode]
    gc.collect()
    exact = _reset_high_water()
    base, peak, done = _rss_mb(), [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mb())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    call()
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    high = _high_water_mb() if exact else None
    top = max(peak[0], high) if high is not None else peak[0]
    return {"mode": mode, "peak_mb": top - base, "seconds": seconds, "high_water": high is not None}


def times_child(name: str, layers: int | None, n: int, threads: int, repeats: int) -> dict:
    torch.set_num_threads(threads)
    model = load(name, layers)
    ids = zipf_ids(n, CONFIGS[name]["vocab_size"])
    for call in _calls(model, ids[:64]).values():
        call()
    calls = _calls(model, ids)
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(repeats):
        for mode, call in calls.items():
            t0 = time.perf_counter()
            call()
            best[mode] = min(best[mode], time.perf_counter() - t0)
    return best


def check_child(name: str, layers: int | None, n: int, threads: int, samples: int) -> dict:
    """Largest |null fraction of the scan − effective_attention's| on sampled heads."""
    from identifiable import effective_attention, scan

    torch.set_num_threads(threads)
    model = load(name, layers)
    ids = zipf_ids(n, CONFIGS[name]["vocab_size"])
    result = scan(model, [ids], progress=False)
    g = torch.Generator().manual_seed(1)
    n_l, n_h = model.info.n_layers, model.info.n_heads
    worst, rows = 0.0, []
    for _ in range(samples):
        layer = int(torch.randint(n_l, (1,), generator=g))
        head = int(torch.randint(n_h, (1,), generator=g))
        tr = model.trace(model.encode_ids(ids), layers=[layer], heads=[head])
        ea = effective_attention(tr)
        raw, eff = ea.raw[0, 0].double(), ea.effective[0, 0].double()
        want = float((raw - eff).norm() / raw.norm())
        got = float(result.null_fraction[0, layer, head])
        worst = max(worst, abs(got - want))
        rows.append([layer, head, got, want])
    return {"max_abs_diff": worst, "heads": rows}


def phases_child(n: int, threads: int) -> dict:
    """Seconds of each phase of one layer's `LayerScanner` call (`--phases`)."""
    from collections import defaultdict

    import identifiable.attention.scan as S
    from identifiable.models.capture import TraceMeta
    from identifiable.models.encoding import Encoding
    from identifiable.models.layerscan import LayerView
    from identifiable.models.recompute import AttentionCall

    torch.set_num_threads(threads)
    h, kv, d = 32, 8, 128
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, h, n, d, generator=g), torch.randn(1, kv, n, d, generator=g)
    ids = zipf_ids(n, 32000)
    token = torch.unique(ids, return_inverse=True)[1]
    emb = torch.randn(int(token.max()) + 1, kv, d, generator=g)
    kv_of = torch.arange(h) // (h // kv)
    values = emb[token].permute(1, 0, 2)[kv_of].contiguous()
    w_o = torch.randn(1, h, d, 4096, generator=g) / 64
    call = AttentionCall(q, k, None, d**-0.5, None, None, True, None)
    enc = Encoding(ids, [str(int(i)) for i in ids], 0)
    view = LayerView(0, list(range(h)), values, w_o, call, None, True, kv_of, enc,
                     TraceMeta("m", "llama"), None)  # type: ignore[arg-type]  # fmt: skip
    spent: dict[str, float] = defaultdict(float)

    def timed(name, f):
        def run(*a, **kw):
            t0 = time.perf_counter()
            out = f(*a, **kw)
            spent[name] += time.perf_counter() - t0
            return out

        return run

    S.layer_dims, S.project_layer = timed("dims", S.layer_dims), timed("project", S.project_layer)
    S.head_statistics = timed("stats", S.head_statistics)
    LayerView.trace = timed("fill", LayerView.trace)  # type: ignore[method-assign]
    plan = S.ScanPlan((0,), tuple(range(h)), 0, frozenset(), "paper", torch.float32, 2)
    scanner = S.LayerScanner(plan, kv_of)
    scanner(view, scanner.start())  # warm-up: W_O factors
    spent.clear()
    t0 = time.perf_counter()
    scanner(view, scanner.start())
    return {"total": time.perf_counter() - t0, **spent}


def _child(kind: str, *args: object) -> dict:
    code = (
        "import json, sys; sys.path.insert(0, 'benchmarks'); import bench_scan as b; "
        f"print('RESULT', json.dumps(b.{kind}(*{args!r})))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{kind}{args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[7:])


def row(
    name: str, layers: int | None, n: int, threads: int, repeats: int, memory_runs: int = 1
) -> dict:
    """One cell: times (fastest of `repeats`), and peak memory of forward and scan in fresh
    processes, `memory_runs` interleaved pairs (medians; every pair in `memory_pairs`)."""
    pairs = [
        (
            _child("memory_child", "forward", name, layers, n, threads)["peak_mb"],
            _child("memory_child", "scan", name, layers, n, threads)["peak_mb"],
        )
        for _ in range(memory_runs)
    ]
    fwd = {"peak_mb": statistics.median(f for f, _ in pairs)}
    sc = {"peak_mb": statistics.median(s for _, s in pairs)}
    t = _child("times_child", name, layers, n, threads, repeats)
    return {
        "model": name,
        "layers": layers or CONFIGS[name]["num_hidden_layers"],
        "n": n,
        "threads": threads,
        "forward_s": t["forward"],
        "scan_s": t["scan"],
        "time_ratio": t["scan"] / t["forward"],
        "forward_peak_mb": fwd["peak_mb"],
        "scan_peak_mb": sc["peak_mb"],
        "memory_ratio": sc["peak_mb"] / fwd["peak_mb"],
        "memory_pairs": [{"forward_mb": f, "scan_mb": s, "ratio": s / f} for f, s in pairs],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=list(CONFIGS), default="llama3")
    ap.add_argument("--n", default="4096", help="comma-separated lengths")
    ap.add_argument("--layers", default=None, help="comma-separated layer counts")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--memory-runs", type=int, default=1, help="interleaved fresh-process pairs per cell"
    )
    ap.add_argument(
        "--check", action="store_true", help="null fraction against effective_attention"
    )
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--phases", action="store_true", help="one layer's phases, no model")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    ns = [int(x) for x in args.n.split(",")]
    layer_counts = [int(x) for x in args.layers.split(",")] if args.layers else [None]
    print(f"{args.model}, float32 sdpa, {args.threads} threads; time: fastest of "
          f"{args.repeats} interleaved runs; memory: peak RSS above the loaded model, one "
          "fresh process per cell")  # fmt: skip
    print(f"{'layers':>6} {'n':>5} {'fwd s':>8} {'scan s':>8} {'× fwd':>6} {'fwd MB':>8} "
          f"{'scan MB':>8} {'× fwd':>6}")  # fmt: skip
    rows = []
    if args.phases:
        for n in ns:
            ph = _child("phases_child", n, args.threads)
            print(f"n = {n}, one layer: " + ", ".join(f"{k} {v:.2f} s" for k, v in ph.items()))
            rows.append({"phases_n": n, **ph})
        ns = []
    for layers in layer_counts:
        for n in ns:
            r = row(args.model, layers, n, args.threads, args.repeats, args.memory_runs)
            rows.append(r)
            print(f"{r['layers']:6d} {n:5d} {r['forward_s']:8.2f} {r['scan_s']:8.2f} "
                  f"{r['time_ratio']:6.2f} {r['forward_peak_mb']:8.0f} {r['scan_peak_mb']:8.0f} "
                  f"{r['memory_ratio']:6.2f}", flush=True)  # fmt: skip
    if args.check:
        for n in ns:
            c = _child("check_child", args.model, layer_counts[0], n, args.threads, args.samples)
            print(f"n = {n}: null fraction, scan against effective_attention on "
                  f"{args.samples} sampled heads: max |diff| = {c['max_abs_diff']:.2e}")  # fmt: skip
            rows.append({"check_n": n, **c})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
