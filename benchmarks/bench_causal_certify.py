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
  n − tail … n keys, one nested set: row order since this stop, key order before);
- head: `interval_map` on every row of the head at `--head-n` (default 256);
- agree: the largest |difference| between the two sides' bounds (both are certified
  optima of the same LPs, so it should be round-off, ≤ 1e-9).

- `--nested-key`: "before" is the working tree with nested causal rows in key order
  (`mapwork._NESTED_ORDER`), the layout main used before row order.

- workers (`--workers W`): the head again, after side, in W worker processes (one
  thread each; the before side cannot run in workers, which cannot import it).

`--threads 0` leaves torch's and numpy's thread counts as a user gets them (torch: one per
core), which is what exposed the two libraries' thread pools spinning against each other.
Since the engine runs on threads (default: torch's count), `--threads T` also gives the
after side T lock steps in T threads; a `--before` commit without threads runs one.

- `--repeats R`: each part R times, the sides alternating which goes first (this
  machine's speed drifts by up to 25 % within minutes): medians, and the ratio of each
  before/after pair.

Run: python benchmarks/bench_causal_certify.py [--n 512] [--tail 4] [--head-n 256]
     [--threads 1] [--parts row,tail,head] [--workers 1] [--repeats 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_causal import build, load, zipf_ids

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _GitAttention(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports `_oldattn.X` from src/identifiable/attention/X.py at a commit (imports of
    `identifiable.attention.*` rewritten to `_oldattn.*`; everything else is shared)."""

    def __init__(self, commit: str) -> None:
        self.commit = commit

    def _path(self, name: str) -> tuple[str, bool]:
        """(path in the repository, is a package) of module `name` at the commit."""
        tail = name.partition(".")[2].replace(".", "/")
        base = "src/identifiable/attention" + (f"/{tail}" if tail else "")
        package = subprocess.run(["git", "cat-file", "-e", f"{self.commit}:{base}/__init__.py"],
                                 cwd=_ROOT, capture_output=True, check=False).returncode == 0  # fmt: skip
        return (f"{base}/__init__.py" if package else f"{base}.py"), package

    def find_spec(self, name, path=None, target=None):
        if name == "_oldattn" or name.startswith("_oldattn."):
            return importlib.util.spec_from_loader(name, self, is_package=self._path(name)[1])
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        where, package = self._path(module.__name__)
        src = subprocess.run(
            ["git", "show", f"{self.commit}:{where}"],
            cwd=_ROOT, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        if package:
            module.__path__ = []
        src = src.replace("identifiable.attention.", "_oldattn.").replace(
            "from identifiable.attention import", "from _oldattn import"
        )
        # A real file: the compiled engine hashes its own source and numba caches by file
        # (keyed by its time stamp too: rewritten only when it differs, so that a second run
        # loads the engine compiled by the first)
        path = os.path.join(_old_dir(self.commit), where.replace("/", "_"))
        if not os.path.exists(path) or Path(path).read_text() != src:
            Path(path).write_text(src)
        module.__file__ = path
        exec(compile(src, path, "exec"), module.__dict__)


def _old_dir(commit: str) -> str:
    """A folder for the sources of `_oldattn` at `commit` (kept: numba's cache lives there)."""
    path = os.path.join(tempfile.gettempdir(), f"identifiable-bench-{commit}")
    os.makedirs(path, exist_ok=True)
    return path


class _NestedKey:
    """The working tree's attention package with nested causal rows in key order (chains
    of 16 rows, main before row order) instead of row order."""

    def __init__(self, pkg) -> None:
        self.pkg = pkg

    def _keyed(self, fn, *args, **kw):
        from identifiable.attention import mapwork

        kept, mapwork._NESTED_ORDER = mapwork._NESTED_ORDER, "key"
        try:
            return fn(*args, **kw)
        finally:
            mapwork._NESTED_ORDER = kept

    def interval_map(self, *args, **kw):
        return self._keyed(self.pkg.interval_map, *args, **kw)

    def attention_intervals(self, *args, **kw):
        return self._keyed(self.pkg.attention_intervals, *args, **kw)


def _alternate(sides: list, repeats: int, out: dict, what):
    """Yield (side, payload, [start time]) for `repeats` rounds of `sides`, the order
    reversed every other round so that neither side always runs first; the caller sets
    t[0] to the elapsed time. Records out[f"{what}_{side}_runs_s"] and the median in
    out[f"{what}_{side}_s"]. what = False: nothing to run."""
    if not what:
        return
    runs: dict = {name: [] for name, _ in sides}
    cpu: dict = {name: [] for name, _ in sides}
    for r in range(repeats):
        for name, payload in sides if r % 2 == 0 else sides[::-1]:
            t = [time.perf_counter()]
            c0 = time.process_time()
            yield name, payload, t
            cpu[name].append(time.process_time() - c0)
            runs[name].append(t[0])
    for name, times in runs.items():
        out[f"{what}_{name}_runs_s"] = times
        out[f"{what}_{name}_s"] = float(np.median(times))
        out[f"{what}_{name}_cpu_runs_s"] = cpu[name]
        out[f"{what}_{name}_cpu_s"] = float(np.median(cpu[name]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--tail", type=int, default=4)
    p.add_argument("--head-n", type=int, default=256)
    p.add_argument("--before", default="e48a7c3")
    p.add_argument("--threads", type=int, default=1, help="0: the libraries' defaults")
    p.add_argument("--parts", default="row,tail,head", help="comma-separated: row, tail, head")
    p.add_argument("--workers", type=int, default=1, help="head, after side: also this many")
    p.add_argument("--sides", default="before,after", help="comma-separated: before, after")
    p.add_argument(
        "--nested-key",
        action="store_true",
        help="before = the working tree with nested causal rows in key order",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="row, tail and head this many times, alternating which side goes first "
        "(before, after, after, before, ...): medians, and the ratio of each pair",
    )
    p.add_argument("--json", default=None)
    args = p.parse_args()
    parts = args.parts.split(",")
    if args.threads:
        torch.set_num_threads(args.threads)
    sys.meta_path.insert(0, _GitAttention(args.before))
    import _oldattn  # type: ignore[import-not-found]

    from identifiable import attention as new
    from identifiable.attention.lp import ensure_compiled

    # The compiled engine is built once per install (cached on disk): outside the timings.
    t0 = time.perf_counter()
    ensure_compiled()
    print(f"engine compiled or loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    _, model = build("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = model.trace(zipf_ids(args.n))
        short = model.trace(zipf_ids(args.head_n))
    out: dict = {"threads": args.threads or f"default ({torch.get_num_threads()})",
                 "before": args.before, "n": args.n}  # fmt: skip
    last = args.n - 1
    old = _NestedKey(new) if args.nested_key else _oldattn
    if not args.nested_key and "before" in args.sides:
        # A compiled engine at --before is compiled (or loaded) outside the timings too; a
        # commit without lockstep.py (the numpy engine) has nothing to compile.
        for name in ("_oldattn.lp", "_oldattn.lockstep"):
            with contextlib.suppress(subprocess.CalledProcessError, ImportError, AttributeError):
                importlib.import_module(name).ensure_compiled()
                break
    if args.nested_key:
        out["before"] = "working tree, nested rows in key order"
    sides_run = [(n, p) for n, p in (("before", old), ("after", new)) if n in args.sides]
    for side, pkg, t in _alternate(sides_run, args.repeats, out, "row" in parts and "row"):
        iv = pkg.attention_intervals(trace, 1, 0, last)
        t[0] = time.perf_counter() - t[0]
        out[f"row_{side}_lps"] = iv.lp_solved
        out[f"row_{side}_bounds"] = np.stack([iv.lower.numpy(), iv.upper.numpy()])
        print(f"row of {args.n} keys, {side}: {t[0]:.1f} s, {iv.lp_solved} LPs, {load()}",
              flush=True)  # fmt: skip
    rows = list(range(args.n - args.tail, args.n))
    heads = {"tail": (trace, rows), "head": (short, None)}
    for what, (tr, rws) in heads.items():
        if what not in parts:
            continue
        sides = [(n, p, 1) for n, p in sides_run]
        if what == "head" and args.workers > 1:  # worker processes cannot import _oldattn
            sides.append(("workers", new, args.workers))
        for side, (pkg, w), t in _alternate([(n, (p, w)) for n, p, w in sides], args.repeats,
                                            out, what):  # fmt: skip
            kw = {"workers": w} if w > 1 else {}
            im = pkg.interval_map(tr, layers=[1], heads=[0], rows=rws, progress=False, **kw)
            t[0] = time.perf_counter() - t[0]
            out[f"{what}_{side}_pivots"] = int(im.pivots.sum())
            out[f"{what}_{side}_fallbacks"] = im.fallbacks
            out[f"{what}_{side}_bounds"] = np.stack([im.lower.numpy(), im.upper.numpy()])
            print(f"{what} ({len(im.rows)} rows of ≤ {tr.n_tokens} keys), {side}"
                  f"{f' ({w} processes)' if w > 1 else ''}: {t[0]:.1f} s, {int(im.pivots.sum())} "
                  f"pivots, {im.fallbacks} HiGHS fallbacks, {load()}", flush=True)  # fmt: skip
    for what in ("row", "tail", "head"):
        if what not in parts or f"{what}_after_bounds" not in out:
            continue
        after = out.pop(f"{what}_after_bounds")
        for other in ("before", "workers"):
            if f"{what}_{other}_bounds" not in out:
                continue
            diff = np.abs(out.pop(f"{what}_{other}_bounds") - after).max()
            out[f"{what}_{other}_agree"] = float(diff)
            ratio = out[f"{what}_after_s"] / out[f"{what}_{other}_s"]
            if other == "before":
                pairs = [a / b for a, b in zip(out[f"{what}_after_runs_s"],
                                               out[f"{what}_before_runs_s"], strict=True)]  # fmt: skip
                out[f"{what}_pair_ratios"] = pairs
                cpu = [a / b for a, b in zip(out[f"{what}_after_cpu_runs_s"],
                                             out[f"{what}_before_cpu_runs_s"], strict=True)]  # fmt: skip
                out[f"{what}_cpu_pair_ratios"] = cpu
                out[f"{what}_cpu_ratio"] = out[f"{what}_after_cpu_s"] / out[f"{what}_before_cpu_s"]
                print(
                    f"{what}: after/before {ratio:.3f} (medians; pairs "
                    f"{min(pairs):.3f}-{max(pairs):.3f}), CPU time {out[f'{what}_cpu_ratio']:.3f} "
                    f"(pairs {min(cpu):.3f}-{max(cpu):.3f}), max |bound difference| {diff:.2e}"
                )
            else:
                print(
                    f"{what}: 1 process / {args.workers} processes {ratio:.3f}, "
                    f"max |bound difference| {diff:.2e}"
                )
            out[f"{what}_{other}_ratio"] = ratio
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
