"""The attention posterior's samplers side by side in one run: the billiard walk compiled
(`billiard_cpu`, on `--threads` threads), the same walk in torch, and hit-and-run in torch;
torch runs its small kernels on one thread, as `attention_posterior` does. Steps and
seconds per effective sample against dim P_i with fitted exponents, a whole MiniLM head
and one Llama-3-width causal row.

Sections:
- scaling: one polytope per k (random T of width 8 over k + 9 keys, a softmax row), 4
  chains run by `chains.sample` to `--samples` effective samples of the worst weight, for
  each route of `--routes`; steps per effective sample (after the warm-up) and seconds per
  effective sample (all in), and the least-squares exponent of each against k (log-log).
  Each run stops at `--budget` seconds (flagged); hit-and-run runs up to `--hitrun-kmax`,
  the torch billiard walk up to `--torch-kmax`.
- minilm: the embedded MiniLM, layer 2 head 5 on the packaged text (n ≈ 100), every row
  with dim P_i > 0 at once, 4 chains, each route of `--case-routes` run to
  `--head-samples` effective samples per row (or `--head-budget` seconds; the worst row's
  ESS per second then gives the time for the target).
- llama: one causal row of 512 keys with T of width 128 (Llama-3's head width:
  dim P = 383), the same.

Run: python benchmarks/bench_posterior.py [--threads 2] [--samples 200]
     [--k 2 4 8 16 32 64 128 256] [--torch-kmax 64] [--budget 60] [--head-budget 120] [--parts scaling minilm llama]
     [--routes compiled torch hitrun] [--case-routes compiled torch] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import torch

from identifiable.attention import billiard_cpu, chains, hitrun

ROUTES = {"compiled": "billiard", "torch": "billiard", "hitrun": "hitrun"}
LANES = [2]  # the compiled route's threads (--threads)


def polytope(k: int, d: int, seed: int) -> hitrun.Polytopes:
    """A row of k + d + 1 keys with T random of width d: dim P = k."""
    g = torch.Generator().manual_seed(seed)
    s = k + d + 1
    t = torch.randn(s, d, generator=g, dtype=torch.float64)
    a = torch.softmax(torch.randn(s, generator=g, dtype=torch.float64), 0)
    ones = torch.ones(s, 1, dtype=torch.float64)
    q = torch.linalg.qr(torch.cat([t, ones], 1), mode="complete")[0]
    null = q[:, d + 1 :]
    live = torch.ones(1, s, dtype=torch.bool)
    return hitrun.Polytopes(a[None], null[None], live, torch.zeros(1, s, dtype=torch.float64))


def run(poly: hitrun.Polytopes, route: str, samples: int, budget: float) -> dict:
    """`chains.sample` with 4 chains on every row of `poly`: wall time, the worst row's
    ESS and R̂, draws and steps after the warm-up (pooled over the chains), flags."""
    walk = ROUTES[route]
    lanes = LANES[0] if route == "compiled" else 0
    cfg = chains.Settings(
        samples,
        4,
        0.95,
        25 * samples // 4 + 8,
        time.perf_counter() + budget,
        walk=walk,
        threads=lanes,
    )
    t0 = time.perf_counter()
    summary = chains.sample(poly, torch.zeros_like(poly.raw), cfg, torch.Generator().manual_seed(0))
    wall = time.perf_counter() - t0
    k = int(poly.null.shape[-1])
    draws = int(summary.draws.min())
    ess = torch.where(summary.ess.isfinite(), summary.ess, 0.0)  # inf: no weight moved
    return {
        "route": route,
        "walk": walk,
        "k": k,
        "rows": int(poly.raw.shape[0]),
        "wall_s": wall,
        "ess": float(ess.min()),
        "rhat": float(summary.rhat.max()),
        "draws": draws,
        "steps": draws * chains.sweep(k, walk),
        "flags": sorted({chains.flag_text(int(f)) for f in summary.flags}),
    }


def scaling(args: argparse.Namespace) -> list[dict]:
    out = []
    for k in args.k:
        for route in args.routes:
            if (route == "hitrun" and k > args.hitrun_kmax) or (
                route == "torch" and k > args.torch_kmax
            ):
                continue
            rec = run(polytope(k, 8, k), route, args.samples, args.budget)
            rec["steps_per_es"] = rec["steps"] / rec["ess"]
            rec["seconds_per_es"] = rec["wall_s"] / rec["ess"]
            out.append(rec)
            print(
                f"{route:8s} k={k:3d}  ESS {rec['ess']:6.0f}  R̂ {rec['rhat']:.4f}  steps/ES "
                f"{rec['steps_per_es']:9.2f}  s/ES {rec['seconds_per_es']:.2e}  wall "
                f"{rec['wall_s']:.1f} s  {'; '.join(f for f in rec['flags'] if f)}",
                flush=True,
            )
    return out


def fit(rows: list[dict], key: str) -> tuple[float, float]:
    """log y = c + e log k: (e, c)."""
    x = np.log([r["k"] for r in rows])
    y = np.log([r[key] for r in rows])
    e, c = np.polyfit(x, y, 1)
    return float(e), float(c)


def minilm_head() -> tuple[hitrun.Polytopes, int]:
    import identifiable as idf
    from identifiable.attention.posterior import _row_problems, _stack

    m = idf.load_model("minilm")
    text = (
        "The committee met on Tuesday to review the budget, and after a long discussion "
        "about roads, schools and the new library, it agreed to postpone the vote until "
        "the spring. "
    ) * 3
    tr = m.trace(text)
    rows = list(range(tr.n_tokens))
    imap = idf.interval_map(tr, layers=[2], heads=[5], rows=rows, progress=False)
    problems = _row_problems(tr, 2, [5], rows, imap)
    idx = [i for i, p in enumerate(problems) if p.dim > 0]
    poly, _ = _stack(problems, idx, 0.0, torch.device("cpu"))
    return poly, tr.n_tokens


def case(name: str, poly: hitrun.Polytopes, args: argparse.Namespace) -> dict:
    """Each route of `--case-routes` run on `poly` to the target or the budget; the time
    for the target from the worst row's ESS per second where the budget stopped it."""
    out = {}
    for route in args.case_routes:
        rec = run(poly, route, args.head_samples, args.head_budget)
        rate = rec["ess"] / rec["wall_s"]
        rec["s_for_target"] = (
            rec["wall_s"]
            if rec["ess"] >= args.head_samples
            else (args.head_samples / rate if rate > 0 else math.inf)
        )
        out[route] = rec
        print(
            f"{name}, {route}: {rec['rows']} rows, dim ≤ {rec['k']}; ESS {rec['ess']:.0f} "
            f"(worst row) in {rec['wall_s']:.1f} s, R̂ {rec['rhat']:.4f}, {rec['draws']} "
            f"draws (pooled), {'; '.join(f for f in rec['flags'] if f) or 'no flags'}; "
            f"time for {args.head_samples} ESS {rec['s_for_target']:.1f} s",
            flush=True,
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2, help="the compiled walk's threads")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--k", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    ap.add_argument("--budget", type=float, default=60.0)
    ap.add_argument("--hitrun-kmax", type=int, default=32)
    ap.add_argument("--torch-kmax", type=int, default=64)
    ap.add_argument("--head-samples", type=int, default=1000)
    ap.add_argument("--head-budget", type=float, default=120.0)
    ap.add_argument("--parts", nargs="+", default=["scaling", "minilm", "llama"])
    ap.add_argument("--routes", nargs="+", default=list(ROUTES), choices=list(ROUTES))
    ap.add_argument("--case-routes", nargs="+", default=["compiled", "torch"], choices=list(ROUTES))
    ap.add_argument("--json", type=str, default=None)
    args = ap.parse_args()
    LANES[0] = args.threads
    torch.set_num_threads(1)  # torch's small kernels, as attention_posterior runs them
    t0 = time.perf_counter()
    billiard_cpu.ready(quiet=True)  # load (or compile) before any timing
    load_s = time.perf_counter() - t0
    print(
        f"compiled walk on {args.threads} threads, torch on 1; load average "
        f"{os.getloadavg()[0]:.1f}",
        flush=True,
    )
    record: dict = {
        "threads": args.threads,
        "torch_threads": 1,
        "load_start": os.getloadavg()[0],
        "compiled_ready_s": load_s,
    }
    if "scaling" in args.parts:
        rows = scaling(args)
        record["scaling"] = rows
        for route in args.routes:
            mine = [r for r in rows if r["route"] == route and r["ess"] > 0]
            if len(mine) < 2:
                continue
            e_steps, _ = fit(mine, "steps_per_es")
            e_sec, _ = fit(mine, "seconds_per_es")
            record[f"{route}_exponent_steps"], record[f"{route}_exponent_seconds"] = e_steps, e_sec
            print(f"{route}: steps/ES ∝ k^{e_steps:.2f}, seconds/ES ∝ k^{e_sec:.2f}", flush=True)
    if "minilm" in args.parts:
        poly, n = minilm_head()
        record["minilm"] = {"n": n, **case(f"minilm (n {n})", poly, args)}
    if "llama" in args.parts:
        record["llama"] = case("llama row (512 keys, width 128)", polytope(383, 128, 0), args)
    record["load_end"] = os.getloadavg()[0]
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=1)


if __name__ == "__main__":
    main()
