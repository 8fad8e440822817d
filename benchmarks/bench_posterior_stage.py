"""What the posterior stage adds to `identifiable reproduce`: every stage's wall seconds of
one run, side by side (DIR/.cache/timings.json), with the posterior section's verdicts.

    python benchmarks/bench_posterior_stage.py --budget quick [--model minilm]
        [--threads 2] [--out DIR] [--json out.json]

One process, `--threads` torch threads (the posterior stage runs its chains on one thread
whatever the setting); the 1-minute load average before and after is printed beside the
timings, since on a shared machine the absolute seconds are inflated: quote the stage's
share of the run.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="quick")
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from identifiable.runs.reproduce import reproduce

    out = args.out or Path(tempfile.mkdtemp()) / "report"
    load = os.getloadavg()[0]
    start = time.perf_counter()
    run = reproduce(args.model, "wikipedia-sample", out, budget=args.budget, progress=False,
                    force=True)  # fmt: skip
    wall = time.perf_counter() - start
    stages = {k.removesuffix("_s"): v for k, v in run.timings.items() if k.endswith("_s")}
    record = {
        "model": args.model, "budget": args.budget, "threads": args.threads,
        "load_before": load, "load_after": os.getloadavg()[0], "wall_s": wall,
        "seconds": stages,
        "posterior_share_of_stages": stages["posterior"] / stages["stages"],
        "claims": {k: v for k, v in run.summary["claims"].items() if k.startswith("posterior")},
        "headline": run.summary["headline"],
    }  # fmt: skip
    print(json.dumps(record, indent=1))
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n", "utf-8")


if __name__ == "__main__":
    main()
