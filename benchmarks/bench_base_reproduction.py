"""The paper's experiment at the paper's size: `reproduce --budget quick` and `tokens --quick`
on a BERT-base-sized encoder and on the embedded model, before (a commit) and after (this tree).

Target (issue 55, with issue 50's item 6), 2 threads on a quiet 2-core machine:
- `reproduce --budget quick`: ≤ 6 min on a BERT-base-sized encoder (random weights,
  `BertConfig()` defaults: hidden 768, 12 layers, 12 heads), ≤ 3 min on the embedded model;
  the Fig. 2 stage ≤ 2 min of it on the base-sized model, using both cores (CPU use ≥ 180 %);
- `tokens --quick` on the embedded model ≤ 2 min;
- the same token and sequence counts as before (statistical power kept).

Every run is a fresh process (`OMP_NUM_THREADS=--threads`) with the side's source on its
PYTHONPATH: "before" is `git archive --before` unpacked in a temporary folder, "after" is
this tree's src/. The two sides alternate which goes first, model by model. Each reproduction
prints per stage its wall seconds and its CPU seconds (user + sys of the whole process
between the stage's first shard starting and its last shard ending, so threads count), and
the Fig. 2 rates; each `tokens --quick` its wall and CPU seconds. The 1-minute load average
is sampled every 2 s during each run and its mean printed beside it: on a shared machine the
absolute times are inflated, and CPU seconds count a spinning OpenMP thread too.

    python benchmarks/bench_base_reproduction.py [--before 7fd0293] [--threads 2]
        [--models minilm,bert-base] [--parts reproduce,tokens] [--sides before,after]
        [--model-dir DIR] [--json out.json] [--merge earlier.json]
        [--parts fig2 --layers N --pairs-cache DIR]  (the Fig. 2 stage alone)
        [--parts none --merge a.json b.json]  (print the tables of earlier runs)

`--merge` adds the runs of an earlier `--json` (e.g. the before side, run first) to the
table, for a machine where one invocation cannot run both sides in the time at hand.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, sys, time
from identifiable.experiments import stages as st
import identifiable.runs.reproduce as rr

spans = {}

def wrap(stage):
    compute = stage.compute

    def timed(shard, i, adv):
        w, c = time.perf_counter(), time.process_time()
        span = spans.setdefault(stage.name, [w, c, w, c])
        span[0], span[1] = min(span[0], w), min(span[1], c)
        out = compute(shard, i, adv)
        w, c = time.perf_counter(), time.process_time()
        span[2], span[3] = max(span[2], w), max(span[3], c)
        return out

    stage.compute = timed
    return stage

original = rr.stages
rr.stages = lambda *a, **k: [wrap(s) for s in original(*a, **k)]
w0, c0 = time.perf_counter(), time.process_time()
result = rr.reproduce(sys.argv[1], "wikipedia-sample", sys.argv[2], budget=sys.argv[3], progress=False)
stages = {k: {"wall_s": v[2] - v[0], "cpu_s": v[3] - v[1]} for k, v in spans.items()}
print("BENCH " + json.dumps({
    "stages": stages, "total_wall_s": time.perf_counter() - w0,
    "total_cpu_s": time.process_time() - c0, "timings": result.timings,
}))
"""


# The Fig. 2 stage alone (its first --layers shards), on hidden states already in the token
# cache --pairs-cache (the extraction is the same forward passes before and after).
_CHILD_FIG2 = r"""
import json, shutil, sys, time
from pathlib import Path
from identifiable.experiments.pipeline import corpus_items, progress_bars, run_stages
from identifiable.experiments.stages import resolve_budget, stages
from identifiable.models import load_model
from identifiable.store.cache import RunCache
model, out, budget, layers, pairs_cache = sys.argv[1:6]
m = load_model(model)
plan = resolve_budget(budget)
items, _ = corpus_items("wikipedia-sample", m, plan, 0)
out = Path(out)
cache_dir = out / ".cache"
shutil.copytree(pairs_cache, cache_dir / "token-pairs")
stage = next(s for s in stages(m, items, plan, 0, cache_dir) if s.name == "tokens")
stage.shards, stage.weights = stage.shards[: int(layers)], stage.weights[: int(layers)]
cache = RunCache(out, {"bench": model})
cache.start()
w0, c0 = time.perf_counter(), time.process_time()
with progress_bars(False) as bars:
    done = run_stages(cache, [stage], bars)
wall, cpu = time.perf_counter() - w0, time.process_time() - c0
per_layer = done["tokens"][0]["per_layer"]
cols = ["layer", "probe", "objective", "rate", "n_tokens", "steps", "stopped"]
cols = [c for c in cols if c in per_layer]
print("BENCH " + json.dumps({"stages": {"tokens": {"wall_s": wall, "cpu_s": cpu}},
      "fig2": per_layer[cols].to_dict("records"), "split": {}}))
"""


