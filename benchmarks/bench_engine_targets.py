"""The certificate engine's targets (issue 47), through the public API and its default backend.

Each part in one process after `ensure_compiled()` (the engine's disk cache loaded), with
`--threads` torch threads (the engine's lock steps run on that many threads):

- minilm: `interval_map` of every row of one MiniLM head (layer 2, head 0, the first
  Wikipedia pair of at least 120 tokens; m = 33) — target ≤ 0.5 s;
- row: `attention_intervals` on the last row of the Llama-3-sized causal head of
  bench_causal.py (layer 1, head 0, `--n` keys, m = 129) — target ≤ 2 s;
- head: `interval_map` of that whole head at n = `--n` — target ≤ 60 s;
- budget: `interval_map` of that head with `time_budget=` a third of the head's measured
  time: it must return or refuse within 10 % of the budget;
- first: in a fresh process with `NUMBA_CACHE_DIR` set to an empty folder (the engine's
  own cache in the user cache folder, as `scripts/setup.sh` leaves it), the first
  `attention_intervals` on the 512-key row — target ≤ 3 s.

Medians of `--repeats` runs (the first call of each part, which loads the engine, apart).

Run: python benchmarks/bench_engine_targets.py [--parts minilm,row,head,budget,first]
     [--threads 2] [--n 512] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_causal import build, load, zipf_ids

FIRST = r"""
import sys, time, warnings
sys.path.insert(0, "benchmarks")
import torch
torch.set_num_threads(int(sys.argv[1]))
from bench_causal import build, zipf_ids
from identifiable.attention import attention_intervals
_, model = build("llama")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    trace = model.trace(zipf_ids(int(sys.argv[2])))
t0 = time.perf_counter()
attention_intervals(trace, 1, 0, int(sys.argv[2]) - 1)
print("SECONDS", time.perf_counter() - t0)
"""


def _timed(call, repeats: int) -> dict:
    call()  # the engine loaded, the shapes seen once
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        runs.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(runs), "runs_s": runs, "load": load()}


def _llama_trace(n: int):
    _, model = build("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.trace(zipf_ids(n))


def _budget(trace, seconds: float) -> dict:
    from identifiable.attention import interval_map
    from identifiable.errors import IdentifiableError

    t0 = time.perf_counter()
    try:
        interval_map(trace, layers=[1], heads=[0], time_budget=seconds, progress=False)
        outcome = "returned"
    except IdentifiableError as err:
        outcome = f"refused: {err}"
    took = time.perf_counter() - t0
    return {"budget_s": seconds, "took_s": took, "ratio": took / seconds, "outcome": outcome}


def _first(threads: int, n: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as empty:
        env = {**os.environ, "NUMBA_CACHE_DIR": empty, "OMP_NUM_THREADS": str(threads)}
        done = subprocess.run(
            [sys.executable, "-c", FIRST, str(threads), str(n)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        left = os.listdir(empty)
    line = next(x for x in done.stdout.splitlines() if x.startswith("SECONDS"))
    return {"seconds": float(line.split()[1]), "numba_cache_files": len(left), "load": load()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="minilm,row,head,budget,first")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    parts = args.parts.split(",")
    torch.set_num_threads(args.threads)
    import identifiable
    from identifiable.attention import attention_intervals, interval_map
    from identifiable.attention.lp import ensure_compiled

    ensure_compiled()
    out: dict = {"threads": args.threads, "n": args.n}
    if "minilm" in parts:
        m = identifiable.load_model("minilm")
        corpus = identifiable.load_corpus(
            "wikipedia-sample", unit="pair", tokenizer=m.tokenizer, max_tokens=128
        )
        tr = next(t for t in (m.trace(item) for item in corpus) if t.n_tokens >= 120)
        out["minilm"] = _timed(
            lambda: interval_map(tr, layers=[2], heads=[0], progress=False), args.repeats
        )
        out["minilm"]["n"] = tr.n_tokens
        print(f"MiniLM head (n = {tr.n_tokens}): {out['minilm']}", flush=True)
    if {"row", "head", "budget"} & set(parts):
        trace = _llama_trace(args.n)
        if "row" in parts:
            row = lambda: attention_intervals(trace, 1, 0, args.n - 1)  # noqa: E731
            out["row"] = _timed(row, args.repeats)
            print(f"one {args.n}-key causal row: {out['row']}", flush=True)
        if "head" in parts or "budget" in parts:
            head = lambda: interval_map(trace, layers=[1], heads=[0], progress=False)  # noqa: E731
            out["head"] = _timed(head, max(1, args.repeats // 2))
            print(f"the head at n = {args.n}: {out['head']}", flush=True)
        if "budget" in parts:
            out["budget"] = _budget(trace, out["head"]["median_s"] / 3)
            print(f"time_budget: {out['budget']}", flush=True)
    if "first" in parts:
        out["first"] = _first(args.threads, args.n)
        print(f"first use, empty NUMBA_CACHE_DIR: {out['first']}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
