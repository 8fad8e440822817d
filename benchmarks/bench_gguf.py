"""GGUF loading and the sink table, on the embedded decoder SmolLM2-135M-Instruct (Q4_1).

    .venv/bin/python benchmarks/bench_gguf.py [--repeats 2] [--threads 2 1] [--json FILE]

Each case runs in a fresh process with each of `--threads` torch/OpenMP thread counts,
interleaved with the others so that the machine's load hits all of them alike:

- first load: `load_model("smollm2")` with an empty cache (dequantize and write the cache);
- second load: the same call with the cache built (hash checks, then a safetensors load);
- transformers alone: `AutoModelForCausalLM.from_pretrained(folder, gguf_file=…)` and
  `AutoTokenizer.from_pretrained(folder, gguf_file=…)`, its own GGUF path (no cache), as
  the baseline of the first load;
- safetensors: `AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained`
  of the cache entry's folder, as any safetensors checkpoint loads, the baseline of the
  second load (both pay transformers' lazy imports of its modelling code, about 2 s);
- sink table: the trace of the first 512 tokens of the packaged Wikipedia sample and
  `sink_mass` of all 30 layers, after a second load; its table is printed.

Times are wall seconds of the call inside the process (the imports are timed apart), and
its CPU seconds (all threads): on a machine whose other processes take the cores, wall time
follows their load, and OpenMP threads that wait for a descheduled partner spin, so the
single-thread CPU time is the steadier figure. The goals of issue 56: first load ≤ 30 s,
second load ≤ 3 s, with 2 threads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
import torch
torch.set_num_threads(int(sys.argv[2]))
case = sys.argv[1]
t0 = time.perf_counter()
import transformers
from identifiable import load_model, sink_mass
from identifiable.experiments.sinks import corpus_prefix
from identifiable.models.gguf import decoder_model_path
out = {"import_s": time.perf_counter() - t0}
t0, c0 = time.perf_counter(), time.process_time()
if case == "transformers":
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging
    logging.set_verbosity_error()
    path = decoder_model_path()
    AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
elif case == "safetensors":
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from identifiable.store.usercache import user_cache_root
    (folder,) = [p for p in (user_cache_root() / "gguf").iterdir() if p.is_dir()]
    AutoModelForCausalLM.from_pretrained(str(folder))
    AutoTokenizer.from_pretrained(str(folder))
else:
    m = load_model("smollm2")
out["load_s"], out["load_cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
if case == "sink":
    t0 = time.perf_counter()
    tr = m.trace(corpus_prefix(m, 512))
    out["trace_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    sm = sink_mass(tr)
    out["sink_s"] = time.perf_counter() - t0
    out["table"] = sm.per_layer().to_dict("records")
    out["first_token"] = sm.first_token
print(json.dumps(out))
"""


def _child(case: str, threads: int, cache: Path) -> dict:
    env = {**os.environ, "IDENTIFIABLE_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, case, str(threads)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, nargs="+", default=[2])
    parser.add_argument("--json", type=Path, default=None, help="write the record here")
    parser.add_argument(
        "--cases",
        nargs="+",
        default=["first", "second", "safetensors", "transformers", "sink"],
        help="which cases to run (the first load always runs: it builds the cache)",
    )
    args = parser.parse_args()
    cases = ("first", *(c for c in args.cases if c != "first"))
    runs: dict[str, list[dict]] = {f"{c}/{t}": [] for t in args.threads for c in cases}
    with tempfile.TemporaryDirectory(prefix="bench-gguf-") as tmp:
        for r in range(args.repeats):
            for t in args.threads:
                fresh = Path(tmp) / f"cache-{r}-{t}"  # empty: the first load builds it
                for case in cases:
                    runs[f"{case}/{t}"].append(_child(case, t, fresh))
    load = os.getloadavg()[0]
    print(f"{args.repeats} repeats, threads {args.threads}, load average {load:.1f} at the end")
    summary = {}
    for name, rows in runs.items():
        med = statistics.median(x["load_s"] for x in rows)
        cpu = statistics.median(x["load_cpu_s"] for x in rows)
        summary[name] = {
            "load_s": [round(x["load_s"], 2) for x in rows],
            "median_s": med,
            "median_cpu_s": cpu,
        }
        print(
            f"{name:16} load {med:6.2f} s wall (runs {summary[name]['load_s']}), {cpu:6.2f} s "
            f"CPU; imports {statistics.median(x['import_s'] for x in rows):.1f} s"
        )
    for t in args.threads:
        for base, ours in (("transformers", "first"), ("safetensors", "second")):
            if base in cases and ours in cases:
                ratio = summary[f"{ours}/{t}"]["median_s"] / summary[f"{base}/{t}"]["median_s"]
                print(f"{t} threads: our {ours} load / {base} = {ratio:.2f}")
    if "sink" not in cases:
        _write(args, runs, summary, load)
        return
    for t in args.threads:
        sink = runs[f"sink/{t}"][-1]
        print(f"  n = 512 trace {sink['trace_s']:.2f} s, sink_mass {sink['sink_s']:.2f} s")
    print(f"first token {sink['first_token']!r}")
    print(f"{'layer':>5} {'raw':>7} {'effective':>9} {'null':>7} {'raw max':>7}")
    for row in sink["table"]:
        print(
            f"{row['layer']:5d} {row['raw']:7.4f} {row['effective']:+9.4f} "
            f"{row['null']:+7.4f} {row['raw_max']:7.4f}"
        )
    _write(args, runs, summary, load)


def _write(args: argparse.Namespace, runs: dict, summary: dict, load: float) -> None:
    if args.json is not None:
        record = {"threads": args.threads, "load_average": load, "runs": runs, "summary": summary}
        args.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