def build_base(folder: Path) -> Path:
    """A random-weight BERT-base (`BertConfig()` defaults, seed 0) with the embedded model's
    tokenizer, saved as a user's model folder."""
    if (folder / "config.json").exists():
        return folder
    import torch
    from transformers import BertConfig, BertModel

    from identifiable.models import load_model

    torch.manual_seed(0)
    BertModel(BertConfig()).save_pretrained(folder)
    load_model("minilm").tokenizer.save_pretrained(folder)
    return folder


def source_of(side: str, before: str, tmp: Path) -> Path:
    """The src/ folder a side runs: this tree's, or `before`'s unpacked by git archive."""
    if side == "after":
        return ROOT / "src"
    dest = tmp / f"before-{before}"
    if not dest.exists():
        dest.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "archive", before, "src"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "src"


class LoadSampler:
    """The mean 1-minute load average over a run, sampled every 2 s."""

    def __init__(self) -> None:
        self.samples: list[float] = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(2.0):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float:
        return sum(self.samples) / len(self.samples)


def run_child(cmd: list[str], src: Path, threads: int) -> tuple[str, float, float, float]:
    """(stdout, wall s, CPU s of the child, mean load) of one command."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": str(threads)}
    env["HF_HUB_OFFLINE"] = "1"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with LoadSampler() as load:
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout + proc.stderr, wall, cpu, load.mean


def fig2_rates(out: Path) -> list[dict]:
    import pandas as pd

    table = pd.read_csv(out / "tables" / "fig2a_identifiability.csv")
    cols = ["layer", "probe", "objective", "rate", "n_tokens"]
    return table[cols].to_dict("records")


def fig2_split(out: Path) -> dict:
    import pandas as pd

    return pd.read_csv(out / "tables" / "fig2_split.csv").iloc[0].to_dict()


def measure(part: str, side: str, model: str, src: Path, args, tmp: Path) -> dict:
    python = sys.executable
    out = tmp / f"{part}-{side}-{Path(model).name}"
    if part == "reproduce":
        text, wall, cpu, load = run_child(
            [python, "-c", _CHILD, model, str(out), args.budget], src, args.threads
        )
        bench = json.loads(next(x for x in text.splitlines() if x.startswith("BENCH "))[6:])
        return {
            **bench, "wall_s": wall, "cpu_s": cpu, "load": load,
            "fig2": fig2_rates(out), "split": fig2_split(out),
        }  # fmt: skip
    if part == "fig2":
        cmd = [python, "-c", _CHILD_FIG2, model, str(out), args.budget, str(args.layers)]
        text, wall, cpu, load = run_child([*cmd, str(args.pairs_cache[model])], src, args.threads)
        bench = json.loads(next(x for x in text.splitlines() if x.startswith("BENCH "))[6:])
        return {**bench, "wall_s": wall, "cpu_s": cpu, "load": load}
    cmd = [python, "-m", "identifiable", "tokens", "--quick", "-m", model, "-o", str(out)]
    text, wall, cpu, load = run_child(cmd, src, args.threads)
    estimate = next((x for x in text.splitlines() if "about" in x and "thread" in x), "")
    return {"wall_s": wall, "cpu_s": cpu, "load": load, "estimate": estimate.strip()}


def print_tables(runs: list[dict]) -> None:
    by = {(r["part"], r["model"], r["side"]): r for r in runs}
    models = list(dict.fromkeys(r["model"] for r in runs))
    print("\n## reproduce --budget quick: wall s / CPU s per stage (CPU use)\n")
    print("| model | stage | before wall | before CPU | after wall | after CPU | after CPU use |")
    print("|---|---|---|---|---|---|---|")
    for model in models:
        b, a = by.get(("reproduce", model, "before")), by.get(("reproduce", model, "after"))
        names = list(dict.fromkeys([*(b or {}).get("stages", {}), *(a or {}).get("stages", {})]))
        for name in [*names, "total"]:
            cells = []
            for r in (b, a):
                s = (
                    {"wall_s": r["wall_s"], "cpu_s": r["cpu_s"]}
                    if r and name == "total"
                    else (r or {}).get("stages", {}).get(name)
                )
                cells += [f"{s['wall_s']:.0f}", f"{s['cpu_s']:.0f}"] if s else ["–", "–"]
            s = (a or {}).get("stages", {}).get(name) if name != "total" else a
            use = f"{100 * s['cpu_s'] / s['wall_s']:.0f} %" if s else "–"
            print(f"| {model} | {name} | {' | '.join(cells)} | {use} |")
        for side, r in (("before", b), ("after", a)):
            if r:
                print(f"| {model} | (mean load, {side}) | {r['load']:.1f} | | | | |")
    print("\n## Fig. 2a rates (test tokens), before → after\n")
    print("| model | layer | probe | objective | before | after | test tokens before / after |")
    print("|---|---|---|---|---|---|---|")
    for model in models:
        b, a = by.get(("reproduce", model, "before")), by.get(("reproduce", model, "after"))
        rows = {}
        for side, r in (("before", b), ("after", a)):
            for row in (r or {}).get("fig2", []):
                key = (row["layer"], row["probe"], row["objective"])
                rows.setdefault(key, {})[side] = row
        for (layer, probe, obj), sides in sorted(rows.items()):
            rate = [f"{sides[s]['rate']:.3f}" if s in sides else "–" for s in ("before", "after")]
            n = [str(sides[s]["n_tokens"]) if s in sides else "–" for s in ("before", "after")]
            print(
                f"| {model} | {layer} | {probe} | {obj} | {rate[0]} | {rate[1]} | {' / '.join(n)} |"
            )
    print("\n## the Fig. 2 stage alone (--parts fig2): wall s / CPU s (CPU use, mean load)\n")
    print("| model | before | after | after CPU use |")
    print("|---|---|---|---|")
    for model in models:
        cells, use = [], "–"
        for side in ("before", "after"):
            r = by.get(("fig2", model, side))
            cells.append(f"{r['wall_s']:.0f} / {r['cpu_s']:.0f} ({r['load']:.1f})" if r else "–")
            if r and side == "after":
                use = f"{100 * r['cpu_s'] / r['wall_s']:.0f} %"
        print(f"| {model} | {cells[0]} | {cells[1]} | {use} |")
    print("\n## tokens --quick: wall s / CPU s (mean load)\n")
    print("| model | before | after | after's printed estimate |")
    print("|---|---|---|---|")
    for model in models:
        cells = []
        for side in ("before", "after"):
            r = by.get(("tokens", model, side))
            cells.append(f"{r['wall_s']:.0f} / {r['cpu_s']:.0f} ({r['load']:.1f})" if r else "–")
        est = (by.get(("tokens", model, "after")) or {}).get("estimate", "")
        print(f"| {model} | {cells[0]} | {cells[1]} | {est} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="7fd0293", help="the commit of the before side")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--budget", default="quick", help="reproduce's budget (smoke: a check)")
    parser.add_argument("--models", default="minilm,bert-base")
    parser.add_argument("--parts", default="reproduce,tokens", help="and fig2: the stage alone")
    parser.add_argument("--layers", type=int, default=99, help="fig2: the first N layers")
    parser.add_argument("--sides", default="before,after")
    parser.add_argument("--model-dir", type=Path, default=None, help="keep the base model here")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--merge", type=Path, nargs="*", default=[])
    parser.add_argument(
        "--pairs-cache", type=Path, default=None,
        help="fig2: a token cache holding both models' quick-budget hidden states",
    )  # fmt: skip
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    runs: list[dict] = []
    for path in args.merge:
        runs += json.loads(path.read_text())["runs"]
    with tempfile.TemporaryDirectory(prefix="bench-base-") as name:
        tmp = Path(name)
        wanted = args.parts.split(",") != [] and "bert-base" in args.models.split(",")
        base = build_base(args.model_dir or tmp / "bert-base-random") if wanted else tmp
        models = {"minilm": "minilm", "bert-base": str(base)}
        args.pairs_cache = dict.fromkeys(models.values(), args.pairs_cache)
        sides = args.sides.split(",")
        parts = [p for p in args.parts.split(",") if p in ("reproduce", "tokens", "fig2")]
        for k, label in enumerate(args.models.split(",")):
            for part in parts:
                for side in sides if k % 2 == 0 else sides[::-1]:
                    src = source_of(side, args.before, tmp)
                    r = measure(part, side, models[label], src, args, tmp)
                    r |= {"part": part, "side": side, "model": label, "threads": args.threads}
                    runs.append(r)
                    print(
                        f"{part} {label} {side}: wall {r['wall_s']:.0f} s, CPU {r['cpu_s']:.0f} s, "
                        f"mean load {r['load']:.1f}",
                        flush=True,
                    )
                    if args.json:
                        args.json.write_text(json.dumps({"runs": runs}, indent=1, default=str))
    print_tables(runs)


if __name__ == "__main__":
    main()
