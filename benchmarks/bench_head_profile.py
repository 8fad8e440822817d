"""Where the time of a Llama-3-sized causal head goes, and the lock step's B⁻¹ batch side by side.

The head is bench_causal.py's (layer 1, head 0, m = 129, Zipf-distributed ids), its rows
cut into row sets as `interval_map` cuts them and solved as it solves them (`mapwork`),
with `--threads` lock steps (default 2) and torch threads.

- profile: each row set's seconds, process CPU seconds (CPU / wall says how many threads
  ran) and pivots; LPs and pivots per band of 64 rows; µs per pivot and thread; the
  machine's caches (sysfs), the batch `EngineOptions` chooses, BLAS's kernels
  (threadpoolctl). Per-row pivots go to `--json`.
- batches: the `--tail` widest rows (all of them with `--tail 0`) with each thread
  group's lock step holding `--batches` MB of B⁻¹ (default 4, 1.5 and 1: what the
  engine takes on 2 threads where the last-level cache is 32 MB or more, and what fits
  this core's 2 MB L2), alternating which goes first, `--repeats` times: wall and CPU
  seconds, pivots, the largest |difference| of the bounds.
- passes: the two passes a primal pivot makes over one chain's B⁻¹ (m = 129: the entering
  column B⁻¹A_q, the engine's `kernel.column`, then the rank-one update accumulating v,
  `kernel.pivot_basis`'s pass on bare arrays) over a batch of C chains' inverses, one
  thread: µs per pivot for C = 4 … 63, with B⁻¹ (and A, the column, v) in double as the
  engine keeps them and in single (what steering in single precision would read), compiled as numba does by default and, in a second process, without LLVM's preference for
  256-bit vectors on AVX-512 cores (`-prefer-256-bit`); with the count of 512-bit
  (zmm) and 256-bit (ymm) registers in the column loop's machine code.

Run: python benchmarks/bench_head_profile.py [--parts profile,batches,passes] [--n 512]
     [--threads 2] [--tail 48] [--batches 4,1.5,1] [--repeats 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_causal import build, load, zipf_ids


def _trace(n: int):
    _, model = build("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.trace(zipf_ids(n))


def _sets(trace, rows: list[int]) -> list:
    from identifiable.attention.mapwork import _head_sets

    return [s for sets in _head_sets(trace, 1, 0, rows, None) for s in sets]


def _solve(sets, threads: int, override: dict) -> tuple:
    """(wall s, CPU s, [(rows, lower, upper, LPs, pivots, fallbacks)]) as `interval_map`."""
    from identifiable.attention.mapwork import _solve_head

    c0, t0 = time.process_time(), time.perf_counter()
    out = _solve_head((sets, None, "", None, threads, override))
    return time.perf_counter() - t0, time.process_time() - c0, out


def _machine() -> dict:
    from threadpoolctl import threadpool_info

    from identifiable.attention.lp import EngineOptions, llc_bytes

    blas = sorted({f"{i['internal_api']} {i.get('architecture')}" for i in threadpool_info()})
    opts = EngineOptions()
    caches = {}
    root = "/sys/devices/system/cpu/cpu0/cache"
    for entry in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        if entry.startswith("index"):
            with open(f"{root}/{entry}/level") as lv, open(f"{root}/{entry}/size") as sz:
                caches[f"L{lv.read().strip()} {entry}"] = sz.read().strip()
    return {"caches": caches, "llc": llc_bytes(), "batch_1": opts.batch(1), "batch_2": opts.batch(2),
            "blas": blas, "cpus": os.cpu_count()}  # fmt: skip


def profile(trace, threads: int, out: dict) -> None:
    n = trace.n_tokens
    sets, per_row, parts = _sets(trace, list(range(n))), {}, []
    for s in sets:
        wall, cpu, got = _solve([s], threads, {})
        rows, _, _, lps, pivots, fallbacks = got[0]
        per_row.update(
            {int(r): (int(a), int(p)) for r, a, p in zip(rows, lps, pivots, strict=True)}
        )
        parts.append({"rows": [int(rows.min()), int(rows.max())], "shared": s.aq.shape[0] == 1,
                      "wall_s": wall, "cpu_s": cpu, "pivots": int(np.sum(pivots)),
                      "fallbacks": fallbacks})  # fmt: skip
        if np.sum(pivots):
            print(f"rows {rows.min()}–{rows.max()}: {wall:.1f} s, CPU {cpu:.1f} s "
                  f"({cpu / wall:.2f} threads), {int(np.sum(pivots)):,} pivots, "
                  f"{threads * wall / np.sum(pivots) * 1e6:.1f} µs a pivot and thread", flush=True)  # fmt: skip
    bands = []
    for lo in range(0, n, 64):
        got = [v for r, v in per_row.items() if lo <= r < lo + 64]
        bands.append({"rows": [lo, lo + 63], "lps": sum(v[0] for v in got),
                      "pivots": sum(v[1] for v in got)})  # fmt: skip
        print(f"rows {lo}–{lo + 63}: {bands[-1]['lps']:,} LPs, {bands[-1]['pivots']:,} pivots", flush=True)  # fmt: skip
    wall = sum(p["wall_s"] for p in parts)
    pivots = sum(p["pivots"] for p in parts)
    out["profile"] = {"parts": parts, "bands": bands, "per_row": per_row, "wall_s": wall,
                      "cpu_s": sum(p["cpu_s"] for p in parts), "pivots": pivots,
                      "us_per_pivot_thread": threads * wall / pivots * 1e6, "load": load()}  # fmt: skip
    print(f"head: {wall:.1f} s, {pivots:,} pivots, {load()}", flush=True)


def batches(trace, threads: int, tail: int, repeats: int, sizes: list[float], out: dict) -> None:
    """The `tail` widest rows with each group's lock step holding `sizes` MB of B⁻¹
    (`EngineOptions.chain_bytes`: twice that on 2 threads), alternating the order."""
    n = trace.n_tokens
    sets = _sets(trace, list(range(n - tail if tail else 0, n)))
    per = 2 if threads > 1 else 1
    sides = {f"{mb:g} MB": {"chain_bytes": int(mb * per * (1 << 20))} for mb in sizes}
    runs: dict = {k: [] for k in sides}
    got: dict = {}
    for r in range(repeats):
        for name in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            wall, cpu, res = _solve(sets, threads, sides[name])
            pivots = sum(int(np.sum(x[4])) for x in res)
            got[name] = np.concatenate([np.concatenate([x[1], x[2]], 1) for x in res])
            runs[name].append({"wall_s": wall, "cpu_s": cpu, "pivots": pivots, "load": load()})
            print(f"B⁻¹ of {name} a group: {wall:.1f} s, CPU {cpu:.1f} s, {pivots:,} pivots, "
                  f"{cpu / pivots * 1e6:.1f} µs CPU a pivot, {load()}", flush=True)  # fmt: skip
    med = {k: {f: float(np.median([x[f] for x in v])) for f in ("wall_s", "cpu_s")}
           for k, v in runs.items()}  # fmt: skip
    first = got[next(iter(got))]
    diff = max(float(np.abs(g - first).max()) for g in got.values())
    out["batches"] = {"tail": tail, "runs": runs, "medians": med, "max_diff": diff}
    print(f"medians {med}; max |difference| {diff:.1e}", flush=True)


PASSES = r"""
import json, re, sys, time
import numpy as np
# the engine's own B⁻¹ A_q, compiled afresh here under this process's NUMBA_CPU_* settings
from identifiable.attention.lp.kernel import column, jit

