"""Distributed reproduction: 2 ranks × 1 thread against 1 rank × 1 thread, same outputs.

Target (issue 10): on the quick budget (embedded MiniLM, Wikipedia sample), `torchrun
--nproc_per_node 2` with gloo finishes the stages at least 1.7× faster than one process,
and writes byte-identical tables, figures, summary and page.

Both runs are real subprocesses, launched as a user would, one after the other with the
same thread count per process (OMP_NUM_THREADS=1). Reported: wall-clock of each whole
run, and of its stage phase alone (from .cache/timings.json: `stages_s`, which excludes
loading the model and corpus and writing the report, the parts that do not shard).

    python benchmarks/bench_distributed.py [--budget quick] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUTPUTS = ("index.html", "summary.json", "figures", "tables")


def _outputs(out: Path) -> dict[str, bytes]:
    files = {}
    for name in OUTPUTS:
        root = out / name
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        files.update({str(p.relative_to(out)): p.read_bytes() for p in paths})
    return files


def _run(cmd: list[str], cwd: Path) -> float:
    env = os.environ | {
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="quick")
    parser.add_argument("--keep", type=Path, default=None, help="keep both runs in this folder")
    args = parser.parse_args()

    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-dist-"))
    work.mkdir(parents=True, exist_ok=True)
    common = ["reproduce", "--budget", args.budget, "--no-progress"]
    one = _run([sys.executable, "-m", "identifiable", *common, "--out", "one"], work)
    two = _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "identifiable",
            *common,
            "--out",
            "two",
        ],
        work,
    )
    t1 = json.loads((work / "one" / ".cache" / "timings.json").read_text())
    t2 = json.loads((work / "two" / ".cache" / "timings.json").read_text())
    a, b = _outputs(work / "one"), _outputs(work / "two")
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    print(f"budget {args.budget}, 1 thread per process")
    print(f"1 rank : whole run {one:7.1f} s, stages {t1['stages_s']:7.1f} s")
    print(f"2 ranks: whole run {two:7.1f} s, stages {t2['stages_s']:7.1f} s")
    print(
        f"speed-up: stages {t1['stages_s'] / t2['stages_s']:.2f}×, whole run {one / two:.2f}× "
        f"(target ≥ 1.7× on the stages)"
    )
    print(
        f"outputs identical: {not differ} ({len(a)} files compared)"
        + (f"; differ: {differ}" if differ else "")
    )
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    if differ:
        sys.exit(1)


if __name__ == "__main__":
    main()
