"""Certified attention at scale: interval maps on MiniLM, old route vs new, side by side.

One run, the same threads on both sides (default 1: torch.set_num_threads, BLAS through
threadpoolctl and the environment, OpenMP). Timings are repeated `--repeats` times,
old and new interleaved, and the median is reported with the load average (the machine
is shared: other jobs slow both sides alike, which the ratio cancels, not the seconds).
- head: every row of one MiniLM head on a Wikipedia-sample pair of ~128 tokens.
  new = `interval_map` (the compiled engine, see docs/certified_attention.md);
  engine_old = the same call with the simplex engine of `--before` (default 94983e4: the
  numpy lock step), read with git and run in this process;
  rowwise = `attention_intervals` (the same engine, row by row: warm starts across keys
  only) on `--old-rows` rows spread over the head, scaled to the whole head (say
  `--old-rows 0` for every row).
- row512: one row of a 512-token text, the same three routes.
- equality: on `--check-heads` sampled heads × `--check-rows` rows, every bound of
  the new map against a plain `scipy.optimize.linprog` per key and sense on the raw
  constraints x ≥ 0, Σx = Σa, xᵀV = aᵀV (HiGHS tolerances 1e-10; V = E·W_V; col(V H) = col(V) since MiniLM's
  W_O blocks have full row rank), max |difference| reported (target ≤ 1e-7).
- witnesses: every vertex that settled a bound on those rows, checked against
  x ≥ 0, |Σx − Σa| and ‖(x − a) V H‖ / ‖a V H‖ (target ≤ 1e-9).

Run: python benchmarks/bench_certify.py [--threads 1] [--repeats 3] [--old-rows 8]
     [--before 94983e4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

# HiGHS' default feasibility tolerance (1e-7) is the size of the target itself: the
# reference LPs are solved to 1e-10 so that their own error does not dominate.
_TIGHT = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--old-rows", type=int, default=8, help="0: run the old route on every row")
    p.add_argument("--repeats", type=int, default=3, help="timings: median of this many runs")
    p.add_argument("--layer", type=int, default=2, help="0..5 (numbered from 0, as everywhere)")
    p.add_argument("--head", type=int, default=0)
    p.add_argument("--check-heads", type=int, default=2)
    p.add_argument("--check-rows", type=int, default=8, help="≥ 8: the map takes key order")
    p.add_argument("--before", default="94983e4", help="the engine to compare with (git)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    import numpy as np
    import torch
    from scipy.optimize import linprog
    from threadpoolctl import threadpool_limits

    import identifiable
    from identifiable.attention import attention_intervals, interval_map
    from identifiable.attention.lp import BoundProblem, EngineOptions, bound_keys, ensure_compiled
    from identifiable.attention.mapwork import _solve_head, head_rows

    torch.set_num_threads(args.threads)
    threadpool_limits(args.threads)
    import identifiable.attention.mapwork as map_mod

    engine_new = map_mod.bound_keys
    engine_old = _old_engine(args.before)
    t0 = time.perf_counter()
    ensure_compiled()  # once per install (cached on disk): outside the timings
    print(f"engine compiled or loaded in {time.perf_counter() - t0:.1f} s", flush=True)

    def timed(fn, engine):
        """Seconds and result of fn() with `engine` behind interval_map."""
        map_mod.bound_keys = engine
        try:
            t0 = time.perf_counter()
            res = fn()
            return time.perf_counter() - t0, res
        finally:
            map_mod.bound_keys = engine_new

    m = identifiable.load_model("minilm")
    corpus = identifiable.load_corpus("wikipedia-sample", unit="pair", tokenizer=m.tokenizer,
                                      max_tokens=128)  # fmt: skip
    tr = next(t for t in (m.trace(item) for item in corpus) if t.n_tokens >= 120)
    layer, head = args.layer, args.head
    n = tr.n_tokens
    out: dict = {"threads": args.threads, "n": n, "layer": args.layer, "head": head}

    # ---- whole head ------------------------------------------------------------------
    out["load_average_start"] = os.getloadavg()[0]
    head_times: dict[str, list[float]] = {"new": [], "old": []}
    new = old_map = None
    for _ in range(args.repeats):  # interleaved, so both sides see the same load
        for name, engine in (("new", engine_new), ("old", engine_old)):
            sec, res = timed(lambda: interval_map(tr, layers=[layer], heads=[head]), engine)
            head_times[name].append(sec)
            new, old_map = (res, old_map) if name == "new" else (new, res)
    out["head_new_s"] = float(np.median(head_times["new"]))
    out["head_engine_old_s"] = float(np.median(head_times["old"]))
    out["head_new_runs_s"], out["head_engine_old_runs_s"] = head_times["new"], head_times["old"]
    out["head_engine_speedup"] = out["head_engine_old_s"] / out["head_new_s"]
    out["head_pivots_new"], out["head_pivots_old"] = (
        int(new.pivots.sum()),
        int(old_map.pivots.sum()),
    )
    out["head_new_vs_engine_old_max_diff"] = max(
        float((new.lower - old_map.lower).abs().max()),
        float((new.upper - old_map.upper).abs().max()),
    )
    out["head_lps"], out["head_fallbacks"] = new.lps_solved, new.fallbacks
    rows = (
        list(range(n))
        if args.old_rows == 0
        else np.linspace(0, n - 1, args.old_rows).round().astype(int).tolist()
    )
    t0 = time.perf_counter()
    diff = 0.0
    for r in rows:
        iv = attention_intervals(tr, layer, head, r)
        diff = max(diff, float((iv.lower - new.lower[0, 0, r]).abs().max()),
                   float((iv.upper - new.upper[0, 0, r]).abs().max()))  # fmt: skip
    old = time.perf_counter() - t0
    out["head_rowwise_s"] = old * n / len(rows)
    out["head_rowwise_measured_rows"] = len(rows)
    out["head_rowwise_speedup"] = out["head_rowwise_s"] / out["head_new_s"]
    out["head_rowwise_vs_new_max_diff"] = diff
    # What the time-budget check would estimate for this head (one probe row).
    sets = head_rows(tr, layer, head)
    t0 = time.perf_counter()
    _solve_head(([_one_row(sets, n - 1)], None, "", None, args.threads))
    out["probe_row_s"] = time.perf_counter() - t0
    out["probe_ratio"] = out["probe_row_s"] * n / out["head_new_s"]

    # ---- one row at n = 512 ------------------------------------------------------------
    text = " ".join(t for pair in corpus for t in pair)
    long = m.trace(text)
    row = long.n_tokens // 2
    out["row512_n"] = long.n_tokens
    row_times: dict[str, list[float]] = {"new": [], "old": []}
    one = one_old = None
    for _ in range(args.repeats):
        for name, engine in (("new", engine_new), ("old", engine_old)):
            sec, res = timed(
                lambda: interval_map(long, layers=[layer], heads=[head], rows=[row]), engine
            )
            row_times[name].append(sec)
            one, one_old = (res, one_old) if name == "new" else (one, res)
    out["row512_new_s"] = float(np.median(row_times["new"]))
    out["row512_engine_old_s"] = float(np.median(row_times["old"]))
    out["row512_new_runs_s"], out["row512_engine_old_runs_s"] = row_times["new"], row_times["old"]
    out["row512_engine_speedup"] = out["row512_engine_old_s"] / out["row512_new_s"]
    out["row512_pivots_new"], out["row512_pivots_old"] = (
        int(one.pivots.sum()),
        int(one_old.pivots.sum()),
    )
    t0 = time.perf_counter()
    iv = attention_intervals(long, layer, head, row)
    out["row512_rowwise_s"] = time.perf_counter() - t0
    out["row512_rowwise_speedup"] = out["row512_rowwise_s"] / out["row512_new_s"]
    out["row512_max_diff"] = max(float((iv.lower - one.lower[0, 0, 0]).abs().max()),
                                 float((iv.upper - one.upper[0, 0, 0]).abs().max()),
                                 float((one_old.lower - one.lower).abs().max()),
                                 float((one_old.upper - one.upper).abs().max()))  # fmt: skip
    out["load_average_end"] = os.getloadavg()[0]

    # ---- equality with plain linprog, witnesses ---------------------------------------
    rng = np.random.default_rng(0)
    worst_eq = worst_sum = worst_out = 0.0
    worst_neg = 0.0
    n_bounds = n_vertices = 0
    for _ in range(args.check_heads):
        lyr, hd = int(rng.integers(tr.n_layers)), int(rng.integers(tr.n_heads))
        check = sorted(rng.choice(n, size=args.check_rows, replace=False).tolist())
        imap = interval_map(tr, layers=[lyr], heads=[hd], rows=check)
        v = tr.values[lyr, hd].double().numpy()
        t = v @ tr.out_proj[lyr, hd].double().numpy()
        eq = np.vstack([np.ones(n), v.T])
        for i, r in enumerate(check):
            a = tr.attentions[lyr, hd, r].double().numpy()
            for j in range(n):
                for sense, bound in ((1, imap.lower), (-1, imap.upper)):
                    res = linprog(sense * np.eye(n)[j], A_eq=eq, b_eq=eq @ a, bounds=(0, None),
                                  method="highs", options=_TIGHT)  # fmt: skip
                    worst_eq = max(worst_eq, abs(res.x[j] - float(bound[0, 0, i, j])))
                    n_bounds += 1
        for rs in head_rows(tr, lyr, hd, check):
            movable = np.zeros_like(rs.keys)
            for i in range(rs.rows.size):
                aq = rs.aq[0 if rs.aq.shape[0] == 1 else i]
                movable[i] = (1 - (aq**2).sum(0) > 1e-9) & rs.keys[i]
            vertices = []
            for order in ("key", "row") if rs.aq.shape[0] == 1 else ("row",):
                sol = bound_keys(
                    BoundProblem(rs.aq, rs.raw, rs.keys, movable),
                    EngineOptions(keep_vertices=True, order=order),
                )
                vertices += list(sol.vertices.items())
            for (i, _, _), x in vertices:
                a = rs.raw[i]
                worst_neg = max(worst_neg, float(-x.min()))
                worst_sum = max(worst_sum, abs(x.sum() - a.sum()))
                worst_out = max(
                    worst_out, float(np.linalg.norm((x - a) @ t) / np.linalg.norm(a @ t))
                )
                n_vertices += 1
    out.update({"equality_bounds": n_bounds, "equality_max_diff": worst_eq,
                "witnesses": n_vertices, "witness_max_negative": worst_neg,
                "witness_max_sum_error": worst_sum, "witness_max_output_residual": worst_out})  # fmt: skip
    for k, val in out.items():
        if isinstance(val, list):
            val = " ".join(f"{v:.3g}" for v in val)
        print(f"{k:34s} {val:.4g}" if isinstance(val, float) else f"{k:34s} {val}")
    ok = (out["head_new_s"] <= 10 and out["row512_new_s"] <= 2 and worst_eq <= 1e-7
          and max(worst_neg, worst_sum, worst_out) <= 1e-9)  # fmt: skip
    print("targets met" if ok else "targets NOT met (see above)")
    if args.json:
        from identifiable.store.files import atomic_write_text

        atomic_write_text(args.json, json.dumps(out, indent=2))
    sys.exit(0 if ok else 1)


def _old_engine(commit: str):
    """The engine of the attention package at `commit`, read with git and run in this
    process (bench_causal_certify's importer: module `_oldattn`), behind `bound_keys`'s
    signature: its own `bound_keys`, or an adapter to the `interval_simplex` before it."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_causal_certify import _GitAttention

    sys.meta_path.insert(0, _GitAttention(commit))
    try:
        import _oldattn.lp  # type: ignore[import-not-found]

        return _oldattn.lp.bound_keys
    except (ImportError, AttributeError, subprocess.CalledProcessError):
        import _oldattn.simplex  # type: ignore[import-not-found]

    def adapter(problem, options):
        return _oldattn.simplex.interval_simplex(
            problem.aq, problem.raw, problem.allowed, problem.movable,
            chains_per_row=options.chains_per_row, what=problem.what, order=options.order,
            block=options.block, deadline=options.deadline, threads=options.threads,
        )  # fmt: skip

    return adapter


def _one_row(sets, row):
    from identifiable.attention.mapwork import RowSet

    for rs in sets:
        hit = (rs.rows == row).nonzero()[0]
        if hit.size:
            i = int(hit[0])
            return RowSet(rs.rows[i : i + 1], rs.keys[i : i + 1], rs.raw[i : i + 1],
                          rs.aq if rs.aq.shape[0] == 1 else rs.aq[i : i + 1],
                          rs.paper_basis if rs.paper_basis.shape[0] == 1 else rs.paper_basis[i : i + 1],
                          rs.null_dim[i : i + 1])  # fmt: skip
    raise ValueError(row)


if __name__ == "__main__":
    main()