@jit
def update(binv, prow, v, r, col):
    # kernel.pivot_basis's steepest-edge pass over B⁻¹, on bare arrays instead of a Chain
    m = binv.shape[0]
    for c in range(m):
        prow[c] = binv[r, c] / col[r]
        v[c] = col[r] * binv[r, c]
        binv[r, c] = 0.0
    i = 0
    while i + 4 <= m:
        c0, c1, c2, c3 = col[i], col[i + 1], col[i + 2], col[i + 3]
        for c in range(m):
            x0, x1, x2, x3, p = binv[i, c], binv[i + 1, c], binv[i + 2, c], binv[i + 3, c], prow[c]
            v[c] += c0 * x0 + c1 * x1 + c2 * x2 + c3 * x3
            binv[i, c] = x0 - c0 * p
            binv[i + 1, c] = x1 - c1 * p
            binv[i + 2, c] = x2 - c2 * p
            binv[i + 3, c] = x3 - c3 * p
        i += 4
    for k in range(i, m):
        for c in range(m):
            x = binv[k, c]
            v[c] += col[k] * x
            binv[k, c] = x - col[k] * prow[c]
    binv[r] = prow

@jit
def sweep(binvs, at, prows, vs, cols, steps, both):
    C, m = binvs.shape[0], binvs.shape[1]
    for s in range(steps):
        for c in range(C):
            column(binvs[c], at, (s * 7 + c * 13) % at.shape[0], cols[c])
            if both:  # a benign pivot, so that B⁻¹ stays bounded
                cols[c][:] = 1e-3
                cols[c][(s + c) % m] = 1.0
                update(binvs[c], prows[c], vs[c], (s + c) % m, cols[c])

