"""Causal certificates on a Llama-3-sized head: main's engine against the working tree, side by side.

The model is bench_causal.py's Llama-3 style (random weights, hidden 4096, 32 query and
8 KV heads of width 128, RoPE, 2 layers), traced eager on Zipf-distributed ids, so that
tokens repeat as in text; layer 1 (0-based), head 0, where m = rank([T, 1]) = 129.
"before" is the attention package as of `--before` (default e48a7c3, main before this
change), read with git into module `_oldattn` and run in this process; "after" is the
working tree. Same threads on both sides (`--threads`, default 1), run one after the
other; the load average is printed with each figure.

- row: `attention_intervals` on the last row (n keys);
- tail: `interval_map` on the last `--tail` rows of the head at n (rows that see
  n − tail … n keys: before row by row, after as one nested set walked in key order);
- head: `interval_map` on every row of the head at `--head-n` (default 256);
- agree: the largest |difference| between the two sides' bounds (both are certified
  optima of the same LPs, so it should be round-off, ≤ 1e-9).

Run: python benchmarks/bench_causal_certify.py [--n 512] [--tail 4] [--head-n 256]
     [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.util
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_causal import build, load, timed, zipf_ids

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _GitAttention(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports `_oldattn.X` from src/identifiable/attention/X.py at a commit (imports of
    `identifiable.attention.*` rewritten to `_oldattn.*`; everything else is shared)."""

    def __init__(self, commit: str) -> None:
        self.commit = commit

    def find_spec(self, name, path=None, target=None):
        if name == "_oldattn" or name.startswith("_oldattn."):
            return importlib.util.spec_from_loader(name, self, is_package=name == "_oldattn")
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        tail = module.__name__.partition(".")[2] or "__init__"
        src = subprocess.run(
            ["git", "show", f"{self.commit}:src/identifiable/attention/{tail}.py"],
            cwd=_ROOT, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        if tail == "__init__":
            module.__path__ = []
        src = src.replace("identifiable.attention.", "_oldattn.").replace(
            "from identifiable.attention import", "from _oldattn import"
        )
        exec(compile(src, f"_oldattn/{tail}.py", "exec"), module.__dict__)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--tail", type=int, default=4)
    p.add_argument("--head-n", type=int, default=256)
    p.add_argument("--before", default="e48a7c3")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    sys.meta_path.insert(0, _GitAttention(args.before))
    import _oldattn  # type: ignore[import-not-found]

    from identifiable import attention as new

    _, model = build("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = model.trace(zipf_ids(args.n))
        short = model.trace(zipf_ids(args.head_n))
    out: dict = {"threads": args.threads, "before": args.before, "n": args.n}
    last = args.n - 1
    for side, pkg in (("before", _oldattn), ("after", new)):
        t, iv = timed(lambda pkg=pkg: pkg.attention_intervals(trace, 1, 0, last), 1)
        out[f"row_{side}_s"], out[f"row_{side}_lps"] = t, iv.lp_solved
        out[f"row_{side}_bounds"] = np.stack([iv.lower.numpy(), iv.upper.numpy()])
        print(f"row of {args.n} keys, {side}: {t:.1f} s, {iv.lp_solved} LPs, {load()}",
              flush=True)  # fmt: skip
    rows = list(range(args.n - args.tail, args.n))
    heads = {"tail": (trace, rows), "head": (short, None)}
    for what, (tr, rws) in heads.items():
        for side, pkg in (("before", _oldattn), ("after", new)):
            t, im = timed(lambda pkg=pkg, tr=tr, rws=rws: pkg.interval_map(
                tr, layers=[1], heads=[0], rows=rws, progress=False), 1)  # fmt: skip
            out[f"{what}_{side}_s"], out[f"{what}_{side}_pivots"] = t, int(im.pivots.sum())
            out[f"{what}_{side}_fallbacks"] = im.fallbacks
            out[f"{what}_{side}_bounds"] = np.stack([im.lower.numpy(), im.upper.numpy()])
            print(f"{what} ({len(im.rows)} rows of ≤ {tr.n_tokens} keys), {side}: {t:.1f} s, "
                  f"{int(im.pivots.sum())} pivots, {im.fallbacks} HiGHS fallbacks, "
                  f"{load()}", flush=True)  # fmt: skip
    for what in ("row", "tail", "head"):
        diff = np.abs(out.pop(f"{what}_before_bounds") - out.pop(f"{what}_after_bounds")).max()
        out[f"{what}_agree"] = float(diff)
        out[f"{what}_speedup"] = out[f"{what}_before_s"] / out[f"{what}_after_s"]
        print(f"{what}: after/before {1 / out[f'{what}_speedup']:.3f}, "
              f"max |bound difference| {diff:.2e}", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
