"""The attention posterior's hit-and-run sampler: time and steps per effective sample
against dim P_i, with a fitted exponent, and what that means for a MiniLM head and a
Llama-3-width causal row.

Sections:
- scaling: one polytope per k (random T of width 8 over k + 9 keys, a softmax row),
  4 chains run by `chains.sample` to `--samples` effective samples of the worst weight;
  steps per effective sample (after the warm-up) and seconds per effective sample (all
  in), and the least-squares exponent of each against k (log-log).
- minilm: the embedded MiniLM, one head (layer 2, head 5) at n ≈ 100, every row at
  once: the wall time of `--steps` hit-and-run steps of all rows × 4 chains, and the time
  that 1,000 effective samples per row need from the fitted steps per effective sample at
  the head's largest dim P_i (a projection, labelled as such).
- llama: one causal row of 512 keys with T of width 128 (Llama-3's head width:
  dim P = 383): the time per step of 4 chains and the same projection.

Run: python benchmarks/bench_posterior.py [--threads 2] [--samples 200]
     [--k 2 4 8 16 32] [--steps 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import torch

from identifiable.attention import chains, hitrun


def polytope(k: int, d: int, seed: int) -> hitrun.Polytopes:
    """A row of k + d + 1 keys with T random of width d: dim P = k."""
    g = torch.Generator().manual_seed(seed)
    s = k + d + 1
    t = torch.randn(s, d, generator=g, dtype=torch.float64)
    a = torch.softmax(torch.randn(s, generator=g, dtype=torch.float64), 0)
    q = torch.linalg.qr(torch.cat([t, torch.ones(s, 1, dtype=torch.float64)], 1), mode="complete")[
        0
    ]
    null = q[:, d + 1 :]
    live = torch.ones(1, s, dtype=torch.bool)
    return hitrun.Polytopes(a[None], null[None], live, torch.zeros(1, s, dtype=torch.float64))


def scaling(ks: list[int], samples: int) -> list[dict]:
    out = []
    for k in ks:
        poly = polytope(k, 8, k)
        cfg = chains.Settings(samples, 4, 0.95, 25 * samples // 4 + 8)
        t0 = time.perf_counter()
        summary = chains.sample(poly, torch.zeros(1, poly.raw.shape[1], dtype=torch.float64), cfg,
                                torch.Generator().manual_seed(0))  # fmt: skip
        wall = time.perf_counter() - t0
        ess, draws = float(summary.ess[0]), int(summary.draws[0])
        steps = draws * chains.sweep(k)
        out.append({"k": k, "ess": ess, "rhat": float(summary.rhat[0]), "draws": draws,
                    "steps_per_es": steps / ess, "seconds_per_es": wall / ess, "wall_s": wall})  # fmt: skip
        print(f"k={k:4d}  ESS {ess:7.0f}  R̂ {out[-1]['rhat']:.4f}  steps/ES "
              f"{steps / ess:9.1f}  s/ES {wall / ess:.2e}  wall {wall:.1f} s", flush=True)  # fmt: skip
    return out


def fit(rows: list[dict], key: str) -> tuple[float, float]:
    """log y = c + e log k: (e, c)."""
    x = np.log([r["k"] for r in rows])
    y = np.log([r[key] for r in rows])
    e, c = np.polyfit(x, y, 1)
    return float(e), float(c)


def step_time(poly: hitrun.Polytopes, steps: int) -> float:
    """Seconds per hit-and-run step of 4 chains on every row of `poly`."""
    gen = torch.Generator().manual_seed(0)
    x_c = hitrun.centre(poly)
    spread = hitrun.rounding(poly, x_c)
    x = hitrun.starts(spread, x_c, 4, gen)
    t0 = time.perf_counter()
    for i in range(steps):
        x = hitrun.step(poly, spread, x, gen)
        if i % hitrun.PROJECT_EVERY == 0:
            x = hitrun.project(poly, x)
    return (time.perf_counter() - t0) / steps


def minilm_head(steps: int) -> tuple[hitrun.Polytopes, int]:
    import identifiable as idf
    from identifiable.attention.posterior import _row_problems, _stack

    m = idf.load_model("minilm")
    text = ("The committee met on Tuesday to review the budget, and after a long discussion "
            "about roads, schools and the new library, it agreed to postpone the vote until "
            "the spring. ") * 3  # fmt: skip
    tr = m.trace(text)
    rows = list(range(tr.n_tokens))
    imap = idf.interval_map(tr, layers=[2], heads=[5], rows=rows, progress=False)
    problems = _row_problems(tr, 2, [5], rows, imap)
    idx = [i for i, p in enumerate(problems) if p.dim > 0]
    poly, _ = _stack(problems, idx, 0.0, torch.device("cpu"))
    return poly, tr.n_tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--k", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--json", type=str, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}, load average {os.getloadavg()[0]:.1f}", flush=True)
    rows = scaling(args.k, args.samples)
    e_steps, c_steps = fit(rows, "steps_per_es")
    e_sec, _ = fit(rows, "seconds_per_es")
    print(f"fitted: steps/ES ∝ k^{e_steps:.2f}, seconds/ES ∝ k^{e_sec:.2f}", flush=True)
    record: dict = {"threads": args.threads, "scaling": rows, "exponent_steps": e_steps,
                    "exponent_seconds": e_sec}  # fmt: skip
    poly, n = minilm_head(args.steps)
    k_max = int(poly.null.shape[-1])
    per_step = step_time(poly, args.steps)
    per_es = math.exp(c_steps) * k_max**e_steps
    est = per_step * per_es * 1000 / 4  # 4 chains share the samples
    print(f"minilm: n {n}, {poly.raw.shape[0]} rows with dim > 0 (max dim {k_max}): "
          f"{per_step * 1e3:.2f} ms per step of all rows × 4 chains; projected 1,000 ESS "
          f"per row: {est:.0f} s", flush=True)  # fmt: skip
    record["minilm"] = {"n": n, "k_max": k_max, "ms_per_step": per_step * 1e3,
                        "projected_s_1000_ess": est}  # fmt: skip
    llama = polytope(383, 128, 0)
    per_step = step_time(llama, max(20, args.steps // 4))
    est = per_step * math.exp(c_steps) * 383**e_steps * 1000 / 4
    print(f"llama row (512 keys, width 128, dim 383): {per_step * 1e3:.2f} ms per step of 4 "
          f"chains; projected 1,000 ESS: {est:.0f} s", flush=True)  # fmt: skip
    record["llama"] = {"ms_per_step": per_step * 1e3, "projected_s_1000_ess": est}
    record["load_average"] = os.getloadavg()[0]
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=1)


if __name__ == "__main__":
    main()