m, n = 129, 512
rng = np.random.default_rng(0)
result = {}
for dtype in (np.float64, np.float32):  # the engine's B⁻¹, and B⁻¹ steering in single
    at = rng.standard_normal((n, m)).astype(dtype)
    out = {}
    for C in (4, 7, 15, 30, 63):
        binvs = np.stack([np.eye(m) + 1e-3 * rng.standard_normal((m, m)) for _ in range(C)])
        binvs = binvs.astype(dtype)
        prows, vs, cols = (np.zeros((C, m), dtype) for _ in range(3))
        steps = max(2, 20000 // C)
        sweep(binvs, at, prows, vs, cols, 2, True)
        best = [np.inf, np.inf]
        for _ in range(3):
            for k, both in enumerate((False, True)):
                t0 = time.perf_counter()
                sweep(binvs, at, prows, vs, cols, steps, both)
                best[k] = min(best[k], (time.perf_counter() - t0) / (steps * C) * 1e6)
        out[C] = best
    result["per_pivot_us" if dtype == np.float64 else "per_pivot_us_float32"] = out
asm = next(iter(column.inspect_asm().values()))
print("RESULT", json.dumps({**result, "zmm": len(re.findall("zmm", asm)),
                           "ymm": len(re.findall("ymm", asm))}))
"""


def passes(out: dict) -> None:
    import llvmlite.binding as llvm

    name, feats = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
    variants = {"default": {}, "512-bit": {"NUMBA_CPU_NAME": name,
                                           "NUMBA_CPU_FEATURES": feats + ",-prefer-256-bit"}}  # fmt: skip
    out["passes"] = {"cpu": name, "load": load()}
    for label, env in variants.items():
        done = subprocess.run([sys.executable, "-c", PASSES], env={**os.environ, **env},
                              capture_output=True, text=True, check=True)  # fmt: skip
        line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT"))
        got = json.loads(line[len("RESULT") :])
        out["passes"][label] = got
        for key, size in (("per_pivot_us", 8), ("per_pivot_us_float32", 4)):
            for c, (col, both) in got[key].items():
                print(f"{label}, {size * 8}-bit B⁻¹: {c} chains "
                      f"({int(c) * 129 * 129 * size / 2**20:.1f} MB): column {col:.2f} µs, "
                      f"column + update {both:.2f} µs a pivot", flush=True)  # fmt: skip
        print(f"{label}: zmm {got['zmm']}, ymm {got['ymm']} in the column loop", flush=True)
    out["passes"]["load_after"] = load()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="profile,batches,passes")
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tail", type=int, default=48, help="batches: the widest rows (0: all)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batches", default="4,1.5,1", help="MB of B⁻¹ a group, compared")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    parts = args.parts.split(",")
    torch.set_num_threads(args.threads)
    from identifiable.attention.lp import ensure_compiled

    ensure_compiled()
    out: dict = {"n": args.n, "threads": args.threads, "machine": _machine()}
    print(out["machine"], flush=True)
    if "passes" in parts:
        passes(out)
    if "profile" in parts or "batches" in parts:
        trace = _trace(args.n)
        if "batches" in parts:
            sizes = [float(x) for x in args.batches.split(",")]
            batches(trace, args.threads, args.tail, args.repeats, sizes, out)
        if "profile" in parts:
            profile(trace, args.threads, out)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
