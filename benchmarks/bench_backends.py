"""The compiled engine against HiGHS (highspy, one model per row, hot starts), side by side.

Same threads on both sides (`--threads`, default 2: the engine's lock steps, HiGHS's
models), in one process, alternating which side goes first (`--repeats`), medians:
- minilm: every row of one MiniLM head (layer 2, head 0, a Wikipedia pair of ~121
  tokens; m = 33; the rows share A: the engine runs key order);
- row: the last row of the Llama-3-sized causal head of bench_causal_certify.py
  (layer 1, head 0, n = `--n` keys, m = 129; `attention_intervals`' layout: row order,
  32 chains);
- head: that head at n = `--n`, every row, as `interval_map` builds it (nested rows and
  the rest); HiGHS on `--sample` rows spread over the rows with a null space only (a whole
  head would take hours), its whole-head time estimated by interpolating the sampled
  rows' seconds over every row's key count;
- small: a bidirectional synthetic head of `--small-n` keys (m = 5), where the engine's
  fixed costs count most;
- choices: the engine against itself with a plain alternative to each of its two risky
  pieces, on the `--tail` widest rows of that head: BLAS's sgemm instead of A packed in
  panels, numba's reference counts instead of borrowed arrays.
Each part reports both times, the ratio HiGHS / engine, and the largest |difference|
between the two sides' bounds (both are certified; target ≤ 1e-9). The engine's disk
cache is loaded before any timing.

Run: python benchmarks/bench_backends.py [--parts minilm,row,head,small,choices]
     [--threads 2] [--n 512] [--sample 6] [--tail 32] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_causal import build, load, zipf_ids


def _sets(trace, layer: int, head: int, rows=None):
    from identifiable.attention.mapwork import _head_sets

    rows = list(range(trace.n_tokens)) if rows is None else rows
    return [s for sets in _head_sets(trace, layer, head, rows, None) for s in sets]


def _solve(sets, threads: int, backend: str, **override):
    """(seconds, {row: (lower, upper)}) of the row sets, as `interval_map` solves them,
    with `backend` and other EngineOptions fields overridden."""
    from identifiable.attention.mapwork import _solve_head

    t0 = time.perf_counter()
    out = _solve_head((sets, None, "", None, threads, {"backend": backend, **override}))
    sec = time.perf_counter() - t0
    bounds = {}
    for rows, lo, up, *_ in out:
        for i, r in enumerate(rows.tolist()):
            bounds[r] = (lo[i], up[i])
    return sec, bounds


def _diff(x: dict, y: dict) -> float:
    return max(
        max(float(np.abs(x[r][0] - y[r][0]).max()), float(np.abs(x[r][1] - y[r][1]).max()))
        for r in set(x) & set(y)
    )


def _side_by_side(name: str, sets, threads: int, repeats: int, out: dict) -> None:
    runs: dict = {"engine": [], "highs": []}
    got: dict = {}
    for r in range(repeats):
        for backend in ("engine", "highs") if r % 2 == 0 else ("highs", "engine"):
            sec, got[backend] = _solve(sets, threads, backend)
            runs[backend].append(sec)
    e, h = float(np.median(runs["engine"])), float(np.median(runs["highs"]))
    out[name] = {"engine_s": e, "highs_s": h, "ratio": h / e, "max_diff": _diff(*got.values()),
                 "engine_runs_s": runs["engine"], "highs_runs_s": runs["highs"], "load": load()}  # fmt: skip
    print(f"{name}: engine {e:.3f} s, HiGHS {h:.3f} s, HiGHS / engine {h / e:.1f}, "
          f"max |difference| {out[name]['max_diff']:.1e}, {load()}", flush=True)  # fmt: skip


def _row_sets(trace, row: int):
    """The one-row problem of `attention_intervals`."""
    from identifiable.attention.mapwork import RowSet, head_rows

    (rs,) = head_rows(trace, 1, 0, [row])
    return [RowSet(rs.rows, rs.keys, rs.raw, rs.aq, rs.paper_basis, rs.null_dim)]


def _head(trace, threads: int, sample: int, out: dict) -> None:
    n = trace.n_tokens
    sec, engine = _solve(_sets(trace, 1, 0), threads, "engine")
    live = [r for r in range(n) if r + 1 > 129]  # rows with a null space (m = 129)
    picks = sorted({live[int(i)] for i in np.linspace(0, len(live) - 1, sample).round()})
    times, highs = [], {}
    for r in picks:
        t, got = _solve(_row_sets(trace, r), threads, "highs")
        times.append(t)
        highs.update(got)
        print(f"head row {r} ({r + 1} keys): HiGHS {t:.1f} s, {load()}", flush=True)
    estimate = float(np.interp(live, picks, times).sum())
    out["head"] = {"engine_s": sec, "highs_sampled_rows": picks, "highs_row_s": times,
                   "highs_estimate_s": estimate, "ratio_estimate": estimate / sec,
                   "max_diff": _diff(engine, highs), "load": load()}  # fmt: skip
    print(f"head at n = {n}: engine {sec:.1f} s; HiGHS about {estimate:.0f} s (from "
          f"{len(picks)} rows), {estimate / sec:.0f}x; max |difference| "
          f"{out['head']['max_diff']:.1e}", flush=True)  # fmt: skip


def _choices(trace, threads: int, repeats: int, tail: int, out: dict) -> None:
    """The two risky pieces of the engine against plain alternatives, side by side on the
    `tail` widest rows of the head (nested rows, shared A, single precision): A packed in
    panels against BLAS's sgemm (packed_product=False), and borrowed arrays against
    numba's reference counts (borrow=False)."""
    n = trace.n_tokens
    sets = _sets(trace, 1, 0, list(range(n - tail, n)))
    sides = {"default": {}, "sgemm": {"packed_product": False}, "counted": {"borrow": False}}
    for options in sides.values():
        _solve(sets, threads, "engine", **options)  # compiled (or loaded) outside the timings
    runs: dict = {name: [] for name in sides}
    got: dict = {}
    for r in range(repeats):
        for name in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            sec, got[name] = _solve(sets, threads, "engine", **sides[name])
            runs[name].append(sec)
    med = {name: float(np.median(t)) for name, t in runs.items()}
    out["choices"] = {"rows": tail, "runs_s": runs, "median_s": med, "load": load(),
                      "sgemm_over_packed": med["sgemm"] / med["default"],
                      "counted_over_borrowed": med["counted"] / med["default"],
                      "max_diff": max(_diff(got["default"], got[k]) for k in ("sgemm", "counted"))}  # fmt: skip
    print(f"{tail} widest rows: packed + borrowed {med['default']:.1f} s, sgemm "
          f"{med['sgemm']:.1f} s ({med['sgemm'] / med['default']:.2f}x), reference counts "
          f"{med['counted']:.1f} s ({med['counted'] / med['default']:.2f}x), "
          f"max |difference| {out['choices']['max_diff']:.1e}, {load()}", flush=True)  # fmt: skip


def _small(n: int, threads: int, repeats: int, out: dict) -> None:
    from identifiable.attention.mapwork import RowSet

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from helpers.traces import shared_rows

    aq, a, _, _ = shared_rows(n=n, d_v=4, rows=n, seed=0)
    keys = np.ones(a.shape, bool)
    rs = RowSet(np.arange(n), keys, a, aq, aq, np.full(n, n - aq.shape[1]))
    _side_by_side(f"small (n = {n})", [rs], threads, repeats, out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="minilm,row,head,small")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--small-n", type=int, default=12)
    p.add_argument("--sample", type=int, default=6)
    p.add_argument("--tail", type=int, default=32, help="choices: the widest rows of the head")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    parts = args.parts.split(",")
    torch.set_num_threads(args.threads)
    from identifiable.attention.lp import ensure_compiled

    ensure_compiled()
    out: dict = {"threads": args.threads}
    if "small" in parts:
        _small(args.small_n, args.threads, args.repeats, out)
    if "minilm" in parts:
        import identifiable

        m = identifiable.load_model("minilm")
        corpus = identifiable.load_corpus("wikipedia-sample", unit="pair", tokenizer=m.tokenizer,
                                          max_tokens=128)  # fmt: skip
        tr = next(t for t in (m.trace(item) for item in corpus) if t.n_tokens >= 120)
        _side_by_side(f"minilm head (n = {tr.n_tokens})", _sets(tr, 2, 0), args.threads,
                      args.repeats, out)  # fmt: skip
    if "row" in parts or "head" in parts or "choices" in parts:
        _, model = build("llama")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trace = model.trace(zipf_ids(args.n))
        if "row" in parts:
            _side_by_side(f"row of {args.n} keys", _row_sets(trace, args.n - 1), args.threads,
                          max(1, args.repeats // 2), out)  # fmt: skip
        if "head" in parts:
            _head(trace, args.threads, args.sample, out)
        if "choices" in parts:
            _choices(trace, args.threads, args.repeats, args.tail, out)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
